"""Write services of the routing app, including the worker pipeline."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from leads.models import Lead, LeadStatus
from leads.services import lead_apply_normalization
from routing.decisions import route_lead
from routing.models import QueueHeartbeat

logger = logging.getLogger(__name__)


@transaction.atomic
def heartbeat_record(*, queue: str, worker: str) -> QueueHeartbeat:
    """Record that ``worker`` just executed a heartbeat taken from ``queue``."""
    heartbeat, _ = QueueHeartbeat.objects.update_or_create(
        queue=queue, defaults={"last_seen_at": timezone.now(), "worker": worker[:255]}
    )
    return heartbeat


def lead_process(*, lead_id: uuid.UUID | str) -> str | None:
    """Run the pipeline for one lead; a no-op unless this call wins the lead's lease.

    The claim is one UPDATE: ``received`` (or ``processing`` whose lease expired: a worker died
    mid-way) becomes ``processing`` with a lease until ``claimed_until`` and one more attempt.
    Only one of several concurrent deliveries of a message can win it; the others return at
    once without counting an attempt. The winner re-checks its lease under a row lock before
    writing the outcome, so an execution that outlived its lease writes nothing. A lead that
    keeps crashing its worker is quarantined as ``failed`` after ``LEAD_MAX_ATTEMPTS`` claims.

    Normalises the lead, then routes it with the live ruleset (``route_lead``): ``assigned``,
    ``excluded``, or ``unassigned`` when no rule yields (or no ruleset is published yet).
    """
    try:
        lead_uuid = uuid.UUID(str(lead_id))
    except ValueError:
        logger.error("process_lead: %r is not a lead id", lead_id)
        return None
    now = timezone.now()
    lease = now + timedelta(seconds=settings.LEAD_LEASE_SECONDS)
    claimable = Q(status=LeadStatus.RECEIVED) | Q(
        status=LeadStatus.PROCESSING, claimed_until__lt=now
    )
    claimed = Lead.objects.filter(claimable, id=lead_uuid).update(
        status=LeadStatus.PROCESSING, claimed_until=lease, attempts=F("attempts") + 1
    )
    if not claimed:
        logger.info("process_lead: lead %s is not waiting or is leased; nothing to do", lead_uuid)
        return None
    try:
        return _lead_process_claimed(lead_uuid, lease)
    except Exception as exc:
        # Keep the error on the lead and hand it back to the sweeper (status `received`); the
        # attempt bound quarantines it. A crash (no exception) leaves the lease to expire.
        logger.exception("processing lead %s failed", lead_uuid)
        Lead.objects.filter(id=lead_uuid, status=LeadStatus.PROCESSING, claimed_until=lease).update(
            status=LeadStatus.RECEIVED,
            claimed_until=None,
            last_error=f"{type(exc).__name__}: {exc}"[:2000],
        )
        raise


def _lead_process_claimed(lead_uuid: uuid.UUID, lease: datetime) -> str | None:
    with transaction.atomic(durable=True):
        lead = (
            Lead.objects.select_for_update()
            .select_related("source")
            .filter(id=lead_uuid, status=LeadStatus.PROCESSING, claimed_until=lease)
            .first()
        )
        if lead is None:
            logger.warning("process_lead: lease on lead %s lost; writing nothing", lead_uuid)
            return None
        now = timezone.now()
        lead.claimed_until = None
        if lead.attempts > settings.LEAD_MAX_ATTEMPTS:
            lead.status = LeadStatus.FAILED
            cause = (
                f"last error: {lead.last_error}"
                if lead.last_error
                else "none finished (worker crash or time limit)"
            )
            lead.last_error = f"gave up after {lead.attempts - 1} attempts; {cause}"[:2000]
            lead.processed_at = now
            lead.save(update_fields=["status", "last_error", "processed_at", "claimed_until"])
            logger.error("lead %s quarantined as failed: %s", lead.id, lead.last_error)
            return lead.status
        lead_apply_normalization(lead=lead)
        lead.save()
        # Still under the lead's row lock and lease: route_lead takes the team's, then the
        # rep's lock, writes the assignment and the final status in this same transaction.
        return route_lead(lead=lead, now=now).status
