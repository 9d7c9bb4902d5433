"""The dashboard: the live tiles (backlog, stuck leads, alerts) and the window's reports.

Nothing here loops over leads: charts come from grouped counts per minute or hour
(audit.reports.bucket_counts) or the slot rollup, the tables from GROUP BY queries over the
window's assignments or the day rollup, read once for the totals, teams and reps
(audit.reports.window_tables); "open now" from each rep's load counters, "today" from each
rep's local midnight.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min
from django.utils import timezone

from audit import reports
from audit.csv import fairness_table_lines, rep_table_lines, team_table_lines
from audit.reports import BucketChart, Figures, Outcomes, RepPage, Span, TeamFairness, TeamRow
from audit.timezones import local_words
from leads.models import Lead, LeadStatus

ROUTED_EVENTS = reports.ROUTED_EVENTS


def dashboard_alerts() -> list[str]:
    """Open alerts, newest first, as the lines the dashboard shows."""
    from routing.monitoring.models import Alert, AlertStatus

    return [
        f"{alert.get_kind_display()}: {alert.message} "
        f"(open since {local_words(alert.opened_at, seconds=False)})"
        for alert in Alert.objects.filter(status=AlertStatus.OPEN).order_by("-opened_at")[:20]
    ]


def _pct(value: int, scale: int) -> float:
    return round(min(100.0, 100.0 * value / scale), 1) if scale else 0.0


@dataclass(frozen=True)
class RepLoad:
    """A rep's bar on the load chart: open and today's leads against their caps."""

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


def rep_loads(rows: list[reports.RepRow]) -> list[RepLoad]:
    """The load bars of ``rows`` (a page of the rep table)."""
    busiest_open = max((row.open for row in rows), default=0)
    busiest_today = max((row.today for row in rows), default=0)
    return [
        RepLoad(
            name=row.name,
            open=row.open,
            max_open=row.max_open,
            today=row.today,
            max_per_day=row.max_per_day,
            open_pct=_pct(row.open, row.max_open or busiest_open),
            today_pct=_pct(row.today, row.max_per_day or busiest_today),
            open_label=row.open_label,
            today_label=row.today_label,
            over=row.over,
        )
        for row in rows
    ]


@dataclass(frozen=True)
class Dashboard:
    now: datetime
    window: reports.Window
    bucket: str
    span: Span
    backlog: int
    backlog_oldest_age: timedelta | None
    intake: BucketChart
    routed: BucketChart
    p50: timedelta | None
    p95: timedelta | None
    assigned_in_window: int
    sla_breaches_today: int
    unassigned: int
    failed: int
    alerts: list[Any]
    outcomes: Outcomes
    totals: Figures
    teams: list[TeamRow]
    rep_page: RepPage
    reps: list[RepLoad]
    fairness: list[TeamFairness]


@dataclass(frozen=True)
class DashboardQuery:
    """The dashboard's parameters, checked (``dashboard_query`` raises ReportError)."""

    window: reports.Window
    bucket: str
    sort: str
    descending: bool
    page: int


def dashboard_query(data: Any) -> DashboardQuery:
    """``?window=``, ``?bucket=``, ``?sort=``, ``?page=`` (and the older ``?hours=``)."""
    window = reports.window_parse(data.get("window"), hours=data.get("hours"))
    bucket, _ = reports.bucket_parse(data.get("bucket"), window)
    sort, descending = reports.rep_sort_parse(data.get("sort"))
    return DashboardQuery(window, bucket, sort, descending, reports.page_parse(data.get("page")))


def dashboard(
    *,
    query: DashboardQuery | None = None,
    now: datetime | None = None,
    team_ids: list[int] | None = None,
) -> Dashboard:
    """The dashboard's numbers, charts and tables over the query's window.

    ``team_ids`` (a manager scoped to their teams): tables of their teams and members only,
    and no operational alerts (those are about the whole system, for operators and RevOps).
    """
    query = query or dashboard_query({})
    now = now or timezone.now()
    bucket_name, bucket = reports.bucket_parse(query.bucket, query.window)
    span = reports.span_of(query.window, bucket, now)

    # COUNT(*), not of the id: counted from the status indexes alone (an index-only scan),
    # not by reading every unassigned lead's row.
    backlog = Lead.objects.filter(status=LeadStatus.RECEIVED).aggregate(
        n=Count("*"), oldest=Min("queued_at")
    )
    stuck = dict(
        Lead.objects.filter(status__in=(LeadStatus.UNASSIGNED, LeadStatus.FAILED))
        .order_by()
        .values_list("status")
        .annotate(n=Count("*"))
    )
    counts = reports.window_counts(span)
    intake, routed = counts.intake, counts.routed
    tables = reports.window_tables(span=span, team_ids=team_ids)
    totals = tables.totals
    rows = reports.rep_rows_sorted(tables.reps, query.sort, query.descending)
    page = reports.rep_page(rows, query.page)
    oldest = backlog["oldest"]
    per = reports.bucket_words(bucket)
    return Dashboard(
        now=now,
        window=query.window,
        bucket=bucket_name,
        span=span,
        backlog=backlog["n"],
        backlog_oldest_age=now - oldest if oldest else None,
        intake=reports.bucket_chart(f"Leads received per {per}", intake, span),
        routed=reports.bucket_chart(f"Leads routed per {per}", routed, span),
        p50=totals.tta_p50,
        p95=totals.tta_p95,
        assigned_in_window=totals.new,
        sla_breaches_today=reports.sla_breaches_today(now=now, team_ids=team_ids),
        unassigned=stuck.get(LeadStatus.UNASSIGNED, 0),
        failed=stuck.get(LeadStatus.FAILED, 0),
        alerts=dashboard_alerts() if team_ids is None else [],
        outcomes=counts.outcomes,
        totals=totals,
        teams=tables.teams,
        rep_page=page,
        reps=rep_loads(page.rows),
        fairness=reports.fairness(span=span, team_ids=team_ids, initial=tables.initial),
    )


EXPORT_TABLES = ("teams", "reps", "fairness")


def dashboard_table_lines(
    *, table: str, query: DashboardQuery, team_ids: list[int] | None = None
) -> Iterator[str]:
    """The CSV of one of the dashboard's tables over the query's window (every rep, not a
    page, in the page's order)."""
    now = timezone.now()
    _, bucket = reports.bucket_parse(query.bucket, query.window)
    span = reports.span_of(query.window, bucket, now)
    if table == "teams":
        return team_table_lines(reports.team_rows(span=span, team_ids=team_ids))
    if table == "reps":
        rows = reports.rep_rows(span=span, team_ids=team_ids)
        return rep_table_lines(reports.rep_rows_sorted(rows, query.sort, query.descending))
    if table == "fairness":
        return fairness_table_lines(reports.fairness(span=span, team_ids=team_ids))
    raise ValueError(f"no table {table!r}")
