"""The reps' load counters (routing.loads): kept by every write path, read by decisions at a
cost that does not grow with open leads, reconciled when something wrote around them."""

from __future__ import annotations

import io
import logging
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from leads.models import Lead, LeadStatus
from routing import decisions
from routing.crm.touches import assignment_touch_from_crm, crm_owner_changed
from routing.loads import (
    Load,
    load_today,
    local_midnight,
    rep_load_drift_totals,
    rep_loads_reconcile,
)
from routing.models import Assignment, Rep, RepLoad, RuleSet
from routing.monitoring.metrics import COLLECTOR
from routing.services import (
    assignment_touch,
    lead_process,
    lead_reassign,
    rep_reroute_open_leads,
)
from routing.versions import reps_deactivate
from tests.leads.factories import LeadFactory, SourceFactory
from tests.routing.factories import make_rep, published_ruleset, team_with
from tests.routing.loads_truth import counted, stored


@pytest.fixture(autouse=True)
def _fresh_cache() -> Any:
    decisions.clear_live_config_cache()
    yield
    decisions.clear_live_config_cache()


def _lead(email: str, **fields: Any) -> Lead:
    lead = cast(
        Lead,
        LeadFactory(
            source=SourceFactory(slug=f"s-{email}"),
            status=LeadStatus.PROCESSING,
            email=email,
            email_domain=email.rpartition("@")[2],
            **fields,
        ),
    )
    return Lead.objects.select_related("source").get(pk=lead.pk)


def _route(email: str, now: datetime | None = None) -> decisions.RouteResult:
    return decisions.route_lead(lead=_lead(email), now=now)


def _agree(now: datetime | None = None) -> None:
    now = now or timezone.now()
    assert stored(now) == counted(now)


# --- Reading: midnight, a clock behind it, time zones (no database) -------------------------


def test_today_is_the_day_since_the_reps_local_midnight() -> None:
    now = datetime(2026, 3, 10, 22, 30, tzinfo=UTC)  # 11:30 next day in Auckland
    berlin = local_midnight(now, "Europe/Berlin")
    load = Load(open_count=2, timezone="Europe/Berlin", day_start=berlin, day_count=3)
    assert load_today(load, "Europe/Berlin", now) == 3
    # Past the rep's midnight: 0, with nothing written at midnight.
    assert load_today(load, "Europe/Berlin", now + timedelta(hours=2)) == 0
    # No row: the rep was never given a lead.
    assert load_today(Load(), "Europe/Berlin", now) == 0
    # Kept in another zone than the rep's: not trusted (counted instead).
    assert load_today(load, "Pacific/Auckland", now) is None


def test_a_clock_behind_a_rolled_midnight_still_reads_its_own_day() -> None:
    day = datetime(2026, 3, 11, tzinfo=UTC)
    load = Load(
        timezone="UTC",
        day_start=day,
        day_count=1,
        prev_start=day - timedelta(days=1),
        prev_count=10,
    )
    # A worker whose `now` is a moment before midnight counts yesterday's 10 and the 1 made
    # after it by a worker already past midnight, as a count of assigned_at >= midnight would.
    assert load_today(load, "UTC", day - timedelta(milliseconds=5)) == 11
    assert load_today(load, "UTC", day + timedelta(hours=1)) == 1


# --- Every write path keeps them -------------------------------------------------------------


@pytest.mark.django_db
def test_assignment_touch_and_manual_reassignment_keep_the_counters() -> None:
    ana, ben = (
        make_rep(email="ana@x.example"),
        make_rep(email="ben@x.example", timezone="Asia/Tokyo"),
    )
    team = team_with([ana, ben])
    published_ruleset({"name": "All", "action": {"type": "team", "team": team.name}})
    results = [_route(f"p{i}@corp.example") for i in range(4)]
    _agree()
    assert stored(timezone.now())[ana.pk] == (2, 2)

    first = results[0].assignment
    assert first is not None
    assignment_touch(lead_id=first.lead_id, actor="test")
    assignment_touch(lead_id=first.lead_id, actor="test")  # idempotent: counted once
    _agree()
    assert stored(timezone.now())[ana.pk] == (1, 2)

    # A touched lead moved: its previous owner's open count stays (it was no longer open);
    # the new owner holds a new, untouched assignment.
    lead_reassign(lead_id=first.lead_id, rep_email=ben.email, reason="cover", actor="test")
    _agree()
    second = results[2].assignment
    assert second is not None
    lead_reassign(lead_id=second.lead_id, rep_email=ben.email, reason="cover", actor="test")
    _agree()
    assert stored(timezone.now())[ana.pk] == (0, 2)
    assert stored(timezone.now())[ben.pk] == (4, 4)


@pytest.mark.django_db
def test_crm_touch_and_crm_owner_change_keep_the_counters() -> None:
    ana = make_rep(email="ana@x.example")
    published_ruleset({"name": "Ana", "action": {"type": "rep", "rep": ana.email}})
    first = _route("a@corp.example").assignment
    second = _route("b@corp.example").assignment
    assert first is not None
    assert second is not None
    assert assignment_touch_from_crm(assignment_id=first.pk, kind="hubspot", at=timezone.now())
    assert not assignment_touch_from_crm(assignment_id=first.pk, kind="hubspot", at=timezone.now())
    assignment_touch(lead_id=first.lead_id, actor="test")  # already touched: nothing moves
    _agree()
    # An owner who is no rep: the assignment's clock stops (touched), its open count goes.
    outcome = crm_owner_changed(
        lead_id=second.lead_id,
        kind="hubspot",
        owner_id="999",
        changed_at=timezone.now(),
        assignment_id=second.pk,
    )
    assert outcome == "noted"
    _agree()
    assert stored(timezone.now())[ana.pk] == (0, 2)


@pytest.mark.django_db
def test_pipeline_sticky_duplicates_and_release_of_an_absent_rep_keep_the_counters() -> None:
    ana, ben = make_rep(email="ana@x.example"), make_rep(email="ben@x.example")
    team = team_with([ana, ben])
    published_ruleset({"name": "All", "action": {"type": "team", "team": team.name}})
    for email in ("a@corp.example", "b@corp.example", "a@corp.example", "c@corp.example"):
        lead = LeadFactory(raw_payload={"email": email})
        assert lead_process(lead_id=lead.pk) in (LeadStatus.ASSIGNED, LeadStatus.DUPLICATE)
    _agree()
    assert sum(open_count for open_count, _ in stored(timezone.now()).values()) == 4

    reps_deactivate(reps=[ana])
    report = rep_reroute_open_leads(rep_id=ana.pk, actor="test", reason="left")
    assert report.moved >= 1
    _agree()
    assert stored(timezone.now())[ana.pk][0] == 0


@pytest.mark.django_db
def test_counters_roll_at_each_reps_own_midnight() -> None:
    tokyo = make_rep(email="tokyo@x.example", timezone="Asia/Tokyo", max_per_day=2)
    published_ruleset({"name": "Tokyo", "action": {"type": "rep", "rep": tokyo.email}})
    evening = datetime(2026, 5, 4, 14, 0, tzinfo=UTC)  # 23:00 in Tokyo
    assert _route("a@corp.example", evening).assignment is not None
    assert _route("b@corp.example", evening).assignment is not None
    assert _route("c@corp.example", evening).assignment is None  # at max_per_day
    _agree(evening)
    # 00:30 in Tokyo (still the 4th in UTC): a new day for this rep.
    after = evening + timedelta(minutes=90)
    _agree(after)
    assert stored(after)[tokyo.pk] == (2, 0)
    assert _route("d@corp.example", after).assignment is not None
    _agree(after)
    assert stored(after)[tokyo.pk] == (3, 1)


@pytest.mark.django_db
def test_a_time_zone_change_is_read_right_at_once_and_recounted_at_the_next_assignment() -> None:
    rep = make_rep(email="r@x.example", timezone="UTC", max_per_day=2)
    published_ruleset({"name": "R", "action": {"type": "rep", "rep": rep.email}})
    morning = datetime(2026, 5, 4, 1, 0, tzinfo=UTC)
    _route("a@corp.example", morning - timedelta(minutes=150))  # 22:30 yesterday in UTC
    _route("b@corp.example", morning)
    assert stored(morning)[rep.pk] == (2, 1)
    # In Los Angeles it is still the 3rd: both leads are today's, so the cap is reached.
    Rep.objects.filter(pk=rep.pk).update(timezone="America/Los_Angeles")
    decisions.clear_live_config_cache()
    assert stored(morning)[rep.pk] == (2, None)  # the row was kept in UTC: not trusted
    assert _route("c@corp.example", morning).assignment is None
    # In Lagos (UTC+1) the day began at 23:00 UTC: one lead today.
    Rep.objects.filter(pk=rep.pk).update(timezone="Africa/Lagos")
    decisions.clear_live_config_cache()
    assert _route("d@corp.example", morning).assignment is not None
    assert stored(morning)[rep.pk] == (3, 2)  # recounted under the rep's lock, in Lagos time
    _agree(morning)


# --- Reconciliation ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_reconciliation_repairs_drift_logs_it_and_counts_it_in_metrics(
    caplog: pytest.LogCaptureFixture, client: Any
) -> None:
    ana, ben = make_rep(email="ana@x.example"), make_rep(email="ben@x.example")
    team = team_with([ana, ben])
    published_ruleset({"name": "All", "action": {"type": "team", "team": team.name}})
    for i in range(4):
        _route(f"p{i}@corp.example")
    clean = rep_loads_reconcile()
    assert (clean.reps, clean.suspects, clean.repaired) == (2, 0, 0)

    # Writes around the services: a touch by SQL, a counter row edited, one deleted.
    Assignment.objects.filter(pk=Assignment.objects.filter(rep=ana).order_by("id")[0].pk).update(
        touched_at=timezone.now()
    )
    RepLoad.objects.filter(rep=ben).update(day_count=7)
    assert stored(timezone.now()) != counted(timezone.now())
    with caplog.at_level(logging.WARNING, logger="routing.loads"):
        report = rep_loads_reconcile()
    assert (report.suspects, report.repaired, report.drift_open, report.drift_today) == (
        2,
        2,
        1,
        5,
    )
    _agree()
    assert f"rep {ana.pk}: load counters drifted" in caplog.text
    assert rep_load_drift_totals() == {"open": 1, "today": 5}
    COLLECTOR.clear()
    text = client.get("/metrics").content.decode()
    assert 'leadrouter_rep_load_drift_total{counter="open"} 1.0' in text
    assert 'leadrouter_rep_load_drift_total{counter="today"} 5.0' in text

    RepLoad.objects.filter(rep=ana).delete()
    out = io.StringIO()
    call_command("reconcile_rep_loads", stdout=out)  # what beat's task runs, by hand
    assert "2 rep(s) checked, 1 recounted, 1 repaired (open drift 1," in out.getvalue()
    _agree()
    # The missing row's drift: ana's 1 open lead and 2 of today (the deleted row took the
    # drift it had added up with it).
    assert rep_load_drift_totals() == {"open": 1, "today": 5 + 2}
    assert rep_loads_reconcile().suspects == 0


# --- A decision's queries do not grow with open leads or capped reps -------------------------


def _capped_company(reps: int, open_per_rep: int, strategy: str) -> None:
    members = [make_rep(max_open=open_per_rep + 1000, max_per_day=5000) for _ in range(reps)]
    team = team_with(members, strategy=strategy)
    published_ruleset({"name": "All", "action": {"type": "team", "team": team.name}})
    for i in range(reps * open_per_rep):
        _route(f"seed{i}@corp.example")


def _decision_queries(email: str) -> int:
    lead = _lead(email)
    with CaptureQueriesContext(connection) as captured:
        result = decisions.route_lead(lead=lead)
    assert result.status == LeadStatus.ASSIGNED
    return len(captured.captured_queries)


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", ["round_robin", "least_loaded"])
def test_a_decisions_queries_do_not_grow_with_open_leads_or_capped_reps(strategy: str) -> None:
    _capped_company(reps=3, open_per_rep=1, strategy=strategy)
    small = _decision_queries("small@corp.example")
    RuleSet.objects.update(status="archived")  # another company, ten times the reps
    _capped_company(reps=30, open_per_rep=10, strategy=strategy)
    assert Assignment.objects.filter(active=True, touched_at__isnull=True).count() == 304
    large = _decision_queries("large@corp.example")
    assert large == small, (small, large)
    _agree()


@pytest.mark.django_db
def test_a_worker_whose_clock_is_behind_midnight_counts_its_own_day() -> None:
    rep = make_rep(email="r@x.example", timezone="Asia/Kathmandu", max_per_day=4)
    published_ruleset({"name": "R", "action": {"type": "rep", "rep": rep.email}})
    midnight = local_midnight(datetime(2026, 6, 1, 12, tzinfo=UTC), "Asia/Kathmandu")
    _route("a@corp.example", midnight - timedelta(hours=1))
    _route("b@corp.example", midnight + timedelta(seconds=2))  # rolls the row to the new day
    # A worker that read its clock 3 s before midnight, then waited for the lock.
    _route("c@corp.example", midnight - timedelta(seconds=3))
    _route("d@corp.example", midnight - timedelta(seconds=1))
    _agree(midnight - timedelta(seconds=1))  # yesterday: a, c, d and b (after it) count
    assert stored(midnight - timedelta(seconds=1))[rep.pk] == (4, 4)
    _agree(midnight + timedelta(seconds=5))
    assert stored(midnight + timedelta(seconds=5))[rep.pk] == (4, 1)
    # Yesterday's cap (4) is reached, counting b, made after midnight by a faster clock, as a
    # count of assigned_at >= midnight would; today's day has b only.
    assert _route("e@corp.example", midnight - timedelta(seconds=1)).assignment is None
    assert _route("f@corp.example", midnight + timedelta(seconds=6)).assignment is not None
    _agree(midnight + timedelta(seconds=6))


@pytest.mark.django_db
def test_a_worker_behind_midnight_on_a_day_the_rep_had_nothing_yet() -> None:
    rep = make_rep(email="r@x.example", timezone="UTC")
    published_ruleset({"name": "R", "action": {"type": "rep", "rep": rep.email}})
    midnight = datetime(2026, 6, 2, tzinfo=UTC)
    _route("a@corp.example", midnight - timedelta(days=3))
    _route("b@corp.example", midnight + timedelta(seconds=1))
    _route("c@corp.example", midnight - timedelta(seconds=2))  # the day before had none
    for at in (midnight - timedelta(seconds=1), midnight + timedelta(seconds=2)):
        _agree(at)


# --- PostgreSQL: concurrent routing, touches and reassignments -------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_routing_touches_and_reassignments_keep_the_counters_exact() -> None:
    """8 threads: each routes leads to capped reps, touches some, and reassigns some to
    another rep (the two reps' counter rows locked in id order): no deadlock, no cap passed,
    and the counters equal the counts at the end."""
    import random
    import threading

    reps = [make_rep(email=f"c{i}@x.example", max_open=6) for i in range(4)]
    team = team_with(reps, strategy="least_loaded")
    published_ruleset({"name": "All", "action": {"type": "team", "team": team.name}})
    source = SourceFactory(slug="webform")
    ids = [
        cast(
            Lead,
            LeadFactory(source=source, status=LeadStatus.PROCESSING, email=f"l{i}@corp.example"),
        ).pk
        for i in range(80)
    ]
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def work(seed: int, chunk: list[Any]) -> None:
        chance = random.Random(seed)
        try:
            barrier.wait()
            for lead_id in chunk:
                lead = Lead.objects.select_related("source").get(pk=lead_id)
                result = decisions.route_lead(lead=lead)
                if result.assignment is None:
                    continue
                roll = chance.random()
                if roll < 0.4:
                    assignment_touch(lead_id=lead_id, actor="test")
                elif roll < 0.7:
                    other = chance.choice(reps)
                    lead_reassign(lead_id=lead_id, rep_email=other.email, reason="x", actor="t")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i, ids[i::8])) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    _agree()
    assert rep_loads_reconcile().suspects == 0
    # Routing never passed a cap (reassignment by hand may: a manager's decision).
    routed = Assignment.objects.filter(kind="initial").count()
    assert routed + Lead.objects.filter(status=LeadStatus.UNASSIGNED).count() == 80


@pytest.mark.django_db
def test_the_migration_fills_the_counters_from_the_assignments_as_they_stand() -> None:
    import importlib

    from django.apps import apps

    migration = importlib.import_module("routing.migrations.0020_rep_load_counters")
    ana = make_rep(email="ana@x.example", timezone="Asia/Tokyo")
    published_ruleset({"name": "Ana", "action": {"type": "rep", "rep": ana.email}})
    first = _route("a@corp.example").assignment
    _route("b@corp.example", timezone.now() - timedelta(days=3))
    assert first is not None
    assignment_touch(lead_id=first.lead_id, actor="test")
    make_rep(email="idle@x.example")
    RepLoad.objects.all().delete()  # as before the upgrade

    migration.fill(apps, None)

    _agree()
    assert RepLoad.objects.count() == 2
    assert stored(timezone.now())[ana.pk] == (1, 1)
