"""The round-robin race test, with its negative control (reliability guide, test 9).

Eight threads route 96 leads through one team of four at the same moment (50 threads and 960
leads under ``make reliability``). With the real locking
(the team's row is locked before its turn is read) the rotation is exact. The same test run
against a deliberately naive version, which reads the turn without a lock and pauses before
writing it back (the read-then-write every hand-rolled round robin starts as), must fail:
otherwise the test could not catch the bug it exists for.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, cast

import pytest
from django.db import connection

from leads.models import Lead, LeadStatus
from routing import decisions
from routing.engine.types import RotationState
from routing.models import Assignment, Rep, Team
from tests.leads.factories import LeadFactory, SourceFactory
from tests.reliability.harness import SCALE, WAIT_SCALE, scaled
from tests.routing.factories import make_rep, published_ruleset, team_with

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.reliability,
    pytest.mark.django_db(transaction=True),
]

REPS = 4
# CI: 8 threads, 96 leads; `make reliability` (scale 10): the guide's 50 threads, 960 leads.
THREADS = 8 if SCALE < 5 else 50
LEADS = scaled(96, least=REPS * 4) // REPS * REPS


def _naive_lock_team(team_id: int) -> RotationState:
    """Read the turn with no lock, and give another worker time to read the same one."""
    state = Team.objects.filter(pk=team_id).values_list("rotation_state", flat=True).first()
    time.sleep(0.01)
    return RotationState.from_json(team_id, state)


def _race() -> tuple[list[Rep], list[int]]:
    """Route LEADS leads from THREADS threads at once: the reps, and the rep ids in order."""
    decisions.clear_live_config_cache()
    reps = [make_rep(email=f"race{i}@x.example") for i in range(REPS)]
    team = team_with(reps)
    published_ruleset({"name": "All", "action": {"type": "team", "team": team.name}})
    source = SourceFactory(slug="race")
    ids = [
        cast(
            Lead, LeadFactory(source=source, status=LeadStatus.PROCESSING, email=f"r{i}@c.example")
        ).pk
        for i in range(LEADS)
    ]
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def work(chunk: list[Any]) -> None:
        try:
            barrier.wait()
            for lead_id in chunk:
                decisions.route_lead(lead=Lead.objects.select_related("source").get(pk=lead_id))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(ids[i::THREADS],)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120 * WAIT_SCALE)
    assert errors == []
    return reps, list(Assignment.objects.order_by("id").values_list("rep_id", flat=True))


def rotation_problems(reps: list[Rep], order: list[int]) -> list[str]:
    """What is wrong with a rotation that should be exact: counts and order."""
    problems = []
    if len(order) != LEADS:
        problems.append(f"{len(order)} assignments for {LEADS} leads")
    counts = Counter(order)
    spread = max(counts.values()) - min(counts.get(rep.id, 0) for rep in reps)
    if spread > 1:
        problems.append(f"per-rep counts differ by {spread}: {sorted(counts.values())}")
    expected = [reps[i % REPS].id for i in range(len(order))]
    if order != expected:
        first = next(i for i, (a, b) in enumerate(zip(order, expected, strict=True)) if a != b)
        problems.append(f"rotation out of order from assignment {first + 1}")
    return problems


def test_round_robin_under_an_eight_way_race_is_exact() -> None:
    reps, order = _race()
    assert rotation_problems(reps, order) == []
    assert Counter(order) == {rep.id: LEADS // REPS for rep in reps}


def test_the_race_test_catches_a_naive_round_robin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decisions, "_lock_team", _naive_lock_team)
    reps, order = _race()
    problems = rotation_problems(reps, order)
    print(f"naive round robin under the race: {problems}")
    assert problems, "the naive version passed: this test cannot catch a rotation race"
