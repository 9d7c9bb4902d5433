"""The counters /metrics serves, kept incrementally instead of counted over whole tables.

Every counter /metrics shows (leads received by source, outcomes, SLA breaches, delivery
failures, reassignments, the time-to-assign histogram) counts rows that never change once
committed: audit events, first assignments, leads by their source. So a stored total up to a
high-water mark plus the rows past the mark is the same number as a count over the whole table,
and a scrape only reads the rows past the mark (a range scan of the primary key, or of the
``received_at`` index for leads, whose ids are UUIDs).

The mark may only move past rows that are committed: ids and ``received_at`` are taken when a
row is inserted, and a transaction still open may commit a smaller one later. So each refresh
notes the current maximum ids and the time (an *observation*), and the mark moves to an
observation at least ``METRICS_SETTLE_SECONDS`` old: every transaction that started before it
has finished by then (workers' transactions are bounded by the task time limit and the database
timeouts, far below the default of 300 s). Totals only ever grow, so counters never go down.

The guarantee, precisely: a row is counted exactly once if its transaction commits within
``METRICS_SETTLE_SECONDS`` of the moment its id (or ``received_at``) was taken — however the
commits of concurrent transactions interleave (a row with a smaller id committed after one
with a larger id is read live at scrape until the mark passes it, and the mark passes only an
observation that old). A transaction open longer than that may commit a row under a mark that
already moved past it: that row is never counted. Hence the system check that
``METRICS_SETTLE_SECONDS`` exceed the worker task time limit and the web request timeout.

The state is one ``MetricsState`` row, refreshed under its row lock by ``check_backlog`` (every
``BACKLOG_CHECK_INTERVAL_SECONDS``) and by a scrape that finds it older than
``METRICS_REFRESH_SECONDS``. The same refresh recounts the leads per status (a gauge that can go
down) every ``METRICS_STATUS_REFRESH_SECONDS``; the small statuses are counted live at scrape.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    OuterRef,
    Q,
    Subquery,
    Sum,
)
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from audit.models import Event, EventType
from leads.models import Lead, LeadStatus
from routing.models import FIRST_ASSIGNMENT_KINDS, Assignment
from routing.monitoring.models import MetricsState

logger = logging.getLogger(__name__)

__all__ = ["TIME_TO_ASSIGN_BUCKETS", "Counters", "counters_current", "counters_refresh"]

KEY = "counters"
# Seconds from receipt to first owner: the kickoff-to-assignment path is seconds when healthy,
# minutes under a backlog or while enrichment waits.
TIME_TO_ASSIGN_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# Statuses few leads are in at any time: counted live at scrape (partial or status indexes).
LIVE_STATUSES = (
    LeadStatus.RECEIVED,
    LeadStatus.PROCESSING,
    LeadStatus.UNASSIGNED,
    LeadStatus.FAILED,
)

_OUTCOME_EVENTS = (
    EventType.ASSIGNED,
    EventType.EXCLUDED,
    EventType.UNASSIGNED,
    EventType.FAILED,
)
# The processing outcome each event records, by the status api.md names. A sticky duplicate's
# `assigned` event says kind "duplicate".
_OUTCOME_CONDITIONS = {
    LeadStatus.ASSIGNED: Q(type=EventType.ASSIGNED) & ~Q(data__kind="duplicate"),
    LeadStatus.DUPLICATE: Q(type=EventType.ASSIGNED, data__kind="duplicate"),
    LeadStatus.EXCLUDED: Q(type=EventType.EXCLUDED),
    LeadStatus.UNASSIGNED: Q(type=EventType.UNASSIGNED),
    LeadStatus.FAILED: Q(type=EventType.FAILED),
}
_EVENT_COUNTERS = {
    "sla_breaches": Q(type=EventType.SLA_BREACHED),
    "delivery_failures": Q(type=EventType.DELIVERY_FAILED),
    "reassignments": Q(type=EventType.REASSIGNED),
}
_COUNTED_EVENTS = (
    *_OUTCOME_EVENTS,
    EventType.SLA_BREACHED,
    EventType.DELIVERY_FAILED,
    EventType.REASSIGNED,
)


@dataclass
class Counters:
    """Totals of rows that never change once committed (sums of ranges add up)."""

    received_by_source: dict[str, int] = field(default_factory=dict)  # source id -> n
    processed_by_status: dict[str, int] = field(default_factory=dict)
    sla_breaches: int = 0
    delivery_failures: int = 0
    reassignments: int = 0
    assign_buckets: list[int] = field(default_factory=lambda: [0] * len(TIME_TO_ASSIGN_BUCKETS))
    assign_count: int = 0
    assign_sum_seconds: float = 0.0

    def add(self, other: Counters) -> Counters:
        total = Counters.from_data(self.as_data())
        for source, n in other.received_by_source.items():
            total.received_by_source[source] = total.received_by_source.get(source, 0) + n
        for status, n in other.processed_by_status.items():
            total.processed_by_status[status] = total.processed_by_status.get(status, 0) + n
        total.sla_breaches += other.sla_breaches
        total.delivery_failures += other.delivery_failures
        total.reassignments += other.reassignments
        total.assign_buckets = [
            a + b for a, b in zip(total.assign_buckets, other.assign_buckets, strict=True)
        ]
        total.assign_count += other.assign_count
        total.assign_sum_seconds += other.assign_sum_seconds
        return total

    def as_data(self) -> dict[str, Any]:
        return {
            "received_by_source": dict(self.received_by_source),
            "processed_by_status": dict(self.processed_by_status),
            "sla_breaches": self.sla_breaches,
            "delivery_failures": self.delivery_failures,
            "reassignments": self.reassignments,
            "assign_buckets": list(self.assign_buckets),
            "assign_count": self.assign_count,
            "assign_sum_seconds": self.assign_sum_seconds,
        }

    @classmethod
    def from_data(cls, data: dict[str, Any] | None) -> Counters:
        data = data or {}
        buckets = [int(n) for n in data.get("assign_buckets") or []]
        if len(buckets) != len(TIME_TO_ASSIGN_BUCKETS):
            buckets = [0] * len(TIME_TO_ASSIGN_BUCKETS)
        return cls(
            received_by_source={
                str(k): int(v) for k, v in (data.get("received_by_source") or {}).items()
            },
            processed_by_status={
                str(k): int(v) for k, v in (data.get("processed_by_status") or {}).items()
            },
            sla_breaches=int(data.get("sla_breaches") or 0),
            delivery_failures=int(data.get("delivery_failures") or 0),
            reassignments=int(data.get("reassignments") or 0),
            assign_buckets=buckets,
            assign_count=int(data.get("assign_count") or 0),
            assign_sum_seconds=float(data.get("assign_sum_seconds") or 0.0),
        )


@dataclass(frozen=True)
class Marks:
    """Rows counted into the stored totals: events and assignments with an id up to these,
    leads received before ``leads_before`` (None: none yet)."""

    events_upto: int = 0
    assignments_upto: int = 0
    leads_before: datetime | None = None


def _count(
    *,
    events_after: int,
    assignments_after: int,
    leads_from: datetime | None,
    upto: Marks | None = None,
) -> Counters:
    """Count the rows past the given marks (and, with ``upto``, up to its marks)."""
    counters = Counters()
    leads = Lead.objects.order_by()
    if leads_from is not None:
        leads = leads.filter(received_at__gte=leads_from)
    if upto is not None:
        if upto.leads_before is None:
            leads = leads.none()
        else:
            leads = leads.filter(received_at__lt=upto.leads_before)
    for source_id, n in leads.values_list("source_id").annotate(n=Count("pk")):
        counters.received_by_source[str(source_id)] = n

    events = Event.objects.order_by().filter(id__gt=events_after, type__in=_COUNTED_EVENTS)
    if upto is not None:
        events = events.filter(id__lte=upto.events_upto)
    conditions = {
        **{f"out_{status}": condition for status, condition in _OUTCOME_CONDITIONS.items()},
        **_EVENT_COUNTERS,
    }
    agg = events.aggregate(
        **{name: Count("id", filter=condition) for name, condition in conditions.items()}
    )
    for status in _OUTCOME_CONDITIONS:
        counters.processed_by_status[status] = agg[f"out_{status}"] or 0
    counters.sla_breaches = agg["sla_breaches"] or 0
    counters.delivery_failures = agg["delivery_failures"] or 0
    counters.reassignments = agg["reassignments"] or 0

    # The lead's receipt time as a correlated subquery, one primary-key lookup per assignment:
    # joined, PostgreSQL hashes the whole leads table to match a few thousand new assignments.
    received_at = Subquery(
        Lead.objects.order_by().filter(pk=OuterRef("lead_id")).values("received_at")[:1]
    )
    waited = ExpressionWrapper(F("assigned_at") - received_at, output_field=DurationField())
    first_owners = Assignment.objects.order_by().filter(
        id__gt=assignments_after, kind__in=FIRST_ASSIGNMENT_KINDS
    )
    if upto is not None:
        first_owners = first_owners.filter(id__lte=upto.assignments_upto)
    buckets = {
        f"le_{i}": Count("id", filter=Q(waited__lte=timedelta(seconds=bound)))
        for i, bound in enumerate(TIME_TO_ASSIGN_BUCKETS)
    }
    # Sliced, so that the aggregates read the computed ``waited`` of an inner query instead of
    # repeating the lookup once per bucket.
    hist = first_owners.annotate(waited=waited)[: 2**62].aggregate(
        count=Count("id"), total=Sum("waited"), **buckets
    )
    counters.assign_count = hist["count"] or 0
    total = hist["total"]
    counters.assign_sum_seconds = total.total_seconds() if total is not None else 0.0
    counters.assign_buckets = [hist[f"le_{i}"] or 0 for i in range(len(TIME_TO_ASSIGN_BUCKETS))]
    return counters


def _marks(data: dict[str, Any]) -> Marks:
    before = data.get("leads_before")
    return Marks(
        events_upto=int(data.get("events_upto") or 0),
        assignments_upto=int(data.get("assignments_upto") or 0),
        leads_before=parse_datetime(before) if isinstance(before, str) else None,
    )


def _observe(offset: timedelta) -> list[Any]:
    """[time, max event id, max assignment id] (ids 0 when the table is empty).

    The time is read when the maximum ids are, not when the caller started (a backlog check's
    ``now`` precedes its broker round trip): every row under the ids was inserted before it, so
    the observation settles no earlier than those rows' transactions had to commit. ``offset``
    carries a caller's injected clock (``now`` minus the real time when the refresh began).
    """
    at = timezone.now() + offset
    events_max = Event.objects.aggregate(m=Max("id"))["m"] or 0
    assignments_max = Assignment.objects.aggregate(m=Max("id"))["m"] or 0
    return [at.isoformat(), events_max, assignments_max]


# Observations kept waiting to settle. Over the cap, every other one between the oldest and the
# newest is dropped: the oldest (the next to settle) are never lost, however long the settle
# period is against the refresh interval, so the marks keep moving.
PENDING_CAP = 64


def _thin(pending: list[list[Any]], cap: int = PENDING_CAP) -> list[list[Any]]:
    while len(pending) > cap:
        pending = [pending[0], *pending[1:-1][1::2], pending[-1]]
    return pending


def settle_covers_transactions(settle: float | None = None) -> tuple[bool, float]:
    """Whether METRICS_SETTLE_SECONDS exceeds the longest transaction that writes counted rows
    (the worker task time limit, gunicorn's request timeout), and that longest."""
    settle = settings.METRICS_SETTLE_SECONDS if settle is None else settle
    gunicorn = float(os.environ.get("GUNICORN_TIMEOUT", "30") or 30)
    longest = max(float(settings.CELERY_TASK_TIME_LIMIT), gunicorn)
    return settle > longest, longest


def _status_counts() -> dict[str, int]:
    counts = dict.fromkeys(LeadStatus.values, 0)
    for status, n in Lead.objects.order_by().values_list("status").annotate(n=Count("pk")):
        counts[status] = n
    return counts


def _locked_state(*, wait: bool) -> MetricsState | None:
    MetricsState.objects.get_or_create(key=KEY)
    rows = MetricsState.objects.filter(key=KEY)
    if not wait and connection.features.has_select_for_update_skip_locked:
        return rows.select_for_update(skip_locked=True).first()
    return rows.select_for_update().first()


def counters_refresh(*, now: datetime | None = None, wait: bool = True) -> bool:
    """Move the high-water marks forward (adding the settled rows to the stored totals) and
    recount the leads per status when due. False when another process holds the state
    (``wait=False``). Cost: the rows since the last mark, not the tables."""
    real_now = timezone.now()
    now = now or real_now
    offset = now - real_now
    settle = timedelta(seconds=settings.METRICS_SETTLE_SECONDS)
    with transaction.atomic():
        state = _locked_state(wait=wait)
        if state is None:
            return False
        data = dict(state.data or {})
        marks = _marks(data)
        stored = Counters.from_data(data.get("totals"))
        pending: list[list[Any]] = [
            entry for entry in data.get("pending") or [] if isinstance(entry, list)
        ]
        pending.append(_observe(offset))
        settled = [entry for entry in pending if (parse_datetime(entry[0]) or now) <= now - settle]
        if settled:
            at, events_max, assignments_max = settled[-1]
            new = Marks(
                events_upto=max(marks.events_upto, int(events_max)),
                assignments_upto=max(marks.assignments_upto, int(assignments_max)),
                leads_before=max(
                    filter(None, (marks.leads_before, parse_datetime(at))),
                    default=None,
                ),
            )
            if new != marks:
                delta = _count(
                    events_after=marks.events_upto,
                    assignments_after=marks.assignments_upto,
                    leads_from=marks.leads_before,
                    upto=new,
                )
                stored = stored.add(delta)
                marks = new
            pending = [entry for entry in pending if entry not in settled]
        data.update(
            totals=stored.as_data(),
            events_upto=marks.events_upto,
            assignments_upto=marks.assignments_upto,
            leads_before=marks.leads_before.isoformat() if marks.leads_before else None,
            pending=_thin(pending),
        )
        statuses_at = parse_datetime(str(data.get("statuses_at") or ""))
        if statuses_at is None or (now - statuses_at).total_seconds() >= (
            settings.METRICS_STATUS_REFRESH_SECONDS
        ):
            data["statuses"] = _status_counts()
            data["statuses_at"] = now.isoformat()
        state.data = data
        state.refreshed_at = now
        state.save(update_fields=["data", "refreshed_at"])
    return True


@dataclass
class CurrentCounters:
    """The counters as of now, and the leads per status (live for the small statuses)."""

    counters: Counters
    statuses: dict[str, int]


def counters_current(*, now: datetime | None = None) -> CurrentCounters:
    """Stored totals plus the rows past the marks; refreshes first when the state is stale."""
    now = now or timezone.now()
    state = MetricsState.objects.filter(key=KEY).first()
    stale = (
        state is None
        or state.refreshed_at is None
        or ((now - state.refreshed_at).total_seconds() >= settings.METRICS_REFRESH_SECONDS)
    )
    if stale:
        try:
            if counters_refresh(now=now, wait=False):
                state = MetricsState.objects.filter(key=KEY).first()
        except Exception:  # serve what is stored; the next scrape or check refreshes
            logger.warning("could not refresh the metrics counters", exc_info=True)
    data = state.data if state is not None else {}
    marks = _marks(data)
    tail = _count(
        events_after=marks.events_upto,
        assignments_after=marks.assignments_upto,
        leads_from=marks.leads_before,
    )
    statuses = {str(k): int(v) for k, v in (data.get("statuses") or {}).items()}
    for status in LeadStatus.values:
        statuses.setdefault(status, 0)
    live: dict[str, int] = {str(status): 0 for status in LIVE_STATUSES}
    for status, n in (
        Lead.objects.order_by()
        .filter(status__in=LIVE_STATUSES)
        .values_list("status")
        .annotate(n=Count("pk"))
    ):
        live[status] = n
    statuses.update(live)
    return CurrentCounters(
        counters=Counters.from_data(data.get("totals")).add(tail), statuses=statuses
    )
