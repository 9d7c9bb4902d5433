"""Reports for sales managers over a window of 1 hour to 90 days: per team, per rep, fairness.

Everything is aggregated in SQL (GROUP BY, and PostgreSQL's percentile_cont for the p50/p95
columns; SQLite has no percentile aggregate, so there the durations of the window are read,
at most PERCENTILE_SAMPLE_LIMIT of them, and interpolated the same way). Nothing loops over
leads in Python except that fallback.

Definitions (docs/managers.md has them for people):

- the window is ``[start, end)``, ``end`` the end of the bucket holding now;
- a team's or rep's *assigned* counts the assignments made to them in the window (``new``:
  a lead's first owner, ``reassigned in``: given to them by a reassignment);
- *SLA met %* is met / (met + missed) over those assignments that have an SLA: met when the
  first touch came by the due time, missed when it came later or the due time passed untouched;
- *time to assign*: from receiving a lead to its first assignment; *time to first touch*: from
  an assignment to its first touch (touched assignments only);
- *reassigned away*: the ``reassigned`` events of the window, by the rep the lead was taken
  from (``data.from``) and the team it was reassigned within, split by why: the SLA (beat's
  check), by hand (a manager or the API), in the CRM (an owner changed there), other (the rep
  became unavailable and the rules routed it again);
- "today" is each rep's own local day (routing.loads.local_midnight), as for their caps;
- buckets are the page zone's (``timezone.get_current_timezone()``: the user's, the browser's
  or the server's): a day bar runs from local midnight to local midnight (23 or 25 hours across
  a DST change), hour bars start at the local hour (Kolkata's at :30 UTC).

Windows longer than a week (30 and 90 days) read the rollups (audit.rollups) for the whole
15-minute slots (charts, outcomes) and whole UTC days (tables, fairness) inside the window, and
the raw rows for the partial edges: the counts are the same as over the raw rows; p50 and p95
come from a histogram with bins 19 % wide (at most one bin off, see histogram_percentile).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import (
    Aggregate,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Q,
    QuerySet,
    Sum,
)
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone

from audit import rollups
from audit.models import AssignmentDay, Event, EventType, ReportSlot
from leads.models import Lead, LeadStatus
from routing.loads import assigned_since_local_midnight
from routing.models import (
    FIRST_ASSIGNMENT_KINDS,
    Assignment,
    AssignmentKind,
    Rep,
    Team,
    TeamMembership,
    TeamStrategy,
)

# SQLite has no percentile aggregate: at most this many durations are read to compute them.
PERCENTILE_SAMPLE_LIMIT = 100_000
REP_PAGE_SIZE = 50
MAX_CHART_BARS = 360
CHART_WIDTH = 720
CHART_HEIGHT = 140
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NAIVE_EPOCH = EPOCH.replace(tzinfo=None)  # wall-clock arithmetic in span_of

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)

# Windows longer than this read the rollups (exact counts, percentiles from a histogram).
ROLLUP_AFTER = 7 * DAY

# The buckets a chart may be asked for (?bucket=), finest first.
BUCKETS: dict[str, timedelta] = {
    "1m": MINUTE,
    "5m": 5 * MINUTE,
    "15m": 15 * MINUTE,
    "1h": HOUR,
    "6h": 6 * HOUR,
    "1d": DAY,
}


class ReportError(ValueError):
    """A report parameter that is not one of its accepted values (a 400)."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.message = message


@dataclass(frozen=True)
class Window:
    """A report window: its length and its chart's default bucket."""

    key: str
    length: timedelta
    bucket: str
    label: str


WINDOWS: dict[str, Window] = {
    w.key: w
    for w in (
        Window("1h", HOUR, "1m", "1 hour"),
        Window("6h", 6 * HOUR, "5m", "6 hours"),
        Window("24h", DAY, "15m", "24 hours"),
        Window("7d", 7 * DAY, "1h", "7 days"),
        Window("30d", 30 * DAY, "6h", "30 days"),
        Window("90d", 90 * DAY, "1d", "90 days"),
    )
}
DEFAULT_WINDOW = "6h"


def window_parse(value: str | None, *, hours: str | None = None) -> Window:
    """The window named by ``?window=`` (``?hours=N`` of older links maps to the nearest)."""
    if value is None or value == "":
        if hours is not None:
            try:
                wanted = int(hours)
            except ValueError:
                return WINDOWS[DEFAULT_WINDOW]
            return WINDOWS["1h" if wanted <= 1 else "6h" if wanted <= 6 else "24h"]
        return WINDOWS[DEFAULT_WINDOW]
    found = WINDOWS.get(value.strip())
    if found is None:
        raise ReportError("window", f"window must be one of {', '.join(WINDOWS)}")
    return found


def bucket_parse(value: str | None, window: Window) -> tuple[str, timedelta]:
    """The chart bucket: the window's default, or ``?bucket=``; unknown names are an error,
    a bucket too fine for the window (more than MAX_CHART_BARS bars) is clamped up, one
    coarser than the window down to the window's default."""
    key = window.bucket if value is None or value == "" else value.strip()
    size = BUCKETS.get(key)
    if size is None:
        raise ReportError("bucket", f"bucket must be one of {', '.join(BUCKETS)}")
    if size > window.length:
        return window.bucket, BUCKETS[window.bucket]
    for name, candidate in BUCKETS.items():
        if candidate >= size and window.length / candidate <= MAX_CHART_BARS:
            return name, candidate
    return window.bucket, BUCKETS[window.bucket]  # unreachable: 1d fits every window


@dataclass(frozen=True)
class Span:
    """``[start, end)``: ``end`` is the end of the bucket holding ``now``; ``edges`` are the
    ``bars + 1`` bucket boundaries, on the zone's wall clock (so not always ``bucket`` apart)."""

    start: datetime
    end: datetime
    bucket: timedelta
    bars: int
    now: datetime
    edges: tuple[datetime, ...] = ()
    zone: Any = UTC
    rollup: bool = False  # read the rollups for the whole slots and days inside (long windows)

    def index_of(self, moment: datetime) -> int | None:
        """The bar holding ``moment``, or None outside ``[start, end)``."""
        if not self.start <= moment < self.end:
            return None
        if not self.edges:
            return (moment - self.start) // self.bucket
        return bisect.bisect_right(self.edges, moment) - 1

    def bar_start(self, index: int) -> datetime:
        if self.edges:
            return self.edges[index].astimezone(self.zone)
        return (self.start + index * self.bucket).astimezone(self.zone)


def span_of(window: Window, bucket: timedelta, now: datetime, zone: Any = None) -> Span:
    """The window's bars ending with the one holding ``now``, on ``zone``'s wall clock (the
    active zone by default): buckets are counted from 1970-01-01 00:00 local time, so a day bar
    is a local day and an hour bar a local hour."""
    zone = zone or timezone.get_current_timezone()
    wall = now.astimezone(zone).replace(tzinfo=None)
    passed = (wall - NAIVE_EPOCH) // bucket + 1
    end_wall = NAIVE_EPOCH + passed * bucket
    bars = math.ceil(window.length / bucket)
    # Each wall-clock boundary as an instant (fold=0: the first of a repeated hour; a boundary
    # in a DST gap lands after it). Kept strictly increasing, so each instant has one bar.
    edges: list[datetime] = []
    for k in range(bars, -1, -1):
        instant = (end_wall - k * bucket).replace(tzinfo=zone).astimezone(UTC)
        if edges and instant <= edges[-1]:
            instant = edges[-1] + timedelta(microseconds=1)
        edges.append(instant)
    return Span(
        start=edges[0],
        end=edges[-1],
        bucket=bucket,
        bars=bars,
        now=now,
        edges=tuple(edges),
        zone=zone,
        rollup=window.length > ROLLUP_AFTER and bucket >= HOUR,
    )


# --- Charts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    title: str


@dataclass(frozen=True)
class BucketChart:
    """A bar chart of counts per bucket, scaled for an SVG viewBox of CHART_WIDTH x HEIGHT."""

    title: str
    bars: list[Bar]
    total: int
    peak: int
    per: str  # "min", "5 min", "h", "day"
    start_label: str
    end_label: str
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT


def bucket_words(bucket: timedelta) -> str:
    minutes = int(bucket.total_seconds() // 60)
    if minutes < 60:
        return "min" if minutes == 1 else f"{minutes} min"
    if minutes < 1440:
        return "h" if minutes == 60 else f"{minutes // 60} h"
    return "day"


def _moment_label(moment: datetime, span: Span) -> str:
    if span.end - span.start <= DAY:
        return f"{moment:%H:%M}"
    return f"{moment:%d %b %H:%M}" if span.bucket < DAY else f"{moment:%d %b}"


def _zone_label(moment: datetime) -> str:
    return moment.tzname() or str(moment.tzinfo)


def bucket_chart(title: str, values: list[int], span: Span) -> BucketChart:
    """Bars for ``values`` (one per bucket of ``span``; zeros draw nothing)."""
    peak = max(values, default=0)
    slot = CHART_WIDTH / max(len(values), 1)
    bars = []
    for i, value in enumerate(values):
        if not value:
            continue
        height = (CHART_HEIGHT - 4) * value / peak
        moment = span.bar_start(i)
        bars.append(
            Bar(
                x=round(i * slot, 2),
                y=round(CHART_HEIGHT - height, 2),
                width=round(max(slot - 0.5, 0.5), 2),
                height=round(height, 2),
                title=f"{_moment_label(moment, span)} {_zone_label(moment)}: {value}",
            )
        )
    return BucketChart(
        title=title,
        bars=bars,
        total=sum(values),
        peak=peak,
        per=bucket_words(span.bucket),
        start_label=_moment_label(span.bar_start(0), span),
        end_label=f"{_moment_label(span.end.astimezone(span.zone), span)} "
        f"{_zone_label(span.end.astimezone(span.zone))}",
    )


def bucket_counts(
    queryset: QuerySet[Any],
    column: str,
    span: Span,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
) -> list[int]:
    """Rows of ``queryset`` per bucket of ``span`` by ``column`` (only those in ``[start,
    end)`` when given): grouped in SQL by the minute (buckets under an hour) or the hour, then
    added up into the buckets."""
    trunc = TruncMinute if span.bucket < HOUR else TruncHour
    rows = (
        queryset.filter(**{f"{column}__gte": start or span.start, f"{column}__lt": end or span.end})
        .order_by()
        # Truncated on the span's wall clock, so minutes and hours line up with its edges.
        .annotate(slot=trunc(column, tzinfo=span.zone))
        .values("slot")
        .annotate(n=Count("pk"))
        .values_list("slot", "n")
    )
    values = [0] * span.bars
    for slot, n in rows:
        if slot is None:
            continue
        index = span.index_of(slot)
        if index is not None:
            values[index] += n
    return values


def _inner(span: Span, step: timedelta) -> tuple[datetime, datetime]:
    """``[first, last)``: the whole ``step``s (from 1970-01-01 UTC) inside the span."""
    first = EPOCH + -((EPOCH - span.start) // step) * step
    last = EPOCH + ((span.end - EPOCH) // step) * step
    return first, max(first, last)


def _raw_pieces(span: Span, first: datetime, last: datetime) -> list[tuple[datetime, datetime]]:
    """The partial edges of the span around ``[first, last)`` (the whole span when empty)."""
    if first >= last:
        return [(span.start, span.end)]
    return [(a, b) for a, b in ((span.start, first), (last, span.end)) if a < b]


ROUTED_EVENTS = (EventType.ASSIGNED, EventType.EXCLUDED, EventType.UNASSIGNED)


def _slot_counts(queryset: QuerySet[Any], column: str, span: Span, measure: Q) -> list[int]:
    """bucket_counts from the 15-minute rollup for the whole slots, the raw rows for the rest
    (hour bars or longer: a slot lies within one local hour of any zone)."""
    first, last = _inner(span, rollups.SLOT)
    values = [0] * span.bars
    if first < last:
        rows = (
            ReportSlot.objects.filter(measure, slot__gte=first, slot__lt=last)
            .order_by()
            # Per slot (its 8 shards added up): a slot lies within one bar of hour bars or
            # longer in any zone, so its start finds its bar (no per-row zone conversion).
            .values_list("slot")
            .annotate(n=Sum("n"))
        )
        for slot, n in rows:
            index = span.index_of(slot)
            if index is not None:
                values[index] += n
    for start, end in _raw_pieces(span, first, last):
        for index, n in enumerate(bucket_counts(queryset, column, span, start=start, end=end)):
            values[index] += n
    return values


def intake_counts(span: Span) -> list[int]:
    """Leads received per bucket of ``span``."""
    if not span.rollup:
        return bucket_counts(Lead.objects.all(), "received_at", span)
    return _slot_counts(Lead.objects.all(), "received_at", span, Q(measure__startswith="lead:"))


def routed_counts(span: Span) -> list[int]:
    """Leads routed (assigned, excluded, unassigned events) per bucket of ``span``."""
    routed = Event.objects.filter(type__in=ROUTED_EVENTS)
    if not span.rollup:
        return bucket_counts(routed, "at", span)
    return _slot_counts(routed, "at", span, Q(measure="routed"))


@dataclass(frozen=True)
class WindowCounts:
    """The window's charts (leads received, routed, per bucket) and outcomes."""

    intake: list[int]
    routed: list[int]
    outcomes: Outcomes


def _slot_bars(span: Span, first: datetime, last: datetime) -> list[tuple[int | None, str, int]]:
    """(bar index or None, measure, n) of the slot rollup over ``[first, last)``. PostgreSQL
    finds each slot's bar itself (``width_bucket`` over the bars' edges) and sums per bar, a
    few hundred rows; elsewhere the rows come per slot (a slot lies within one bar of hour
    bars or longer in any zone, so its start finds its bar)."""
    if connection.vendor == "postgresql" and span.edges:
        sql = f"""SELECT width_bucket(slot, %s::timestamptz[]) - 1, measure, sum(n)
            FROM {rollups.SLOT_TABLE}
            WHERE slot >= %s AND slot < %s AND (measure LIKE 'lead:%%' OR measure = 'routed')
            GROUP BY 1, 2"""  # noqa: S608 (a constant table name)
        with connection.cursor() as cursor:
            cursor.execute(sql, [list(span.edges), first, last])
            return [
                (index if 0 <= index < span.bars else None, measure, int(n))
                for index, measure, n in cursor.fetchall()
            ]
    rows = (
        ReportSlot.objects.filter(slot__gte=first, slot__lt=last)
        .filter(Q(measure__startswith="lead:") | Q(measure="routed"))
        .order_by()
        .values_list("slot", "measure")
        .annotate(n=Sum("n"))
    )
    return [(span.index_of(slot), measure, n) for slot, measure, n in rows]


def window_counts(span: Span) -> WindowCounts:
    """intake_counts, routed_counts and outcomes together: from the rollups, one read of the
    slot rollup for all three (grouped by slot and measure), the raw rows for the edges."""
    if not span.rollup:
        return WindowCounts(intake_counts(span), routed_counts(span), outcomes(span=span))
    first, last = _inner(span, rollups.SLOT)
    intake = [0] * span.bars
    routed = [0] * span.bars
    by_status: Counter[str] = Counter()
    if first < last:
        for index, measure, n in _slot_bars(span, first, last):
            if measure == "routed":
                if index is not None:
                    routed[index] += n
                continue
            by_status[measure.removeprefix("lead:")] += n
            if index is not None:
                intake[index] += n
    leads = Lead.objects.all()
    events = Event.objects.filter(type__in=ROUTED_EVENTS)
    for start, end in _raw_pieces(span, first, last):
        for index, n in enumerate(bucket_counts(leads, "received_at", span, start=start, end=end)):
            intake[index] += n
        for index, n in enumerate(bucket_counts(events, "at", span, start=start, end=end)):
            routed[index] += n
        by_status.update(_status_counts(start, end))
    return WindowCounts(intake, routed, _outcomes_of(by_status))


# --- Percentiles ----------------------------------------------------------------------------


class PercentileCont(Aggregate):
    """PostgreSQL's ``percentile_cont(p) WITHIN GROUP (ORDER BY expr)``."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


def percentile(values: list[timedelta], fraction: float) -> timedelta:
    """Linear interpolation between the closest ranks, as percentile_cont does."""
    rank = fraction * (len(values) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return values[low] + (values[high] - values[low]) * (rank - low)


_TO_ASSIGN = ExpressionWrapper(F("assigned_at") - F("lead__received_at"), DurationField())
_TO_TOUCH = ExpressionWrapper(F("touched_at") - F("assigned_at"), DurationField())
_FIRST = Q(kind__in=FIRST_ASSIGNMENT_KINDS)
_TOUCHED = Q(touched_at__isnull=False)


def _percentiles_python(
    assignments: QuerySet[Assignment], key: str | None
) -> dict[Any, dict[str, timedelta | None]]:
    """SQLite: the p50/p95 of both durations per ``key``, from the window's rows."""
    to_assign: dict[Any, list[timedelta]] = defaultdict(list)
    to_touch: dict[Any, list[timedelta]] = defaultdict(list)
    columns = [key] if key else []
    rows = assignments.order_by().values_list(
        *columns, "kind", "assigned_at", "lead__received_at", "touched_at"
    )[:PERCENTILE_SAMPLE_LIMIT]
    for row in rows:
        group = row[0] if key else None
        kind, assigned, received, touched = row[-4:]
        if kind in FIRST_ASSIGNMENT_KINDS:
            to_assign[group].append(assigned - received)
        if touched is not None:
            to_touch[group].append(touched - assigned)
    found: dict[Any, dict[str, timedelta | None]] = {}
    for group in set(to_assign) | set(to_touch):
        a, t = sorted(to_assign.get(group, [])), sorted(to_touch.get(group, []))
        found[group] = {
            "tta_p50": percentile(a, 0.5) if a else None,
            "tta_p95": percentile(a, 0.95) if a else None,
            "ttft_p50": percentile(t, 0.5) if t else None,
            "ttft_p95": percentile(t, 0.95) if t else None,
        }
    return found


# --- Per team, per rep ----------------------------------------------------------------------


@dataclass
class Figures:
    """One line of the team or rep table (or the totals)."""

    assigned: int = 0
    new: int = 0
    reassigned_in: int = 0
    sla_met: int = 0
    sla_missed: int = 0
    tta_p50: timedelta | None = None
    tta_p95: timedelta | None = None
    ttft_p50: timedelta | None = None
    ttft_p95: timedelta | None = None
    away_sla: int = 0
    away_hand: int = 0
    away_crm: int = 0
    away_other: int = 0

    @property
    def sla_pct(self) -> float | None:
        judged = self.sla_met + self.sla_missed
        return round(100.0 * self.sla_met / judged, 1) if judged else None

    @property
    def away(self) -> int:
        return self.away_sla + self.away_hand + self.away_crm + self.away_other


def _assignment_figures(
    assignments: QuerySet[Assignment], key: str | None, now: datetime
) -> dict[Any, Figures]:
    """Counts and percentiles of the window's assignments per ``key`` (None: one total)."""
    counts: dict[str, Any] = {
        "assigned": Count("pk"),
        "new": Count("pk", filter=_FIRST),
        "reassigned_in": Count("pk", filter=Q(kind=AssignmentKind.REASSIGNMENT)),
        "sla_met": Count("pk", filter=Q(sla_due_at__isnull=False, touched_at__lte=F("sla_due_at"))),
        "sla_missed": Count(
            "pk",
            filter=Q(sla_due_at__isnull=False)
            & (Q(touched_at__gt=F("sla_due_at")) | Q(touched_at__isnull=True, sla_due_at__lt=now)),
        ),
    }
    postgres = connection.vendor == "postgresql"
    if postgres:
        duration = DurationField()
        counts.update(
            tta_p50=PercentileCont(_TO_ASSIGN, 0.5, filter=_FIRST, output_field=duration),
            tta_p95=PercentileCont(_TO_ASSIGN, 0.95, filter=_FIRST, output_field=duration),
            ttft_p50=PercentileCont(_TO_TOUCH, 0.5, filter=_TOUCHED, output_field=duration),
            ttft_p95=PercentileCont(_TO_TOUCH, 0.95, filter=_TOUCHED, output_field=duration),
        )
    base = assignments.order_by()
    rows: list[dict[str, Any]]
    if key is None:
        rows = [{"group": None, **base.aggregate(**counts)}]
    else:
        rows = [dict(row) for row in base.values(group=F(key)).annotate(**counts)]
    found = {row.pop("group"): Figures(**row) for row in rows}
    if not postgres:
        for group, values in _percentiles_python(assignments, key).items():
            figures = found.setdefault(group, Figures())
            for name, value in values.items():
                setattr(figures, name, value)
    return found


_AWAY = ("away_sla", "away_hand", "away_crm", "away_other")


def _away_pairs(events: QuerySet[Event]) -> dict[tuple[Any, Any], Counter[str]]:
    """Reassignments away per (team, rep the lead was taken from), by why (the event's data
    says): one grouped query, from which the team, rep and total lines are added up."""
    sla = Q(data__reason="sla_breached")
    hand = Q(data__manual=True)
    # Not ~hand alone: for an event without the key that is NOT NULL, which counts nothing.
    not_hand = ~Q(data__has_key="manual") | ~hand
    crm = Q(data__has_key="crm")
    rows = (
        events.order_by()
        .values(team_key=F("team_id"), from_rep=F("data__from__id"))
        .annotate(
            total=Count("pk"),
            sla=Count("pk", filter=sla & not_hand & ~crm),
            hand=Count("pk", filter=hand),
            crm=Count("pk", filter=crm & not_hand),
        )
    )
    found: dict[tuple[Any, Any], Counter[str]] = {}
    for row in rows:
        found[row["team_key"], row["from_rep"]] = Counter(
            away_sla=row["sla"],
            away_hand=row["hand"],
            away_crm=row["crm"],
            away_other=row["total"] - row["sla"] - row["hand"] - row["crm"],
        )
    return found


@dataclass
class _Tally:
    """Counts and histograms of one group, from the rollup and the raw edges."""

    counts: Counter[str] = field(default_factory=Counter)
    tta: list[int] = field(default_factory=lambda: [0] * rollups.BINS)
    ttft: list[int] = field(default_factory=lambda: [0] * rollups.BINS)
    missed: int = 0

    def add(self, other: _Tally) -> None:
        self.counts.update(other.counts)
        self.tta = [a + b for a, b in zip(self.tta, other.tta, strict=True)]
        self.ttft = [a + b for a, b in zip(self.ttft, other.ttft, strict=True)]
        self.missed += other.missed

    def figures(self) -> Figures:
        c = self.counts
        return Figures(
            assigned=c["assigned"],
            new=c["first"],
            reassigned_in=c["reassigned_in"],
            sla_met=c["sla_met"],
            sla_missed=self.missed,
            tta_p50=rollups.histogram_percentile(self.tta, 0.5),
            tta_p95=rollups.histogram_percentile(self.tta, 0.95),
            ttft_p50=rollups.histogram_percentile(self.ttft, 0.5),
            ttft_p95=rollups.histogram_percentile(self.ttft, 0.95),
        )


Pair = tuple[int | None, int]  # (team id, or None for an assignment outside a team; rep id)


def _edge_tallies(
    start: datetime, end: datetime, team_ids: list[int] | None, tallies: dict[Pair, _Tally]
) -> None:
    """Adds the assignments of ``[start, end)`` (a window's partial day) per (team, rep),
    aggregated in SQL with the triggers' own expressions (audit.rollups): the counts and the
    time-to-assign bins grouped by (team, rep, bin), the first-touch bins likewise, so a day
    of ten thousand assignments comes back as a few rows per rep."""
    if team_ids is not None and not team_ids:
        return
    ops = connection.ops
    where = "a.assigned_at >= %s AND a.assigned_at < %s"
    params: list[Any] = [ops.adapt_datetimefield_value(start), ops.adapt_datetimefield_value(end)]
    if team_ids is not None:
        where += f" AND a.team_id IN ({', '.join(['%s'] * len(team_ids))})"
        params += [int(pk) for pk in team_ids]
    values = rollups.assignment_values_sql(
        connection.vendor,
        f"FROM routing_assignment a JOIN leads_lead l ON l.id = a.lead_id WHERE {where}",
    )
    # The SQL is built from audit.rollups' constants and placeholders only.
    sql = f"""WITH v AS ({values})
        SELECT team_key, rep_id, 0, tb, count(*), sum(is_first), sum(is_initial),
            sum(is_reassignment), sum(has_sla), sum(met)
        FROM v GROUP BY team_key, rep_id, tb
        UNION ALL
        SELECT team_key, rep_id, 1, fb, count(*), 0, 0, 0, 0, 0
        FROM v WHERE fb >= 0 GROUP BY team_key, rep_id, fb"""  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    for team_key, rep_id, part, index, n, first, initial, reassigned, with_sla, met in rows:
        tally = tallies[None if team_key == 0 else team_key, rep_id]
        if part == 1:
            tally.ttft[index] += n
            continue
        tally.counts["assigned"] += n
        tally.counts["first"] += first
        tally.counts["initial"] += initial
        tally.counts["reassigned_in"] += reassigned
        tally.counts["sla_met"] += met
        tally.missed += with_sla - met
        if index >= 0:
            tally.tta[index] += n


def _rollup_tallies(span: Span, team_ids: list[int] | None) -> dict[Pair, _Tally]:
    """The window's assignment figures per (team, rep): the day rollup for the whole UTC days
    of the window (read once, grouped by team and rep), the raw rows for its partial edges
    (aggregated in SQL). Missed SLAs need ``now``: every judged assignment that was not met
    counts as missed, less the untouched ones still due from now on (an index scan on the
    untouched ones' due time)."""
    first, last = _inner(span, DAY)
    tallies: dict[Pair, _Tally] = defaultdict(_Tally)
    if first < last:
        days = AssignmentDay.objects.filter(day__gte=first.date(), day__lt=last.date())
        if team_ids is not None:
            days = days.filter(team_key__in=team_ids)
        sums = {c: Sum(c) for c in rollups.SUM_COLUMNS}
        grouped: Any = days.order_by().values("team_key", "rep_id").annotate(**sums)
        for row in grouped:
            if not row["assigned"]:
                continue  # nothing, or contributions that moved away (a team deleted)
            tally = tallies[None if row["team_key"] == 0 else row["team_key"], row["rep_id"]]
            for name in rollups.COUNT_COLUMNS:
                tally.counts[name] += row[name] or 0
            for k in range(rollups.BINS):
                tally.tta[k] += row[f"tta_{k}"] or 0
                tally.ttft[k] += row[f"ttft_{k}"] or 0
            tally.missed += (row["with_sla"] or 0) - (row["sla_met"] or 0)
    for start, end in _raw_pieces(span, first, last):
        _edge_tallies(start, end, team_ids, tallies)
    due = Assignment.objects.filter(
        assigned_at__gte=span.start,
        assigned_at__lt=span.end,
        touched_at__isnull=True,
        sla_due_at__isnull=False,
        sla_due_at__gte=span.now,
    )
    if team_ids is not None:
        due = due.filter(team_id__in=team_ids)
    for team_id, rep_id, n in (
        due.order_by().values_list("team_id", "rep_id").annotate(n=Count("pk"))
    ):
        tallies[team_id, rep_id].missed -= n
    return {pair: tally for pair, tally in tallies.items() if tally.counts["assigned"]}


@dataclass(frozen=True)
class _WindowFigures:
    teams: dict[Any, Figures]
    reps: dict[Any, Figures]
    total: Figures
    initial: dict[tuple[int, int], int] | None = None  # fairness's counts (rollups only)


_FIRST_SQL = ", ".join(f"'{kind}'" for kind in FIRST_ASSIGNMENT_KINDS)


def _grouping_sets_figures(span: Span, team_ids: list[int] | None) -> _WindowFigures:
    """PostgreSQL, over the raw rows: _assignment_figures per team, per rep and in total in one
    query (``GROUPING SETS``): the window's assignments are found and joined to their leads
    once, not three times, with the same counts and ``percentile_cont`` percentiles."""
    where = "a.assigned_at >= %s AND a.assigned_at < %s"
    params: list[Any] = [span.now, span.start, span.end]
    if team_ids is not None:
        if not team_ids:
            return _WindowFigures({}, {}, Figures())
        where += f" AND a.team_id IN ({', '.join(['%s'] * len(team_ids))})"
        params += [int(pk) for pk in team_ids]
    first = f"a.kind IN ({_FIRST_SQL})"
    to_assign = "(a.assigned_at - l.received_at)"
    to_touch = "(a.touched_at - a.assigned_at)"
    # Built from constants and placeholders only.
    sql = f"""SELECT GROUPING(a.team_id), GROUPING(a.rep_id), a.team_id, a.rep_id,
            COUNT(*),
            COUNT(*) FILTER (WHERE {first}),
            COUNT(*) FILTER (WHERE a.kind = 'reassignment'),
            COUNT(*) FILTER (WHERE a.sla_due_at IS NOT NULL AND a.touched_at <= a.sla_due_at),
            COUNT(*) FILTER (WHERE a.sla_due_at IS NOT NULL AND (a.touched_at > a.sla_due_at
                OR (a.touched_at IS NULL AND a.sla_due_at < %s))),
            percentile_cont(0.5) WITHIN GROUP (ORDER BY {to_assign}) FILTER (WHERE {first}),
            percentile_cont(0.95) WITHIN GROUP (ORDER BY {to_assign}) FILTER (WHERE {first}),
            percentile_cont(0.5) WITHIN GROUP (ORDER BY {to_touch})
                FILTER (WHERE a.touched_at IS NOT NULL),
            percentile_cont(0.95) WITHIN GROUP (ORDER BY {to_touch})
                FILTER (WHERE a.touched_at IS NOT NULL)
        FROM routing_assignment a JOIN leads_lead l ON l.id = a.lead_id
        WHERE {where}
        GROUP BY GROUPING SETS ((a.team_id), (a.rep_id), ())"""  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    teams: dict[Any, Figures] = {}
    reps: dict[Any, Figures] = {}
    total = Figures()
    for no_team, no_rep, team_id, rep_id, *values in rows:
        figures = Figures(*values)
        if no_team and no_rep:
            total = figures
        elif no_rep:
            teams[team_id] = figures
        else:
            reps[rep_id] = figures
    return _WindowFigures(teams, reps, total)


def _window_figures(span: Span, team_ids: list[int] | None) -> _WindowFigures:
    """The window's assignment figures per team, per rep and in total (without the
    reassignments away). Over the raw rows (a week or less): a grouped query each, for their
    exact percentiles. From the rollups: one read, added up three ways."""
    if not span.rollup:
        if connection.vendor == "postgresql":
            return _grouping_sets_figures(span, team_ids)
        assignments = _window_assignments(span, team_ids)
        return _WindowFigures(
            teams=_assignment_figures(assignments, "team_id", span.now),
            reps=_assignment_figures(assignments, "rep_id", span.now),
            total=_assignment_figures(assignments, None, span.now).get(None) or Figures(),
        )
    by_team: dict[Any, _Tally] = defaultdict(_Tally)
    by_rep: dict[Any, _Tally] = defaultdict(_Tally)
    total = _Tally()
    initial: dict[tuple[int, int], int] = {}
    for (team_id, rep_id), tally in _rollup_tallies(span, team_ids).items():
        by_team[team_id].add(tally)
        by_rep[rep_id].add(tally)
        total.add(tally)
        if team_id is not None and tally.counts["initial"]:
            initial[team_id, rep_id] = tally.counts["initial"]
    return _WindowFigures(
        teams={k: t.figures() for k, t in by_team.items()},
        reps={k: t.figures() for k, t in by_rep.items()},
        total=total.figures() if total.counts["assigned"] else Figures(),
        initial=initial,
    )


def _window_assignments(span: Span, team_ids: list[int] | None) -> QuerySet[Assignment]:
    found = Assignment.objects.filter(assigned_at__gte=span.start, assigned_at__lt=span.end)
    return found if team_ids is None else found.filter(team_id__in=team_ids)


def _window_reassignments(span: Span, team_ids: list[int] | None) -> QuerySet[Event]:
    found = Event.objects.filter(type=EventType.REASSIGNED, at__gte=span.start, at__lt=span.end)
    return found if team_ids is None else found.filter(team_id__in=team_ids)


@dataclass(frozen=True)
class TeamRow:
    id: int
    name: str
    strategy: str
    figures: Figures


@dataclass(frozen=True)
class RepRow:
    """A rep's line: the window's figures and their load now (open, today in their zone)."""

    id: int
    name: str
    email: str
    timezone: str
    active: bool
    open: int
    today: int
    max_open: int | None
    max_per_day: int | None
    figures: Figures

    @property
    def open_label(self) -> str:
        return f"{self.open} / {self.max_open}" if self.max_open else f"{self.open} (no cap)"

    @property
    def today_label(self) -> str:
        if self.max_per_day:
            return f"{self.today} / {self.max_per_day}"
        return f"{self.today} (no cap)"

    @property
    def over(self) -> bool:
        return bool(
            (self.max_open and self.open >= self.max_open)
            or (self.max_per_day and self.today >= self.max_per_day)
        )


@dataclass(frozen=True)
class WindowTables:
    """The window's totals, team table and rep table, computed together (one read of the
    rollups and of the reassignments away for all three)."""

    totals: Figures
    teams: list[TeamRow]
    reps: list[RepRow]
    # First assignments of kind initial per (team, rep), for fairness (rollups only).
    initial: dict[tuple[int, int], int] | None = None


def _with_away(figures: Figures | None, away: Counter[str] | None) -> Figures:
    found = dataclasses.replace(figures) if figures is not None else Figures()
    for name in _AWAY:
        setattr(found, name, away[name] if away else 0)
    return found


def window_tables(
    *, span: Span, team_ids: list[int] | None = None, reps: bool = True
) -> WindowTables:
    """Totals, every team (in scope) by name and, with ``reps``, every active rep (in scope)
    and any inactive one with assignments in the window, with the window's figures."""
    figures = _window_figures(span, team_ids)
    away_teams: dict[Any, Counter[str]] = defaultdict(Counter)
    away_reps: dict[Any, Counter[str]] = defaultdict(Counter)
    away_total: Counter[str] = Counter()
    for (team_id, rep_id), counts in _away_pairs(_window_reassignments(span, team_ids)).items():
        if team_id is not None:
            away_teams[team_id].update(counts)
        if rep_id is not None:
            away_reps[rep_id].update(counts)
        away_total.update(counts)
    teams = Team.objects.order_by("name").only("name", "strategy")
    if team_ids is not None:
        teams = teams.filter(pk__in=team_ids)
    team_lines = [
        TeamRow(
            team.pk,
            team.name,
            team.get_strategy_display(),
            _with_away(figures.teams.get(team.pk), away_teams.get(team.pk)),
        )
        for team in teams
    ]
    rep_lines = _rep_lines(span, team_ids, figures.reps, away_reps) if reps else []
    return WindowTables(
        _with_away(figures.total, away_total), team_lines, rep_lines, figures.initial
    )


def team_rows(*, span: Span, team_ids: list[int] | None = None) -> list[TeamRow]:
    """Every team (in scope), by name, with the window's figures."""
    return window_tables(span=span, team_ids=team_ids, reps=False).teams


def reps_in_scope(team_ids: list[int] | None) -> QuerySet[Rep]:
    reps = Rep.objects.all()
    if team_ids is not None:
        reps = reps.filter(memberships__team_id__in=team_ids).distinct()
    return reps


def _rep_lines(
    span: Span,
    team_ids: list[int] | None,
    figures: dict[Any, Figures],
    away: dict[Any, Counter[str]],
) -> list[RepRow]:
    """ "Open now" is the rep's open counter (routing.loads: kept in the transaction of every
    assignment, touch and release, what the caps decide on; repaired by the reconciliation),
    read with the rep through its LEFT JOIN, not counted from every open assignment."""
    reps = list(
        reps_in_scope(team_ids)
        .filter(Q(active=True) | Q(pk__in=[pk for pk in figures if pk is not None]))
        .order_by()
        .values(
            "id",
            "name",
            "email",
            "timezone",
            "active",
            "max_open",
            "max_per_day",
            "load__open_count",
        )
    )
    today = assigned_since_local_midnight(
        now=span.now, zones={row["timezone"] or "UTC" for row in reps}
    )
    return [
        RepRow(
            id=rep["id"],
            name=rep["name"],
            email=rep["email"],
            timezone=rep["timezone"] or "UTC",
            active=rep["active"],
            open=rep["load__open_count"] or 0,
            today=today.get(rep["id"], 0),
            max_open=rep["max_open"],
            max_per_day=rep["max_per_day"],
            figures=_with_away(figures.get(rep["id"]), away.get(rep["id"])),
        )
        for rep in reps
    ]


def rep_rows(*, span: Span, team_ids: list[int] | None = None) -> list[RepRow]:
    """Every active rep (in scope), and any inactive one with assignments in the window."""
    return window_tables(span=span, team_ids=team_ids).reps


def totals(*, span: Span, team_ids: list[int] | None = None) -> Figures:
    """The figures over every assignment of the window (in scope)."""
    return window_tables(span=span, team_ids=team_ids, reps=False).totals


# --- Sorting and pages of the rep table -----------------------------------------------------


def _none_last(value: Any) -> tuple[bool, Any]:
    return (value is None, value)


REP_SORTS: dict[str, Any] = {
    "name": lambda row: (row.name.casefold(), row.id),
    "open": lambda row: (row.open, row.id),
    "today": lambda row: (row.today, row.id),
    "assigned": lambda row: (row.figures.assigned, row.id),
    "sla": lambda row: (_none_last(row.figures.sla_pct), row.id),
    "tta": lambda row: (_none_last(row.figures.tta_p50), row.id),
    "ttft": lambda row: (_none_last(row.figures.ttft_p50), row.id),
    "away": lambda row: (row.figures.away, row.id),
}
DEFAULT_REP_SORT = "-open"


def rep_sort_parse(value: str | None) -> tuple[str, bool]:
    """``(key, descending)`` of ``?sort=``; anything not in REP_SORTS is an error."""
    text = (value or DEFAULT_REP_SORT).strip()
    descending = text.startswith("-")
    key = text.removeprefix("-")
    if key not in REP_SORTS:
        raise ReportError(
            "sort", f"sort must be one of {', '.join(REP_SORTS)}, optionally prefixed by -"
        )
    return key, descending


def rep_rows_sorted(rows: list[RepRow], key: str, descending: bool) -> list[RepRow]:
    """Sorted by ``key``; reps without a value (no SLA judged yet) come last either way."""
    sort_key = REP_SORTS[key]
    with_value = [r for r in rows if sort_key(r)[0] != (True, None)]
    without = [r for r in rows if sort_key(r)[0] == (True, None)]
    ordered = sorted(with_value, key=sort_key, reverse=descending)
    return ordered + sorted(without, key=lambda r: (r.name.casefold(), r.id))


@dataclass(frozen=True)
class RepPage:
    rows: list[RepRow]
    number: int
    pages: int
    count: int


def page_parse(value: str | None) -> int:
    """``?page=``: a positive whole number (clamped to the last page later)."""
    if value is None or value == "":
        return 1
    text = value.strip()
    # isascii: str.isdigit is true of "²" and other digits int() refuses (a 500, not a 400).
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise ReportError("page", "page must be a positive whole number")
    return max(int(text), 1)


def rep_page(rows: list[RepRow], number: int, size: int = REP_PAGE_SIZE) -> RepPage:
    pages = max(math.ceil(len(rows) / size), 1)
    number = min(max(number, 1), pages)
    return RepPage(rows[(number - 1) * size : number * size], number, pages, len(rows))


# --- Fairness -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FairShare:
    rep: str
    weight: int
    active: bool
    leads: int
    share: float | None  # percent of the team's rotation leads in the window
    target: float | None  # percent the strategy aims at; None for least loaded or inactive

    @property
    def gap(self) -> float | None:
        if self.share is None or self.target is None:
            return None
        return round(self.share - self.target, 1)


@dataclass(frozen=True)
class TeamFairness:
    team: str
    strategy: str
    total: int
    members: list[FairShare]
    next_up: str
    next_up_why: str
    skipped: tuple[str, ...] = field(default_factory=tuple)


def _initial_counts(span: Span, team_ids: list[int]) -> dict[tuple[int, int], int]:
    """First assignments of kind initial per (team, rep) in the window."""
    counts: Counter[tuple[int, int]] = Counter()
    pieces = [(span.start, span.end)]
    if span.rollup:
        first, last = _inner(span, DAY)
        pieces = _raw_pieces(span, first, last)
        if first < last:
            for team_id, rep_id, n in (
                AssignmentDay.objects.filter(
                    team_key__in=team_ids, day__gte=first.date(), day__lt=last.date()
                )
                .order_by()
                .values_list("team_key", "rep_id")
                .annotate(n=Sum("initial"))
            ):
                counts[team_id, rep_id] += n
    for start, end in pieces:
        for team_id, rep_id, n in (
            Assignment.objects.filter(
                team_id__in=team_ids,
                kind=AssignmentKind.INITIAL,
                assigned_at__gte=start,
                assigned_at__lt=end,
            )
            .order_by()
            .values_list("team_id", "rep_id")
            .annotate(n=Count("pk"))
        ):
            counts[team_id, rep_id] += n
    return {pair: n for pair, n in counts.items() if n}


def fairness(
    *,
    span: Span,
    team_ids: list[int] | None = None,
    initial: dict[tuple[int, int], int] | None = None,
) -> list[TeamFairness]:
    """Each team's members: their share of the team's rotation leads (first assignments made
    through the team) against their weight's share (weighted) or an equal share (round robin),
    and who the team's strategy picks next, as the worker would (routing.versions)."""
    from routing.versions import team_next_up

    teams = list(Team.objects.order_by("name"))
    if team_ids is not None:
        teams = [team for team in teams if team.pk in team_ids]
    wanted = [team.pk for team in teams]
    if initial is None:
        counts = _initial_counts(span, wanted)
    else:  # window_tables' (the same window and scope): every team's
        counts = {pair: n for pair, n in initial.items() if pair[0] in wanted}
    members: dict[int, list[TeamMembership]] = defaultdict(list)
    for membership in (
        TeamMembership.objects.filter(team_id__in=wanted)
        .select_related("rep")
        .order_by("position", "id")
    ):
        members[membership.team_id].append(membership)
    found = []
    for team in teams:
        listed = members.get(team.pk, [])
        total = sum(n for (team_id, _rep), n in counts.items() if team_id == team.pk)
        # The targets are shared among the members who can take leads (active ones): an
        # inactive member has none, and the others' add up to 100 % without them.
        taking = [m for m in listed if m.rep.active]
        weights = sum(m.weight for m in taking) if team.strategy == TeamStrategy.WEIGHTED else 0
        shares = []
        for m in listed:
            leads = counts.get((team.pk, m.rep_id), 0)
            target: float | None = None
            if not m.rep.active:
                pass
            elif team.strategy == TeamStrategy.WEIGHTED:
                target = round(100.0 * m.weight / weights, 1) if weights else None
            elif team.strategy == TeamStrategy.ROUND_ROBIN:
                target = round(100.0 / len(taking), 1)
            shares.append(
                FairShare(
                    rep=m.rep.name,
                    weight=m.weight,
                    active=m.rep.active,
                    leads=leads,
                    share=round(100.0 * leads / total, 1) if total else None,
                    target=target,
                )
            )
        nxt = team_next_up(team=team)
        found.append(
            TeamFairness(
                team=team.name,
                strategy=team.get_strategy_display(),
                total=total,
                members=shares,
                next_up=nxt.rep,
                next_up_why=nxt.why,
                skipped=nxt.skipped,
            )
        )
    return found


# --- The leads of the window ----------------------------------------------------------------


@dataclass(frozen=True)
class Outcomes:
    """The leads received in the window, by where they stand now."""

    received: int
    assigned: int  # assigned, or a duplicate given to the original's owner
    excluded: int
    unassigned: int
    failed: int
    waiting: int  # received or being processed


def outcomes(*, span: Span) -> Outcomes:
    by_status: Counter[str] = Counter()
    pieces = [(span.start, span.end)]
    if span.rollup:
        first, last = _inner(span, rollups.SLOT)
        pieces = _raw_pieces(span, first, last)
        if first < last:
            for measure, n in (
                ReportSlot.objects.filter(
                    measure__startswith="lead:", slot__gte=first, slot__lt=last
                )
                .order_by()
                .values_list("measure")
                .annotate(n=Sum("n"))
            ):
                by_status[measure.removeprefix("lead:")] += n
    for start, end in pieces:
        by_status.update(_status_counts(start, end))
    return _outcomes_of(by_status)


def _status_counts(start: datetime, end: datetime) -> dict[str, int]:
    return dict(
        Lead.objects.filter(received_at__gte=start, received_at__lt=end)
        .order_by()
        .values_list("status")
        .annotate(n=Count("pk"))
    )


def _outcomes_of(by_status: Counter[str]) -> Outcomes:
    return Outcomes(
        received=sum(by_status.values()),
        assigned=by_status.get(LeadStatus.ASSIGNED, 0) + by_status.get(LeadStatus.DUPLICATE, 0),
        excluded=by_status.get(LeadStatus.EXCLUDED, 0),
        unassigned=by_status.get(LeadStatus.UNASSIGNED, 0),
        failed=by_status.get(LeadStatus.FAILED, 0),
        waiting=by_status.get(LeadStatus.RECEIVED, 0) + by_status.get(LeadStatus.PROCESSING, 0),
    )


def sla_breaches_today(*, now: datetime, team_ids: list[int] | None = None) -> int:
    """``sla_breached`` events since the local midnight of the rep who breached (UTC for an
    event without a rep): one query per time zone in use."""
    from routing.loads import local_midnight

    breaches = Event.objects.filter(type=EventType.SLA_BREACHED)
    if team_ids is not None:
        breaches = breaches.filter(team_id__in=team_ids)
    zones = set(Rep.objects.order_by().values_list("timezone", flat=True).distinct())
    total = breaches.filter(
        rep_id__isnull=True, at__gte=local_midnight(now, "UTC"), at__lte=now
    ).count()
    for zone in sorted(zones):
        total += breaches.filter(
            rep_id__in=Rep.objects.filter(timezone=zone).values("pk"),
            at__gte=local_midnight(now, zone or "UTC"),
            at__lte=now,
        ).count()
    return total
