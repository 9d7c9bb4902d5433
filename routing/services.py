"""Write services of the routing app, including the worker pipeline."""

from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from leads.models import Lead, LeadStatus
from leads.services import lead_apply_normalization
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
    """Run the pipeline for one lead; a no-op unless the lead is still waiting.

    The attempt is counted in its own transaction first, so a lead that crashes its worker
    every time is quarantined as ``failed`` after ``LEAD_MAX_ATTEMPTS`` deliveries instead of
    looping. The processing itself is one transaction: a crash leaves the lead ``received`` and
    its message is redelivered (late acks) or swept.

    Routing rules arrive with the routing core; until a ruleset is published no rule can yield
    an owner, so a processed lead is ``unassigned`` (rules-format.md: "When no rule yields").
    """
    try:
        lead_uuid = uuid.UUID(str(lead_id))
    except ValueError:
        logger.error("process_lead: %r is not a lead id", lead_id)
        return None
    counted = Lead.objects.filter(id=lead_uuid, status=LeadStatus.RECEIVED).update(
        attempts=F("attempts") + 1
    )
    if not counted:
        logger.info("process_lead: lead %s is not waiting; nothing to do", lead_uuid)
        return None
    try:
        return _lead_process_claimed(lead_uuid)
    except Exception as exc:
        # Keep the error on the lead; it stays `received`, so the sweeper retries it and the
        # attempt bound quarantines it. A crash (no exception) leaves last_error unchanged.
        logger.exception("processing lead %s failed", lead_uuid)
        Lead.objects.filter(id=lead_uuid, status=LeadStatus.RECEIVED).update(
            last_error=f"{type(exc).__name__}: {exc}"[:2000]
        )
        raise


def _lead_process_claimed(lead_uuid: uuid.UUID) -> str | None:
    with transaction.atomic(durable=True):
        lead = (
            Lead.objects.select_for_update()
            .select_related("source")
            .filter(id=lead_uuid, status=LeadStatus.RECEIVED)
            .first()
        )
        if lead is None:
            return None
        now = timezone.now()
        if lead.attempts > settings.LEAD_MAX_ATTEMPTS:
            lead.status = LeadStatus.FAILED
            cause = (
                f"last error: {lead.last_error}"
                if lead.last_error
                else "none finished (worker crash or time limit)"
            )
            lead.last_error = f"gave up after {lead.attempts - 1} attempts; {cause}"[:2000]
            lead.processed_at = now
            lead.save(update_fields=["status", "last_error", "processed_at"])
            logger.error("lead %s quarantined as failed: %s", lead.id, lead.last_error)
            return lead.status
        lead_apply_normalization(lead=lead)
        lead.status = LeadStatus.UNASSIGNED
        lead.processed_at = now
        lead.save()
        return lead.status
