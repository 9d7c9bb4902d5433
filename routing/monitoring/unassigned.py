"""Unassigned leads are tried again on a schedule (a rep back from out-of-office takes them)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from leads.models import Lead, LeadStatus
from routing.services import LeadActionError, lead_retry_unassigned

logger = logging.getLogger(__name__)

__all__ = ["unassigned_retry"]


def unassigned_retry(*, now: datetime | None = None, batch_size: int | None = None) -> int:
    """Send up to ``batch_size`` unassigned leads that are due through routing again.

    A lead is due at its ``unassigned_retry_at``, which the pipeline sets when it leaves the
    lead unassigned: ``UNASSIGNED_RETRY_SECONDS`` after it became unassigned, then doubling
    after each retry up to ``UNASSIGNED_RETRY_MAX_SECONDS``. A lead left unassigned by an
    older version (no retry time) is due ``UNASSIGNED_RETRY_SECONDS`` after its last routing.
    Oldest first. Each goes through ``lead_retry_unassigned``: counted on the lead, no event;
    the pipeline writes one only when the outcome changes.
    """
    now = now or timezone.now()
    batch_size = batch_size or settings.UNASSIGNED_RETRY_BATCH_SIZE
    cutoff = now - timedelta(seconds=settings.UNASSIGNED_RETRY_SECONDS)
    due = Q(unassigned_retry_at__lte=now) | Q(
        Q(processed_at__isnull=True) | Q(processed_at__lte=cutoff), unassigned_retry_at=None
    )
    ids = list(
        Lead.objects.filter(status=LeadStatus.UNASSIGNED)  # lead_status_idx
        .filter(due)
        # A lead whose person was erased, or whose personal data retention pruned, has
        # nothing left to route on: it stays unassigned.
        .filter(personal_pruned_at__isnull=True, erased_at__isnull=True)
        .order_by("received_at")
        .values_list("id", flat=True)[:batch_size]
    )
    sent = 0
    for lead_id in ids:
        try:
            lead_retry_unassigned(lead_id=lead_id, now=now)
        except LeadActionError:  # routed by someone else meanwhile
            continue
        sent += 1
    if sent:
        logger.info("sent %d unassigned lead(s) through routing again", sent)
    return sent
