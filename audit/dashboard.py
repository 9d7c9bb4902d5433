"""The dashboard's numbers (a few aggregate queries) and its charts as plain SVG geometry.

Nothing here loops over leads: per-minute rates come from TruncMinute buckets, loads from one
conditional-count query over reps, percentiles from PostgreSQL's percentile_cont (on SQLite,
which has none, from the durations of the window's assignments).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.db import connection
from django.db.models import (
    Aggregate,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Min,
)
from django.db.models.functions import TruncMinute
from django.utils import timezone

from audit.models import Event, EventType
from leads.models import Lead, LeadStatus
from routing.models import Assignment, Rep

ROUTED_EVENTS = (EventType.ASSIGNED, EventType.EXCLUDED, EventType.UNASSIGNED)
# SQLite has no percentile aggregate: at most this many durations are read to compute them.
PERCENTILE_SAMPLE_LIMIT = 100_000
REP_LIMIT = 40

CHART_WIDTH = 720
CHART_HEIGHT = 140


class PercentileCont(Aggregate):
    """PostgreSQL's ``percentile_cont(p) WITHIN GROUP (ORDER BY expr)``."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


def dashboard_alerts() -> list[str]:
    """Open alerts, newest first, as the lines the dashboard shows."""
    from routing.monitoring.models import Alert, AlertStatus

    return [
        f"{alert.get_kind_display()}: {alert.message} "
        f"(open since {alert.opened_at:%Y-%m-%d %H:%M} UTC)"
        for alert in Alert.objects.filter(status=AlertStatus.OPEN).order_by("-opened_at")[:20]
    ]


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    title: str


@dataclass(frozen=True)
class MinuteChart:
    """A per-minute bar chart, scaled for an SVG viewBox of CHART_WIDTH x CHART_HEIGHT."""

    title: str
    bars: list[Bar]
    total: int
    peak: int
    start_label: str
    end_label: str
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT


@dataclass(frozen=True)
class RepLoad:
    name: str
    open: int
    max_open: int | None
    today: int
    max_per_day: int | None
    open_pct: float  # bar length, 0-100, of open against the cap (or the busiest rep)
    today_pct: float
    open_label: str
    today_label: str
    over: bool


@dataclass(frozen=True)
class Dashboard:
    now: datetime
    hours: int
    backlog: int
    backlog_oldest_age: timedelta | None
    intake: MinuteChart
    routed: MinuteChart
    p50: timedelta | None
    p95: timedelta | None
    assigned_in_window: int
    sla_breaches_today: int
    unassigned: int
    failed: int
    alerts: list[Any]
    reps: list[RepLoad]


def _minute_counts(rows: Any) -> dict[datetime, int]:
    return {row["minute"]: row["n"] for row in rows if row["minute"] is not None}


def minute_chart(
    title: str, counts: dict[datetime, int], *, start: datetime, minutes: int
) -> MinuteChart:
    """Bars for ``minutes`` buckets from ``start`` (missing minutes are zero)."""
    values = [counts.get(start + timedelta(minutes=i), 0) for i in range(minutes)]
    peak = max(values, default=0)
    slot = CHART_WIDTH / max(minutes, 1)
    bars = []
    for i, value in enumerate(values):
        if not value:
            continue
        height = (CHART_HEIGHT - 4) * value / peak
        moment = start + timedelta(minutes=i)
        bars.append(
            Bar(
                x=round(i * slot, 2),
                y=round(CHART_HEIGHT - height, 2),
                width=round(max(slot - 0.5, 0.5), 2),
                height=round(height, 2),
                title=f"{moment:%H:%M} UTC: {value}",
            )
        )
    end = start + timedelta(minutes=minutes)
    return MinuteChart(
        title=title,
        bars=bars,
        total=sum(values),
        peak=peak,
        start_label=f"{start:%H:%M}",
        end_label=f"{end:%H:%M} UTC",
    )


def _percentiles(since: datetime) -> tuple[timedelta | None, timedelta | None, int]:
    """Time to assign (received_at → assigned), over the ``assigned`` events since ``since``.

    Read from the audit log's (type, at) index: the assignments table has no index on
    assigned_at alone, and a window over it read the whole table (0.6 s on a million leads).
    Over the dashboard's window: 3 hours (~5,000 assignments) take 76 ms on PostgreSQL, a
    nested loop on the leads' primary key; 24 hours of 43,000 a day, 0.55 s (a hash join).
    """
    window = Event.objects.filter(type=EventType.ASSIGNED, at__gte=since).order_by()
    wait = ExpressionWrapper(F("at") - F("lead__received_at"), DurationField())
    if connection.vendor == "postgresql":
        found = window.aggregate(
            n=Count("pk"),
            p50=PercentileCont(wait, 0.5, output_field=DurationField()),
            p95=PercentileCont(wait, 0.95, output_field=DurationField()),
        )
        return found["p50"], found["p95"], found["n"]
    waits = sorted(
        assigned - received
        for assigned, received in window.values_list("at", "lead__received_at")[
            :PERCENTILE_SAMPLE_LIMIT
        ]
    )
    if not waits:
        return None, None, 0
    return percentile(waits, 0.5), percentile(waits, 0.95), len(waits)


def percentile(values: list[timedelta], fraction: float) -> timedelta:
    """Linear interpolation between the closest ranks, as percentile_cont does."""
    rank = fraction * (len(values) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return values[low] + (values[high] - values[low]) * (rank - low)


def _pct(value: int, scale: int) -> float:
    return round(min(100.0, 100.0 * value / scale), 1) if scale else 0.0


def rep_loads(*, day_start: datetime, team_ids: list[int] | None = None) -> list[RepLoad]:
    """Active reps, busiest first: open leads against max_open, today's against max_per_day.

    "Today" is the UTC day here (the engine counts each rep's local day).
    """
    # Three small queries rather than one join: each count uses its own index
    # (assignment_open_per_rep_idx, assignment_rep_day_idx) instead of every assignment.
    opened = dict(
        Assignment.objects.filter(active=True, touched_at__isnull=True)
        .order_by()
        .values_list("rep_id")
        .annotate(n=Count("pk"))
    )
    assigned_today = dict(
        Assignment.objects.filter(assigned_at__gte=day_start)
        .order_by()
        .values_list("rep_id")
        .annotate(n=Count("pk"))
    )
    active = Rep.objects.filter(active=True)
    if team_ids is not None:  # a manager scoped to their teams sees their members only
        active = active.filter(memberships__team_id__in=team_ids).distinct()
    reps = sorted(
        active.only("name", "max_open", "max_per_day"),
        key=lambda rep: (-opened.get(rep.pk, 0), rep.name),
    )[:REP_LIMIT]
    busiest_open = max((opened.get(rep.pk, 0) for rep in reps), default=0)
    busiest_today = max((assigned_today.get(rep.pk, 0) for rep in reps), default=0)
    loads = []
    for rep in reps:
        count = opened.get(rep.pk, 0)
        today = assigned_today.get(rep.pk, 0)
        loads.append(
            RepLoad(
                name=rep.name,
                open=count,
                max_open=rep.max_open,
                today=today,
                max_per_day=rep.max_per_day,
                open_pct=_pct(count, rep.max_open or busiest_open),
                today_pct=_pct(today, rep.max_per_day or busiest_today),
                open_label=f"{count} / {rep.max_open}" if rep.max_open else f"{count} (no cap)",
                today_label=f"{today} / {rep.max_per_day}"
                if rep.max_per_day
                else f"{today} (no cap)",
                over=bool(
                    (rep.max_open and count >= rep.max_open)
                    or (rep.max_per_day and today >= rep.max_per_day)
                ),
            )
        )
    return loads


def dashboard(
    *, hours: int = 3, now: datetime | None = None, team_ids: list[int] | None = None
) -> Dashboard:
    """The dashboard's numbers and charts over the last ``hours``.

    ``team_ids`` (a manager scoped to their teams): rep loads of their members only, and no
    operational alerts (those are about the whole system, for operators and RevOps).
    """
    now = now or timezone.now()
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    minutes = hours * 60
    start = end - timedelta(minutes=minutes)
    day_start = datetime.combine(now.astimezone(UTC).date(), time.min, tzinfo=UTC)

    backlog = Lead.objects.filter(status=LeadStatus.RECEIVED).aggregate(
        n=Count("pk"), oldest=Min("queued_at")
    )
    stuck = dict(
        Lead.objects.filter(status__in=(LeadStatus.UNASSIGNED, LeadStatus.FAILED))
        .order_by()
        .values_list("status")
        .annotate(n=Count("pk"))
    )
    intake = _minute_counts(
        Lead.objects.filter(received_at__gte=start)
        .order_by()
        .annotate(minute=TruncMinute("received_at", tzinfo=UTC))
        .values("minute")
        .annotate(n=Count("pk"))
    )
    routed = _minute_counts(
        Event.objects.filter(type__in=ROUTED_EVENTS, at__gte=start)
        .order_by()
        .annotate(minute=TruncMinute("at", tzinfo=UTC))
        .values("minute")
        .annotate(n=Count("pk"))
    )
    p50, p95, assigned = _percentiles(start)
    oldest = backlog["oldest"]
    return Dashboard(
        now=now,
        hours=hours,
        backlog=backlog["n"],
        backlog_oldest_age=now - oldest if oldest else None,
        intake=minute_chart("Leads received per minute", intake, start=start, minutes=minutes),
        routed=minute_chart("Leads routed per minute", routed, start=start, minutes=minutes),
        p50=p50,
        p95=p95,
        assigned_in_window=assigned,
        sla_breaches_today=Event.objects.filter(
            type=EventType.SLA_BREACHED, at__gte=day_start
        ).count(),
        unassigned=stuck.get(LeadStatus.UNASSIGNED, 0),
        failed=stuck.get(LeadStatus.FAILED, 0),
        alerts=dashboard_alerts() if team_ids is None else [],
        reps=rep_loads(day_start=day_start, team_ids=team_ids),
    )
