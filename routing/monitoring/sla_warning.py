"""SLA warnings: each untouched assignment's rep is told once that its SLA is about to run out.

``sla_warn`` (beat, with ``check_sla``) takes the current, untouched, not yet breached
assignments due within ``SLA_WARNING_MINUTES``; for each one whose warning time has come
(``warning_due``) it stores an ``SlaWarning`` (one-to-one with the assignment: a second beat
running at the same moment cannot warn twice) and schedules the rep's ``lead.sla_warning``
notices through the delivery outbox, in one transaction.

The warning follows the clock the SLA check breaches by: in a team that respects working hours,
time off planned after the lead was assigned (leave, a holiday calendar's day) pauses the clock,
so each candidate's due time is worked out again first (``sla_clocks_refresh``) and a clock that
moved is warned about before its new due time, not the old one.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from routing.decisions import sla_clocks_refresh
from routing.delivery.models import DeliveryEvent
from routing.delivery.services import deliveries_schedule
from routing.models import Assignment
from routing.monitoring.models import SlaWarning

logger = logging.getLogger(__name__)

__all__ = ["sla_warn", "warning_due"]


def warning_due(
    *, assigned_at: datetime, sla_due_at: datetime, now: datetime, lead_minutes: float
) -> bool:
    """Whether a rep should be warned now: the deadline is within ``lead_minutes``, or half of
    the SLA is left if that is shorter (a 5-minute SLA warns at 2.5), and it has not passed."""
    if lead_minutes <= 0 or now >= sla_due_at:
        return False
    half = (sla_due_at - assigned_at) / 2
    window = min(timedelta(minutes=lead_minutes), max(half, timedelta(0)))
    return sla_due_at - now <= window


def sla_warn(*, now: datetime | None = None, batch_size: int = 500, max_batches: int = 10) -> int:
    """Warn the reps whose leads' SLAs are about to run out; returns how many were warned."""
    lead_minutes = settings.SLA_WARNING_MINUTES
    if lead_minutes <= 0:
        return 0
    now = now or timezone.now()
    horizon = now + timedelta(minutes=lead_minutes)
    warned = 0
    seen_up_to: tuple[datetime, int] | None = None
    for _ in range(max_batches):
        candidates = Assignment.objects.filter(
            active=True,
            touched_at__isnull=True,
            sla_breached_at__isnull=True,
            sla_due_at__gt=now,
            sla_due_at__lte=horizon,
            sla_warning__isnull=True,
        ).order_by("sla_due_at", "id")
        if seen_up_to is not None:
            due, last_id = seen_up_to
            candidates = candidates.filter(sla_due_at__gte=due).exclude(
                sla_due_at=due, id__lte=last_id
            )
        rows: list[tuple[int, datetime, datetime, int]] = list(
            candidates.values_list("id", "assigned_at", "sla_due_at", "rep_id")[:batch_size]  # type: ignore[arg-type]
        )
        refreshed: dict[int, datetime] = {}
        if rows and sla_clocks_refresh(
            rep_ids={row[3] for row in rows}, assignment_ids=[row[0] for row in rows], now=now
        ):
            refreshed = dict(
                Assignment.objects.filter(pk__in=[row[0] for row in rows]).values_list(
                    "id", "sla_due_at"
                )  # type: ignore[arg-type]
            )
        for assignment_id, assigned_at, stored_due, _rep_id in rows:
            sla_due_at = refreshed.get(assignment_id) or stored_due
            if warning_due(
                assigned_at=assigned_at, sla_due_at=sla_due_at, now=now, lead_minutes=lead_minutes
            ):
                warned += _warn_one(assignment_id, sla_due_at, now)
        if len(rows) < batch_size:
            break
        seen_up_to = (rows[-1][2], rows[-1][0])
    if warned:
        logger.info("sla warnings: %d rep(s) warned", warned)
    return warned


def _warn_one(assignment_id: int, sla_due_at: datetime, now: datetime) -> int:
    try:
        with transaction.atomic():
            assignment = (
                Assignment.objects.select_related("lead__source", "rep", "team")
                .filter(pk=assignment_id, active=True, touched_at__isnull=True)
                .first()
            )
            if assignment is None:
                return 0
            SlaWarning.objects.create(assignment=assignment, warned_at=now, sla_due_at=sla_due_at)
            deliveries_schedule(assignment=assignment, event=DeliveryEvent.SLA_WARNING.value)
    except IntegrityError:  # another beat warned it a moment ago
        return 0
    return 1
