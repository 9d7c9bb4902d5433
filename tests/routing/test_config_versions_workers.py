"""Whole configurations published and rolled back while two real ``celery -A config worker``
processes route a stream of leads (PostgreSQL, Redis): every lead is decided by exactly one
configuration version, recorded with it (its assignment's ruleset version, rule of that version),
and its decision is what that version decides (recomputed from the version's stored snapshot);
no lead is lost or assigned twice."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from leads.models import Lead, LeadStatus
from routing.configuration import document_config
from routing.decisions import clear_live_config_cache, simulate_with
from routing.drafts.models import ConfigSnapshot
from routing.drafts.services import (
    config_draft_create,
    config_draft_patch,
    config_draft_publish,
    config_rollback,
    draft_plan,
)
from routing.models import Assignment
from routing.rules_io import rules_import
from tests.leads.factories import SourceFactory
from tests.routing.test_pipeline import RULES
from tests.support.processes import celery_worker, wait_until

pytestmark = [
    pytest.mark.worker,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

BATCHES = 10  # at least; the stream goes on until the last publish
PEOPLE = [
    *RULES["reps"],
    {"email": "cai@example.com", "name": "Cai", "timezone": "UTC"},
    {"email": "dan@example.com", "name": "Dan", "timezone": "UTC"},
]
TEAMS = [
    *RULES["teams"],
    {"name": "Solo", "strategy": "round_robin", "members": [{"rep": "cai@example.com"}]},
    {"name": "DACH", "strategy": "round_robin", "members": [{"rep": "dan@example.com"}]},
]


@contextlib.contextmanager
def _two_workers() -> Iterator[tuple[Any, Any]]:
    """Two worker processes, started side by side (each waits until it is ready)."""
    managers = [celery_worker(concurrency=1, name=name) for name in ("a", "b")]
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(manager.__enter__) for manager in managers]
    try:
        yield futures[0].result(), futures[1].result()
    finally:
        for manager, future in zip(managers, futures, strict=True):
            if future.exception() is None:
                manager.__exit__(None, None, None)


def _publish(changes: dict[str, Any]) -> int:
    draft = config_draft_create(actor="test")
    config_draft_patch(draft_id=draft.pk, changes=changes, actor="test")
    return config_draft_publish(draft_id=draft.pk, actor="test").snapshot.number


def test_two_workers_route_while_whole_configurations_are_published_and_rolled_back() -> None:
    clear_live_config_cache()
    source = SourceFactory()  # a source is configuration: made before the versions
    rules_import({**RULES, "reps": PEOPLE, "teams": TEAMS}, publish=True)
    client = Client()
    posted: list[str] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def post_stream() -> None:
        # Two leads every 0.2 s until the last version is published (and at least BATCHES).
        try:
            n = 0
            while not done.is_set() or n < 2 * BATCHES:
                batch = [
                    {"email": f"p{i}@acme.com", "country": "Germany" if i % 2 else "France"}
                    for i in (n, n + 1)
                ]
                n += 2
                response = client.post(
                    f"/api/v1/intake/{source.slug}/batch/",
                    batch,
                    content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer token-{source.slug}",
                )
                assert response.status_code == 202, response.content
                posted.extend(str(item["id"]) for item in response.json()["results"])
                time.sleep(0.2)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    with _two_workers() as (w1, w2):
        stream = threading.Thread(target=post_stream)
        stream.start()
        # Version 1 is the baseline (A: everyone to EMEA SDR); 2 (B): everyone to Cai's Solo;
        # 3: A again; 4 (C): German leads to Dan's DACH first; 5: B again; 6: C again.
        numbers = []
        time.sleep(0.5)
        solo = {"rules": {"Everyone": {"priority": 20, "action": {"type": "team", "team": "Solo"}}}}
        numbers.append(_publish(solo))
        time.sleep(0.6)
        numbers.append(config_rollback(number=1, actor="test").snapshot.number)
        time.sleep(0.6)
        dach = {
            "rules": {
                "DACH first": {
                    "priority": 15,
                    "when": {"all": [{"field": "country", "op": "eq", "value": "DE"}]},
                    "action": {"type": "team", "team": "DACH"},
                }
            }
        }
        numbers.append(_publish(dach))
        time.sleep(0.6)
        numbers.append(config_rollback(number=2, actor="test").snapshot.number)
        time.sleep(0.6)
        numbers.append(config_rollback(number=4, actor="test").snapshot.number)
        done.set()
        stream.join(120)
        assert not failures, failures
        leads = len(posted)
        wait_until(
            lambda: Lead.objects.filter(status=LeadStatus.ASSIGNED).count() == leads,
            timeout=120,
            interval=0.5,
            message=f"{Counter(Lead.objects.values_list('status', flat=True))}\n"
            + w1.text()[-3000:]
            + w2.text()[-3000:],
        )
    connection.close()
    assert numbers == [2, 3, 4, 5, 6]

    # No lead lost or assigned twice.
    assert Lead.objects.filter(pk__in=posted).count() == leads
    assignments = list(
        Assignment.objects.filter(lead__in=posted).select_related("lead", "lead__source", "rule")
    )
    assert len(assignments) == leads
    assert len({a.lead_id for a in assignments}) == leads
    assert all(a.active for a in assignments)

    # Each lead names exactly one version, and its decision is that version's.
    now = timezone.now()
    versions = {}
    for snapshot in ConfigSnapshot.objects.all():
        document = document_config(draft_plan(snapshot.document))
        versions[snapshot.ruleset_version] = (snapshot.number, document, document.snapshot(now))
    assert len(versions) == 6
    used: Counter[int] = Counter()
    for assignment in assignments:
        assert assignment.ruleset_version in versions, assignment.ruleset_version
        number, document, snap = versions[assignment.ruleset_version]
        used[number] += 1
        assert assignment.rule is not None
        assert assignment.rule.ruleset.version == assignment.ruleset_version
        expected = simulate_with(
            lead_data=assignment.lead.raw_payload,
            source=assignment.lead.source,
            config=document.config,
            snap=snap,
            now=now,
            accounts=document.accounts,
        )
        assert expected.team is not None
        assert (assignment.team_name, assignment.rule_name) == (
            expected.team.name,
            expected.decision.rule_name,
        ), (number, assignment.lead.raw_payload)
        members = {document.reps[rep_id]["email"] for rep_id, _w in expected.team.members}
        assert assignment.rep.email in members
    # The versions really took turns deciding (at least three of them decided leads).
    assert len(used) >= 3, used
    clear_live_config_cache()


TERRITORY_RULES = {
    **RULES,
    "reps": PEOPLE,
    "teams": TEAMS,
    "territories": [
        {"name": "DE", "countries": ["DE"], "team": "EMEA SDR"},
        {"name": "FR", "countries": ["FR"], "team": "Solo"},
    ],
    "ruleset": {
        "name": "Inbound",
        "rules": [
            *RULES["ruleset"]["rules"][:1],  # exclude competitors
            {"name": "By territory", "priority": 15, "action": {"type": "territory"}},
            *RULES["ruleset"]["rules"][1:],  # everyone else to EMEA SDR
        ],
    },
}


def test_versions_of_territories_members_weights_and_caps_while_two_workers_route() -> None:
    """Not only rules: versions move a territory to another team, change a team's members and
    weights and cap a rep, published and rolled back while two workers route. Each lead names
    one version, and that version's territories, members and caps explain its decision."""
    clear_live_config_cache()
    source = SourceFactory()
    rules_import(TERRITORY_RULES, publish=True)
    config_draft_create(actor="test")  # stores the baseline: version 1
    client = Client()
    posted: list[str] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def post_stream() -> None:
        try:
            n = 0
            while not done.is_set() or n < 2 * BATCHES:
                batch = [
                    {"email": f"q{i}@acme.com", "country": "Germany" if i % 2 else "France"}
                    for i in (n, n + 1)
                ]
                n += 2
                response = client.post(
                    f"/api/v1/intake/{source.slug}/batch/",
                    batch,
                    content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer token-{source.slug}",
                )
                assert response.status_code == 202, response.content
                posted.extend(str(item["id"]) for item in response.json()["results"])
                time.sleep(0.2)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    published_at: dict[int, Any] = {}

    def decided_by(number: int, **more: Any) -> None:
        """Wait until version ``number`` decided a lead (and ``more``): each kind of change is
        seen deciding, however slow the machine, before the next version replaces it."""
        version = ConfigSnapshot.objects.get(number=number).ruleset_version
        wait_until(
            lambda: Assignment.objects.filter(ruleset_version=version, **more).exists(),
            timeout=120,
            interval=0.2,
            message=f"no lead decided by version {number} {more}",
        )

    with _two_workers() as (w1, w2):
        stream = threading.Thread(target=post_stream)
        stream.start()
        # 1: the baseline (DE to EMEA SDR of Ana and Ben, FR to Cai's Solo); 2: FR moved to
        # Dan's DACH (a territory); 3: EMEA SDR becomes Ben (weight 3) and Cai (members,
        # weights); 4: 1 again; 5: Ana capped at one open lead (she holds one by then: every
        # lead stays open here); 6: 3 again.
        numbers = []
        decided_by(1)
        numbers.append(_publish({"territories": {"FR": {"countries": ["FR"], "team": "DACH"}}}))
        decided_by(2, lead__country="FR")
        members = [{"rep": "ben@example.com", "weight": 3}, {"rep": "cai@example.com"}]
        numbers.append(_publish({"teams": {"EMEA SDR": {"members": members}}}))
        decided_by(3, lead__country="DE")
        numbers.append(config_rollback(number=1, actor="test").snapshot.number)
        decided_by(4, rep__email="ana@example.com")
        ana = {"name": "Ana", "timezone": "Europe/Berlin", "max_open": 1}
        capped = _publish({"reps": {"ana@example.com": ana}})
        published_at[capped] = timezone.now()
        numbers.append(capped)
        decided_by(5, lead__country="DE")
        numbers.append(config_rollback(number=3, actor="test").snapshot.number)
        decided_by(6)
        done.set()
        stream.join(120)
        assert not failures, failures
        leads = len(posted)
        wait_until(
            lambda: Lead.objects.filter(status=LeadStatus.ASSIGNED).count() == leads,
            timeout=120,
            interval=0.5,
            message=f"{Counter(Lead.objects.values_list('status', flat=True))}\n"
            + w1.text()[-3000:]
            + w2.text()[-3000:],
        )
    connection.close()
    assert numbers == [2, 3, 4, 5, 6]

    assignments = list(
        Assignment.objects.filter(lead__in=posted).select_related(
            "lead", "lead__source", "rule", "rep"
        )
    )
    assert len(assignments) == len(posted)
    assert len({a.lead_id for a in assignments}) == len(posted)

    now = timezone.now()
    versions = {}
    for snapshot in ConfigSnapshot.objects.all():
        document = document_config(draft_plan(snapshot.document))
        versions[snapshot.ruleset_version] = (snapshot, document, document.snapshot(now))
    assert len(versions) == 6
    used: Counter[int] = Counter()
    for assignment in assignments:
        assert assignment.ruleset_version in versions, assignment.ruleset_version
        snapshot, document, snap = versions[assignment.ruleset_version]
        used[snapshot.number] += 1
        assert assignment.rule is not None
        assert assignment.rule.ruleset.version == assignment.ruleset_version
        expected = simulate_with(
            lead_data=assignment.lead.raw_payload,
            source=assignment.lead.source,
            config=document.config,
            snap=snap,
            now=now,
            accounts=document.accounts,
        )
        assert expected.team is not None
        # The version's territory (which team a country goes to) and rule explain the team...
        assert (assignment.team_name, assignment.rule_name) == (
            expected.team.name,
            expected.decision.rule_name,
        ), (snapshot.number, assignment.lead.raw_payload)
        # ... its members (and only they) the rep ...
        members = {document.reps[rep_id]["email"] for rep_id, _w in expected.team.members}
        assert assignment.rep.email in members, (snapshot.number, assignment.rep.email)
        # ... and its caps: under version 5 Ana, capped at one open lead and holding more
        # (every lead stays open here), takes none.
        if snapshot.number == 5:
            assert assignment.rep.email != "ana@example.com"
    # Ana held open leads before version 5 capped her (so the cap was binding).
    ana_before = [
        a
        for a in assignments
        if a.rep.email == "ana@example.com" and a.assigned_at < published_at[5]
    ]
    assert len(ana_before) >= 1
    assert all(used[number] >= 1 for number in range(1, 7)), used  # each version decided
    clear_live_config_cache()
