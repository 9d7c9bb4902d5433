"""The dashboard's reports: every count against plain SQL over the same data, percentiles against
a computation of their own, each rep's local day across zones and DST, bad parameters, paging
and the CSV exports."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from audit import reports
from audit.dashboard import dashboard, dashboard_query
from audit.models import EventType
from audit.permissions import sales_managers_group_sync
from audit.services import event_record, event_record_for_assignment
from leads.models import LeadStatus
from routing.loads import load_counts, load_from_row, local_midnight
from routing.models import Assignment, AssignmentKind, Rep, TeamMembership, TeamStrategy
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, RepFactory, TeamFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 20, 15, 7, tzinfo=UTC)


def _sql(query: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return list(cursor.fetchall())


def _span(window: str = "7d") -> reports.Span:
    w = reports.WINDOWS[window]
    return reports.span_of(w, reports.BUCKETS[w.bucket], NOW)


def _assign(rep: Rep, team: Any, *, received: datetime, after: timedelta, **extra: Any) -> Any:
    lead = LeadFactory(status=LeadStatus.ASSIGNED, received_at=received, received_event=False)
    return AssignmentFactory(
        lead=lead,
        rep=rep,
        team=team,
        team_name=team.name if team else "",
        assigned_at=received + after,
        **extra,
    )


def _reassign(old: Assignment, rep: Rep, *, at: datetime, data: dict[str, Any]) -> Assignment:
    Assignment.objects.filter(pk=old.pk).update(active=False)
    new = AssignmentFactory(
        lead=old.lead,
        rep=rep,
        team=old.team,
        team_name=old.team_name,
        kind=AssignmentKind.REASSIGNMENT,
        supersedes=old,
        assigned_at=at,
    )
    event_record_for_assignment(
        type=EventType.REASSIGNED,
        assignment=new,
        at=at,
        data={"from": {"id": old.rep_id, "name": old.rep_name}, **data},
    )
    return new


@pytest.fixture
def company() -> dict[str, Any]:
    """Two teams, four reps, a week of assignments of every kind and state."""
    rr = TeamFactory(name="RR", strategy=TeamStrategy.ROUND_ROBIN)
    weighted = TeamFactory(name="Weighted", strategy=TeamStrategy.WEIGHTED)
    ana, ben, cleo, dan = (
        RepFactory(name=name, timezone=zone)
        for name, zone in (
            ("Ana", "Europe/Berlin"),
            ("Ben", "America/New_York"),
            ("Cleo", "Asia/Tokyo"),
            ("Dan", "UTC"),
        )
    )
    TeamMembership.objects.create(team=rr, rep=ana, position=0)
    TeamMembership.objects.create(team=rr, rep=ben, position=1)
    TeamMembership.objects.create(team=weighted, rep=cleo, position=0, weight=3)
    TeamMembership.objects.create(team=weighted, rep=dan, position=1, weight=1)
    made = []
    for i in range(24):
        rep, team = [(ana, rr), (ben, rr), (cleo, weighted), (cleo, weighted), (dan, weighted)][
            i % 5
        ]
        received = NOW - timedelta(hours=5 * i + 1)
        after = timedelta(seconds=10 + 7 * i)
        due = received + after + timedelta(minutes=60)
        touched = None
        if i % 3 == 0:
            touched = received + after + timedelta(minutes=5 + i)  # within the SLA
        elif i % 3 == 1 and i % 2:
            touched = received + after + timedelta(minutes=90)  # late
        made.append(
            _assign(
                rep,
                team,
                received=received,
                after=after,
                sla_minutes=60,
                sla_due_at=due,
                touched_at=touched,
                kind=AssignmentKind.DUPLICATE if i == 7 else AssignmentKind.INITIAL,
            )
        )
    # Outside every window but 30d/90d: ten days ago.
    old = _assign(ana, rr, received=NOW - timedelta(days=10), after=timedelta(seconds=3))
    _reassign(made[2], dan, at=NOW - timedelta(hours=3), data={"reason": "sla_breached"})
    _reassign(made[4], cleo, at=NOW - timedelta(hours=2), data={"manual": True, "reason": "x"})
    _reassign(made[5], ben, at=NOW - timedelta(hours=1), data={"crm": "hubspot"})
    _reassign(made[6], ana, at=NOW - timedelta(minutes=30), data={"reason": "out of office"})
    _reassign(old, ben, at=NOW - timedelta(days=9), data={"manual": True})
    for status in (LeadStatus.EXCLUDED, LeadStatus.EXCLUDED, LeadStatus.UNASSIGNED):
        LeadFactory(status=status, received_at=NOW - timedelta(hours=2), received_event=False)
    return {"teams": (rr, weighted), "reps": (ana, ben, cleo, dan)}


def _expected_figures(span: reports.Span, column: str) -> dict[Any, dict[str, int]]:
    assert column in ("rep_id", "team_id"), column  # a fixed column name, never input
    rows = _sql(
        f"""SELECT {column},
              COUNT(*),
              SUM(CASE WHEN kind IN ('initial', 'duplicate', 'crm_owner') THEN 1 ELSE 0 END),
              SUM(CASE WHEN kind = 'reassignment' THEN 1 ELSE 0 END),
              SUM(CASE WHEN sla_due_at IS NOT NULL AND touched_at IS NOT NULL
                        AND touched_at <= sla_due_at THEN 1 ELSE 0 END),
              SUM(CASE WHEN sla_due_at IS NOT NULL AND ((touched_at IS NOT NULL
                        AND touched_at > sla_due_at) OR (touched_at IS NULL AND sla_due_at < %s))
                        THEN 1 ELSE 0 END)
            FROM routing_assignment WHERE assigned_at >= %s AND assigned_at < %s
            GROUP BY {column}""",  # noqa: S608
        [span.now, span.start, span.end],
    )
    names = ("assigned", "new", "reassigned_in", "sla_met", "sla_missed")
    return {row[0]: dict(zip(names, map(int, row[1:]), strict=True)) for row in rows}


def _figures_counts(figures: reports.Figures) -> dict[str, int]:
    return {
        name: getattr(figures, name)
        for name in ("assigned", "new", "reassigned_in", "sla_met", "sla_missed")
    }


@pytest.mark.parametrize("window", ["1h", "6h", "24h", "7d", "30d", "90d"])
def test_team_rep_and_total_counts_match_plain_sql(company: dict[str, Any], window: str) -> None:
    span = _span(window)
    by_team = _expected_figures(span, "team_id")
    teams = reports.team_rows(span=span)
    assert [row.name for row in teams] == ["RR", "Weighted"]
    for row in teams:
        assert _figures_counts(row.figures) == by_team.get(row.id, _figures_counts(Figures()))
    by_rep = _expected_figures(span, "rep_id")
    for row in reports.rep_rows(span=span):
        assert _figures_counts(row.figures) == by_rep.get(row.id, _figures_counts(Figures()))
    total = reports.totals(span=span)
    assert total.assigned == sum(v["assigned"] for v in by_rep.values())
    assert total.sla_met == sum(v["sla_met"] for v in by_rep.values())
    # Received in the window, by status, straight from the table.
    received = dict(
        _sql(
            "SELECT status, COUNT(*) FROM leads_lead WHERE received_at >= %s AND received_at < %s"
            " GROUP BY status",
            [span.start, span.end],
        )
    )
    found = reports.outcomes(span=span)
    assert found.received == sum(received.values())
    assert found.excluded == received.get("excluded", 0)
    assert found.unassigned == received.get("unassigned", 0)


Figures = reports.Figures


def test_reassignments_away_are_split_by_why_per_rep_and_team(company: dict[str, Any]) -> None:
    span = _span("24h")
    rows = _sql(
        "SELECT data, team_id FROM audit_event WHERE type = 'reassigned' AND at >= %s AND at < %s",
        [span.start, span.end],
    )
    expected: dict[int, dict[str, int]] = {}
    for data, _team in rows:
        data = json.loads(data) if isinstance(data, str) else data
        why = (
            "away_hand"
            if data.get("manual")
            else "away_crm"
            if "crm" in data
            else "away_sla"
            if data.get("reason") == "sla_breached"
            else "away_other"
        )
        counts = expected.setdefault(data["from"]["id"], {})
        counts[why] = counts.get(why, 0) + 1
    assert len(rows) == 4  # the one nine days ago is outside
    for row in reports.rep_rows(span=span):
        got = {
            k: getattr(row.figures, k)
            for k in ("away_sla", "away_hand", "away_crm", "away_other")
            if getattr(row.figures, k)
        }
        assert got == expected.get(row.id, {}), row.name
    total = reports.totals(span=span)
    assert (total.away_sla, total.away_hand, total.away_crm, total.away_other) == (1, 1, 1, 1)
    teams = {row.name: row.figures for row in reports.team_rows(span=span)}
    assert teams["RR"].away + teams["Weighted"].away == 4


def test_percentiles_match_an_independent_computation(company: dict[str, Any]) -> None:
    span = _span("7d")
    rows = _sql(
        "SELECT a.rep_id, a.kind, a.assigned_at, l.received_at, a.touched_at"
        " FROM routing_assignment a JOIN leads_lead l ON l.id = a.lead_id"
        " WHERE a.assigned_at >= %s AND a.assigned_at < %s",
        [span.start, span.end],
    )

    def moment(value: Any) -> datetime:
        if isinstance(value, str):  # SQLite hands back text
            value = datetime.fromisoformat(value)
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    def pct(values: list[float], p: float) -> float:
        values = sorted(values)
        rank = p * (len(values) - 1)
        low, high = int(rank), min(int(rank) + 1, len(values) - 1)
        return values[low] + (values[high] - values[low]) * (rank - low)

    for row in reports.rep_rows(span=span):
        mine = [r for r in rows if r[0] == row.id]
        to_assign = [
            (moment(r[2]) - moment(r[3])).total_seconds() for r in mine if r[1] != "reassignment"
        ]
        to_touch = [(moment(r[4]) - moment(r[2])).total_seconds() for r in mine if r[4]]
        for got, values, p in (
            (row.figures.tta_p50, to_assign, 0.5),
            (row.figures.tta_p95, to_assign, 0.95),
            (row.figures.ttft_p50, to_touch, 0.5),
            (row.figures.ttft_p95, to_touch, 0.95),
        ):
            if not values:
                assert got is None
            else:
                assert got is not None
                assert got.total_seconds() == pytest.approx(pct(values, p), abs=0.01)


def test_fairness_shares_against_weights_and_the_engines_next_up(company: dict[str, Any]) -> None:
    from routing.versions import team_next_up

    found = {team.team: team for team in reports.fairness(span=_span("7d"))}
    rr, weighted = company["teams"]
    for team, row in ((rr, found["RR"]), (weighted, found["Weighted"])):
        counts = dict(
            _sql(
                "SELECT rep_id, COUNT(*) FROM routing_assignment WHERE team_id = %s"
                " AND kind = 'initial' AND assigned_at >= %s AND assigned_at < %s GROUP BY rep_id",
                [team.pk, _span("7d").start, _span("7d").end],
            )
        )
        assert row.total == sum(counts.values())
        names = {rep.name: rep.pk for rep in company["reps"]}
        for member in row.members:
            assert member.leads == counts.get(names[member.rep], 0)
            assert member.share == pytest.approx(100 * member.leads / row.total, abs=0.05)
        assert row.next_up == team_next_up(team=team).rep
    assert [m.target for m in found["RR"].members] == [50.0, 50.0]
    assert [m.target for m in found["Weighted"].members] == [75.0, 25.0]


# --- Each rep's local day -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "zone"),
    [
        # The spring-forward and fall-back days of Berlin and New York, and zones far apart.
        (datetime(2026, 3, 29, 0, 30, tzinfo=UTC), "Europe/Berlin"),  # 01:30 CET, 23 h day
        (datetime(2026, 3, 29, 1, 30, tzinfo=UTC), "Europe/Berlin"),  # 03:30 CEST
        (datetime(2026, 10, 25, 0, 30, tzinfo=UTC), "Europe/Berlin"),  # 02:30 CEST, 25 h day
        (datetime(2026, 3, 8, 6, 30, tzinfo=UTC), "America/New_York"),  # 01:30 EST
        (datetime(2026, 3, 8, 7, 30, tzinfo=UTC), "America/New_York"),  # 03:30 EDT
        (datetime(2026, 11, 1, 5, 30, tzinfo=UTC), "America/New_York"),  # 01:30 EDT, again EST
        (datetime(2026, 11, 20, 14, 59, tzinfo=UTC), "Asia/Tokyo"),  # 23:59 JST
        (datetime(2026, 11, 20, 15, 0, tzinfo=UTC), "Asia/Tokyo"),  # 00:00 JST
        (datetime(2026, 11, 20, 18, 29, tzinfo=UTC), "Asia/Kolkata"),  # 23:59 IST
        (datetime(2026, 11, 20, 23, 59, tzinfo=UTC), "Pacific/Kiritimati"),  # +14
    ],
)
def test_today_is_the_reps_local_day_as_the_caps_count_it(now: datetime, zone: str) -> None:
    from routing.services import lead_reassign

    rep = RepFactory(name="Zoned", timezone=zone, max_per_day=100)
    other = RepFactory(name="Other", timezone="UTC")
    midnight = local_midnight(now, zone)
    # Assignments through the services, so the load counters the caps read are kept too: just
    # before and at the rep's local midnight, and minutes before now.
    moments = [midnight - timedelta(seconds=1), midnight, now - timedelta(minutes=1)]
    for at in moments:
        lead = LeadFactory(status=LeadStatus.ASSIGNED, received_at=at - timedelta(seconds=5))
        lead_reassign(lead_id=lead.pk, rep_email=rep.email, reason="r", actor="t", now=at)
    lead = LeadFactory(status=LeadStatus.ASSIGNED, received_at=now - timedelta(hours=1))
    lead_reassign(lead_id=lead.pk, rep_email=other.email, reason="r", actor="t", now=now)
    expected_today = sum(1 for at in moments if at >= midnight)
    row = Rep.objects.values("id", "timezone", "load__open_count", "load__timezone",
                             "load__day_start", "load__day_count", "load__prev_start",
                             "load__prev_count").get(pk=rep.pk)  # fmt: skip
    _open, caps_today = load_counts(rep.pk, zone, load_from_row(row), now)
    span = reports.span_of(reports.WINDOWS["24h"], reports.BUCKETS["15m"], now)
    rows = {r.name: r for r in reports.rep_rows(span=span)}
    assert rows["Zoned"].today == caps_today == expected_today >= 1
    assert rows["Other"].today == 1
    d = dashboard(query=dashboard_query({"window": "24h"}), now=now)
    assert {load.name: load.today for load in d.reps}["Zoned"] == expected_today
    # SLA breaches today: by the breaching rep's own midnight.
    assignment = Assignment.objects.filter(rep=rep).order_by("assigned_at").first()
    assert assignment is not None
    for at in (midnight - timedelta(seconds=1), midnight):
        event_record(type=EventType.SLA_BREACHED, lead_id=assignment.lead_id, at=at, rep_id=rep.pk)
    assert reports.sla_breaches_today(now=now) == 1


# --- Parameters -----------------------------------------------------------------------------


def _client(client: Client) -> Client:
    user = User.objects.create_user("mia", password="pw-mia-123")
    user.groups.add(sales_managers_group_sync())
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    "query",
    [
        "window=2y",
        "window=%00",
        "window=1h%20OR%201=1",
        "bucket=7s",
        "bucket=-1d",
        "bucket=%00",
        "window=90d%00",
        "window=90d&bucket=1d%27",
        "sort=-",
        "sort=password",
        "sort=--name",
        "page=abc",
        "page=-1",
        "page=1e9",
        "page=9999999999999999999999",
        "page=%C2%B2",  # "²": str.isdigit says yes, int() says no
        "page=1%E2%81%B0",  # "1⁰"
    ],
)
@pytest.mark.parametrize("path", ["/dashboard/", "/dashboard/reps.csv"])
def test_a_crafted_parameter_is_a_json_400(client: Client, query: str, path: str) -> None:
    response = _client(client).get(f"{path}?{query}")
    assert response.status_code == 400
    body = response.json()
    assert body["error"]["code"] == "invalid_parameter"
    assert body["error"]["message"].split(":")[0] in query


@pytest.mark.parametrize(
    ("query", "window", "bucket"),
    [
        ("", "6h", "5m"),
        ("hours=1", "1h", "1m"),
        ("hours=abc", "6h", "5m"),
        ("hours=100000", "24h", "15m"),
        ("window=90d&bucket=1m", "90d", "6h"),  # 129,600 bars: clamped to at most 360
        ("window=1h&bucket=1d", "1h", "1m"),  # coarser than the window: its default
        ("window=7d&bucket=15m", "7d", "1h"),
        ("window=30d&bucket=1h", "30d", "6h"),  # 720 bars: clamped
        ("window=30d&bucket=5m", "30d", "6h"),
    ],
)
def test_too_fine_or_coarse_buckets_are_clamped(
    client: Client, query: str, window: str, bucket: str
) -> None:
    response = _client(client).get(f"/dashboard/?{query}")
    assert response.status_code == 200
    d = response.context["d"]
    assert (d.window.key, d.bucket) == (window, bucket)
    assert d.span.bars <= reports.MAX_CHART_BARS


def test_every_rep_is_listed_on_pages_and_a_page_past_the_end_is_the_last(client: Client) -> None:
    for i in range(reports.REP_PAGE_SIZE * 2 + 7):
        RepFactory(name=f"Rep {i:03d}")
    c = _client(client)
    seen = []
    for page in (1, 2, 3):
        rows = c.get(f"/dashboard/?sort=name&page={page}").context["d"].rep_page.rows
        seen += [row.name for row in rows]
    assert seen == sorted(Rep.objects.values_list("name", flat=True))
    last = c.get("/dashboard/?sort=name&page=400").context["d"].rep_page
    assert (last.number, last.pages, len(last.rows)) == (3, 3, 7)


# --- CSV ------------------------------------------------------------------------------------


def test_exports_are_formula_safe_and_match_the_tables(client: Client) -> None:
    team = TeamFactory(name="=cmd|'/c calc'!A0", strategy=TeamStrategy.WEIGHTED)
    evil = RepFactory(name="@SUM(1+1)*cmd", email="evil@example.com")
    fine = RepFactory(name="Fine")
    TeamMembership.objects.create(team=team, rep=evil, position=0, weight=1)
    TeamMembership.objects.create(team=team, rep=fine, position=1, weight=3)
    now = datetime.now(UTC)
    for _ in range(3):
        _assign(evil, team, received=now - timedelta(hours=1), after=timedelta(seconds=5))
    c = _client(client)
    reps_csv = list(csv.reader(io.StringIO(c.get("/dashboard/reps.csv?window=24h").text)))
    names = [row[0] for row in reps_csv[1:]]
    assert "'@SUM(1+1)*cmd" in names
    assert not any(cell.startswith(("=", "+", "-", "@")) for row in reps_csv for cell in row)
    evil_row = reps_csv[1 + names.index("'@SUM(1+1)*cmd")]
    assert evil_row[reps_csv[0].index("assigned")] == "3"
    teams_csv = list(csv.reader(io.StringIO(c.get("/dashboard/teams.csv?window=24h").text)))
    assert teams_csv[1][0] == "'=cmd|'/c calc'!A0"
    fair = c.get("/dashboard/fairness.csv?window=24h")
    assert fair["Content-Disposition"].startswith('attachment; filename="fairness-24h-')
    rows = list(csv.reader(io.StringIO(fair.text)))
    gaps = {row[2]: row[rows[0].index("gap")] for row in rows[1:]}
    # Evil took all 3 leads against a 25 % target, Fine none of its 75 %: the gap stays a number.
    assert gaps == {"'@SUM(1+1)*cmd": "75.0", "Fine": "-75.0"}
    assert c.get("/dashboard/other.csv").status_code == 404


# --- Only my teams --------------------------------------------------------------------------


@pytest.mark.parametrize("window", ["1h", "24h", "90d"])
def test_a_scoped_manager_sees_only_their_teams_and_members_in_tables_and_exports(
    client: Client, settings: Any, window: str
) -> None:
    settings.HISTORY_SCOPE_TO_MANAGED_TEAMS = True
    c = _client(client)
    mia = User.objects.get(username="mia")
    mine = TeamFactory(name="Alpha", strategy=TeamStrategy.WEIGHTED, manager=mia)
    theirs = TeamFactory(name="Bravo Hidden Team", strategy=TeamStrategy.WEIGHTED)
    own, shared = RepFactory(name="Ana Own"), RepFactory(name="Sam Shared")
    hidden = RepFactory(name="Bravo Hidden Rep", email="bravo-hidden@x.example")
    TeamMembership.objects.create(team=mine, rep=own, position=0, weight=1)
    TeamMembership.objects.create(team=mine, rep=shared, position=1, weight=1)
    TeamMembership.objects.create(team=theirs, rep=shared, position=0)
    TeamMembership.objects.create(team=theirs, rep=hidden, position=1)
    now = datetime.now(UTC)
    _assign(own, mine, received=now - timedelta(minutes=20), after=timedelta(seconds=5))
    for rep in (shared, hidden, hidden):
        _assign(rep, theirs, received=now - timedelta(minutes=20), after=timedelta(seconds=5))

    page = c.get(f"/dashboard/?window={window}")
    assert page.status_code == 200
    d = page.context["d"]
    assert [row.name for row in d.teams] == ["Alpha"]
    assert sorted(row.name for row in d.rep_page.rows) == ["Ana Own", "Sam Shared"]
    assert {row.name: row.figures.assigned for row in d.rep_page.rows} == {
        "Ana Own": 1,
        "Sam Shared": 0,  # their Bravo lead is not Alpha's
    }
    assert d.totals.assigned == 1
    [alpha] = d.fairness
    assert [(m.rep, m.target) for m in alpha.members] == [("Ana Own", 50.0), ("Sam Shared", 50.0)]
    assert b"Bravo Hidden" not in page.content
    for table in ("teams", "reps", "fairness"):
        export = c.get(f"/dashboard/{table}.csv?window={window}")
        assert export.status_code == 200
        assert "Bravo Hidden" not in export.text, table
        assert "bravo-hidden@" not in export.text, table


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "—"),
        (timedelta(seconds=-0.3), "0.0 s"),
        (timedelta(hours=-2), "0.0 s"),
        (timedelta(seconds=3.25), "3.2 s"),
        (timedelta(seconds=42), "42 s"),
        (timedelta(minutes=4, seconds=5), "4 min 5 s"),
        (timedelta(hours=2, minutes=10), "2 h 10 min"),
        (timedelta(days=3, hours=4), "3 d 4 h"),
    ],
)
def test_durations_read_as_people_read_them_and_never_negative(
    value: timedelta | None, text: str
) -> None:
    from audit.templatetags.report_format import duration

    assert duration(value) == text


def test_the_rep_export_link_keeps_the_tables_sort(client: Client) -> None:
    for name, opened in (("Ann", 0), ("Bob", 2), ("Cid", 1)):
        rep = RepFactory(name=name)
        for _ in range(opened):
            _assign(rep, None, received=datetime.now(UTC), after=timedelta(seconds=1))
    c = _client(client)
    page = c.get("/dashboard/?window=24h&sort=name&page=1&bucket=1h")
    link = page.context["export_urls"]["reps"]
    assert "page=" not in link, link
    assert "bucket=" not in link, link
    exported = list(csv.reader(io.StringIO(c.get(link).text)))
    shown = [row.name for row in page.context["d"].rep_page.rows]
    assert [row[0] for row in exported[1:]] == shown == ["Ann", "Bob", "Cid"]


def test_fairness_targets_are_shared_among_the_members_who_can_take_leads(
    company: dict[str, Any],
) -> None:
    """An inactive member takes no rotation leads: their target is none, and the others'
    targets add up to 100 % without them (a bug showed 50/50 with one of two deactivated)."""
    _ana, ben, _cleo, dan = company["reps"]
    Rep.objects.filter(pk__in=[ben.pk, dan.pk]).update(active=False)
    found = {team.team: team for team in reports.fairness(span=_span("7d"))}
    rr = {m.rep: m for m in found["RR"].members}
    assert (rr["Ana"].target, rr["Ben"].target) == (100.0, None)
    assert rr["Ben"].gap is None
    weighted = {m.rep: m for m in found["Weighted"].members}
    assert (weighted["Cleo"].target, weighted["Dan"].target) == (100.0, None)
    # Their leads of the window still count in the team's total and their own share.
    assert rr["Ben"].leads > 0
    assert rr["Ben"].share is not None


def test_open_now_is_the_reps_open_counter_and_equals_their_open_assignments() -> None:
    """ "Open now" reads the load counters the services keep (routing.loads), not a count of
    every open assignment: routed, touched and reassigned through the services, it equals
    plain SQL over the assignments, in a short window (raw rows) and a long one (rollups)."""
    from routing import decisions
    from routing.services import assignment_touch, lead_reassign
    from tests.leads.factories import SourceFactory
    from tests.routing.factories import make_rep, published_ruleset, team_with

    decisions.clear_live_config_cache()
    ana = make_rep(email="ana@x.example", timezone="Europe/Berlin")
    ben = make_rep(email="ben@x.example", timezone="Asia/Tokyo")
    team = team_with([ana, ben])
    published_ruleset({"name": "All", "action": {"type": "team", "team": team.name}})
    source = SourceFactory(slug="open-now")
    routed = []
    for i in range(7):
        lead = LeadFactory(source=source, status=LeadStatus.PROCESSING, email=f"p{i}@c.example")
        result = decisions.route_lead(lead=lead)
        assert result.assignment is not None
        routed.append(result.assignment)
    assignment_touch(lead_id=routed[0].lead_id, actor="test")
    assignment_touch(lead_id=routed[1].lead_id, actor="test")
    lead_reassign(lead_id=routed[2].lead_id, rep_email=ben.email, reason="cover", actor="test")
    lead_reassign(lead_id=routed[3].lead_id, rep_email=ana.email, reason="cover", actor="test")
    expected = dict(
        _sql(
            "SELECT rep_id, COUNT(*) FROM routing_assignment"
            " WHERE active AND touched_at IS NULL GROUP BY rep_id",
            [],
        )
    )
    assert sum(expected.values()) == 5
    now = datetime.now(UTC)
    for window in ("24h", "90d"):
        w = reports.WINDOWS[window]
        span = reports.span_of(w, reports.BUCKETS[w.bucket], now)
        rows = {row.id: row.open for row in reports.rep_rows(span=span)}
        assert rows == {ana.pk: expected.get(ana.pk, 0), ben.pk: expected.get(ben.pk, 0)}
    decisions.clear_live_config_cache()


def test_a_long_window_reads_the_day_rollup_once_per_page(company: dict[str, Any]) -> None:
    """The totals, team and rep tables come from one read of the day rollup (they read it
    three times, a third of a second each on a million leads) and one of the reassignments."""
    from django.test.utils import CaptureQueriesContext

    for window in ("30d", "90d"):
        with CaptureQueriesContext(connection) as captured:
            dashboard(query=dashboard_query({"window": window}), now=NOW)
        sql = [q["sql"] for q in captured.captured_queries]
        assert sum("audit_assignmentday" in s for s in sql) == 1, window
        assert sum("audit_reportslot" in s for s in sql) == 1, window
        assert sum("'reassigned'" in s or '"reassigned"' in s for s in sql) <= 1, window
        # Open now: no count over the open assignments.
        assert not [
            s
            for s in sql
            if "routing_assignment" in s
            and 'touched_at" IS NULL' in s
            and "GROUP BY" in s
            and "sla_due_at" not in s
        ], window


@pytest.mark.parametrize("window", ["1h", "24h", "7d"])
def test_one_grouping_sets_query_equals_a_query_per_team_rep_and_total(
    company: dict[str, Any], window: str
) -> None:
    """PostgreSQL reads a short window's team, rep and total figures in one query (GROUPING
    SETS, the assignments joined to their leads once): the same counts and percentile_cont
    figures as one grouped query each (the path SQLite keeps)."""
    span = _span(window)
    for scope in (None, [company["teams"][0].pk], []):
        found = reports._window_figures(span, scope)
        assignments = reports._window_assignments(span, scope)
        assert found.teams == reports._assignment_figures(assignments, "team_id", span.now)
        assert found.reps == reports._assignment_figures(assignments, "rep_id", span.now)
        total = reports._assignment_figures(assignments, None, span.now).get(None)
        assert found.total == (total or reports.Figures()), scope
