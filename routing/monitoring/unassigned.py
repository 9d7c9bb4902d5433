"""Unassigned leads are tried again on a schedule (a rep back from out-of-office takes them)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from leads.models import Lead, LeadStatus
from routing.services import LeadActionError, lead_reroute

logger = logging.getLogger(__name__)

__all__ = ["unassigned_retry"]


def unassigned_retry(*, now: datetime | None = None, batch_size: int | None = None) -> int:
    """Send up to ``batch_size`` unassigned leads through routing again; returns how many.

    Oldest first, and only leads whose last routing was at least ``UNASSIGNED_RETRY_SECONDS``
    ago, so a lead that routing still cannot place waits one period between tries instead of
    being retried in a loop. Each goes through ``lead_reroute`` (a ``reroute_requested``
    event, then the normal pipeline on a worker).
    """
    now = now or timezone.now()
    batch_size = batch_size or settings.UNASSIGNED_RETRY_BATCH_SIZE
    cutoff = now - timedelta(seconds=settings.UNASSIGNED_RETRY_SECONDS)
    ids = list(
        Lead.objects.filter(status=LeadStatus.UNASSIGNED)
        .filter(Q(processed_at__isnull=True) | Q(processed_at__lte=cutoff))
        .order_by("received_at")
        .values_list("id", flat=True)[:batch_size]
    )
    sent = 0
    for lead_id in ids:
        try:
            lead_reroute(lead_id=lead_id, actor="system")
        except LeadActionError:  # routed by someone else meanwhile
            continue
        sent += 1
    if sent:
        logger.info("sent %d unassigned lead(s) through routing again", sent)
    return sent
