"""A Hypothesis state machine: the reps' load counters equal the counts of their assignments
after any sequence of assignments, touches, reassignments, releases, rep time-zone changes
and midnights.

The machine drives the real services on the test database with a clock of its own (the
``now`` the services take at their boundary): routing (``route_lead``, also with a clock a
few seconds behind, as a worker that read the time before waiting for a lock), first touches
from the page and from a CRM, manual reassignment, SLA breaches reassigned within the team
(``sla_check``), a rep deactivated and their open leads released (``rep_reroute_open_leads``),
a rep's time zone changed (the admin or an import writes the row; nothing else), and the
clock moved: minutes, or to a few seconds either side of some rep's next local midnight. The
zones include half- and quarter-hour offsets and a day that daylight saving shortens.

Invariants after every step, against ground truth counted over the assignments at the
machine's clock: what a decision reads for each rep (the counters, or the rep's day counted
when the row was kept in another zone) equals the count; and every row kept in the rep's own
zone equals it without counting. A step runs the reconciliation, which must find no drift.

Budget: derandomised (the same examples every run), 12 examples of up to 30 steps: about 15 s
on SQLite and 20 s on PostgreSQL on a quiet 2-core machine.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from leads.models import Lead, LeadStatus
from routing import decisions
from routing.crm.touches import assignment_touch_from_crm
from routing.loads import (
    LOAD_COLUMNS,
    load_counts,
    load_from_row,
    local_midnight,
    rep_loads_reconcile,
)
from routing.models import Assignment, Rep, Rule, RuleSet
from routing.monitoring.sla import sla_check
from routing.services import (
    LeadActionError,
    assignment_touch,
    lead_reassign,
    rep_reroute_open_leads,
)
from routing.versions import reps_deactivate
from tests.leads.factories import LeadFactory, SourceFactory
from tests.routing.factories import make_rep, publish_as_is, team_with
from tests.routing.loads_truth import counted, stored

pytestmark = pytest.mark.django_db

ZONES = (
    "UTC",
    "Europe/Berlin",
    "America/Los_Angeles",
    "Asia/Kathmandu",  # +05:45
    "Australia/Lord_Howe",  # +10:30, a half-hour daylight saving
    "Pacific/Chatham",  # +12:45
)
# Saturday evening before Europe's clocks go forward: Berlin's next day has 23 hours.
START = datetime(2026, 3, 28, 20, 0, tzinfo=UTC)
REPS = 4


class LoadMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._atomic = transaction.atomic()
        self._atomic._from_testcase = True  # the services' durable blocks may run inside
        self._atomic.__enter__()
        decisions.clear_live_config_cache()
        self.now = START
        self.leads: list[Any] = []
        self.reps: list[int] = []
        self.serial = 0

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self._atomic.__exit__(None, None, None)
        decisions.clear_live_config_cache()

    @initialize(
        zones=st.lists(st.sampled_from(ZONES), min_size=REPS, max_size=REPS),
        max_open=st.lists(st.sampled_from([None, 1, 2, 4]), min_size=REPS, max_size=REPS),
        per_day=st.lists(st.sampled_from([None, 1, 3]), min_size=REPS, max_size=REPS),
    )
    def setup(self, zones: list[str], max_open: list[int | None], per_day: list[int | None]):
        reps = [
            make_rep(timezone=zone, max_open=cap, max_per_day=day)
            for zone, cap, day in zip(zones, max_open, per_day, strict=True)
        ]
        self.reps = [rep.pk for rep in reps]
        pool = team_with(reps[:3])
        least = team_with(reps[1:], strategy="least_loaded")
        ruleset = RuleSet.objects.create(version=1, name="loads")
        rules: list[dict[str, Any]] = [
            {
                "name": "Named",
                "when": {"field": "country", "op": "eq", "value": "DE"},
                "action": {"type": "rep", "rep": reps[0].email},
            },
            {
                "name": "Least",
                "when": {"field": "country", "op": "eq", "value": "FR"},
                "action": {"type": "team", "team": least.name},
            },
            {
                "name": "Pool",
                "action": {"type": "team", "team": pool.name},
                "sla_minutes": 30,
                "on_sla_breach": "reassign",
            },
        ]
        for i, data in enumerate(rules):
            Rule.objects.create(ruleset=ruleset, priority=(i + 1) * 10, **data)
        publish_as_is(ruleset)
        self.source = SourceFactory(slug="loads")

    # --- steps --------------------------------------------------------------------------------

    def _route(self, country: str, now: datetime) -> None:
        self.serial += 1
        lead = LeadFactory(
            source=self.source,
            status=LeadStatus.PROCESSING,
            email=f"p{self.serial}@corp.example",
            email_domain="corp.example",
            country=country,
        )
        lead = Lead.objects.select_related("source").get(pk=lead.pk)
        decisions.route_lead(lead=lead, now=now)
        self.leads.append(lead.pk)

    @rule(country=st.sampled_from(["DE", "FR", "US"]))
    def route(self, country: str) -> None:
        self._route(country, self.now)

    @rule(country=st.sampled_from(["DE", "FR", "US"]), behind=st.integers(1, 20))
    def route_with_a_clock_behind(self, country: str, behind: int) -> None:
        self._route(country, self.now - timedelta(seconds=behind))

    @precondition(lambda self: self.leads)
    @rule(data=st.data(), crm=st.booleans())
    def touch(self, data: st.DataObject, crm: bool) -> None:
        lead_id = data.draw(st.sampled_from(self.leads))
        current = Assignment.objects.filter(lead_id=lead_id, active=True).first()
        if current is None:
            return
        if crm:
            assignment_touch_from_crm(assignment_id=current.pk, kind="hubspot", at=self.now)
        else:
            assignment_touch(lead_id=lead_id, actor="test", now=self.now)

    @precondition(lambda self: self.leads)
    @rule(data=st.data(), rep=st.integers(0, REPS - 1))
    def reassign(self, data: st.DataObject, rep: int) -> None:
        lead_id = data.draw(st.sampled_from(self.leads))
        email = Rep.objects.get(pk=self.reps[rep]).email
        # Refused for an inactive rep or a lead still in progress: nothing written.
        with contextlib.suppress(LeadActionError):
            lead_reassign(lead_id=lead_id, rep_email=email, reason="r", actor="test", now=self.now)

    @rule()
    def sla_breaches(self) -> None:
        sla_check(now=self.now)

    @rule(rep=st.integers(0, REPS - 1))
    def release_an_absent_rep(self, rep: int) -> None:
        rep_obj = Rep.objects.get(pk=self.reps[rep])
        reps_deactivate(reps=[rep_obj])
        rep_reroute_open_leads(rep_id=rep_obj.pk, actor="test", reason="away", now=self.now)

    @rule(rep=st.integers(0, REPS - 1))
    def reactivate(self, rep: int) -> None:
        Rep.objects.filter(pk=self.reps[rep]).update(active=True)

    @rule(rep=st.integers(0, REPS - 1), zone=st.sampled_from(ZONES))
    def change_time_zone(self, rep: int, zone: str) -> None:
        Rep.objects.filter(pk=self.reps[rep]).update(timezone=zone)

    @rule()
    def reconcile(self) -> None:
        # Rows kept in a rep's previous zone are recounted; no row has drifted.
        assert rep_loads_reconcile(now=self.now).repaired == 0

    @rule(minutes=st.integers(1, 600))
    def later(self, minutes: int) -> None:
        self.now += timedelta(minutes=minutes)

    @rule(rep=st.integers(0, REPS - 1), offset=st.integers(-3, 3))
    def to_midnight(self, rep: int, offset: int) -> None:
        zone = Rep.objects.get(pk=self.reps[rep]).timezone
        midnight = local_midnight(local_midnight(self.now, zone) + timedelta(hours=26), zone)
        self.now = max(self.now, midnight + timedelta(seconds=offset))

    # --- invariants ---------------------------------------------------------------------------

    @invariant()
    def a_decision_reads_the_counts(self) -> None:
        if not self.reps:
            return
        truth = counted(self.now)
        read = {
            row["id"]: load_counts(row["id"], row["timezone"], load_from_row(row), self.now)
            for row in Rep.objects.values("id", "timezone", *LOAD_COLUMNS)
        }
        assert read == truth

    @invariant()
    def rows_kept_in_the_reps_zone_need_no_counting(self) -> None:
        truth = counted(self.now)
        for rep_id, (open_count, today) in stored(self.now).items():
            assert open_count == truth[rep_id][0], rep_id
            if today is not None:
                assert today == truth[rep_id][1], rep_id


LoadMachine.TestCase.settings = settings(
    max_examples=8,
    stateful_step_count=25,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_load_counters_equal_the_counts_after_any_sequence() -> None:
    assert timezone.now() > START  # CRM touches are clamped to the real clock
    LoadMachine.TestCase().runTest()
