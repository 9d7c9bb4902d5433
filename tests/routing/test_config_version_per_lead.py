"""Each lead is decided by one configuration version, recorded with it (PostgreSQL, real
transactions): a lead waits while a publish of the whole configuration is under way, and leads
routed by two workers while versions are published and rolled back each carry the ruleset
version whose tables decided them."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from leads.models import Lead, LeadStatus
from routing.configuration import configuration_lock, decide_lock_exclusive
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigSnapshot
from routing.drafts.services import (
    config_draft_create,
    config_draft_patch,
    config_draft_publish,
    config_rollback,
)
from routing.models import Assignment
from routing.rules_io import rules_import
from routing.services import lead_process
from tests.leads.factories import LeadFactory
from tests.routing.test_pipeline import RULES

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def published() -> Any:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield
    clear_live_config_cache()


def test_a_lead_waits_for_a_publish_under_way_and_is_decided_after_it(published: Any) -> None:
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    done: list[str | None] = []

    def work() -> None:
        try:
            done.append(lead_process(lead_id=lead.id))
        finally:
            connection.close()

    with transaction.atomic():
        configuration_lock()  # a publish holding the configuration
        decide_lock_exclusive()  # at its swap
        worker = threading.Thread(target=work)
        worker.start()
        time.sleep(1.5)
        assert done == []  # waiting for the publish, not deciding with half of it
    worker.join(30)
    assert done == [LeadStatus.ASSIGNED]


def test_two_workers_route_while_versions_are_published_each_lead_by_one_version(
    published: Any,
) -> None:
    # Leads first: their factory makes sources, which are part of the configuration.
    leads = [LeadFactory(raw_payload={"email": f"p{i}@acme.com"}) for i in range(40)]
    # Version A: everyone to EMEA SDR (Ana and Ben). Version B: a new team of Cai only.
    draft = config_draft_create(actor="t")
    config_draft_patch(
        draft_id=draft.pk,
        changes={
            "reps": {"cai@example.com": {"name": "Cai", "timezone": "UTC"}},
            "teams": {"Solo": {"members": [{"rep": "cai@example.com"}]}},
            "rules": {"Everyone": {"priority": 20, "action": {"type": "team", "team": "Solo"}}},
        },
        actor="t",
    )
    queue = list(leads)
    lock = threading.Lock()
    failures: list[BaseException] = []

    def worker() -> None:
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    lead = queue.pop(0)
                lead_process(lead_id=lead.id)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.2)
        config_draft_publish(draft_id=draft.pk, actor="t")  # B
        time.sleep(0.2)
        config_rollback(number=1, actor="t")  # A again, as version 3
    finally:
        with lock:
            pending = len(queue)
        for thread in threads:
            thread.join(120)
    assert pending < len(leads)  # the publishes happened while the workers routed
    assert not failures, failures
    team_of_version = {
        snapshot.ruleset_version: ("Solo" if snapshot.number == 2 else "EMEA SDR")
        for snapshot in ConfigSnapshot.objects.all()
    }
    assert len(team_of_version) == 3
    assignments = Assignment.objects.filter(lead__in=leads, active=True)
    assert assignments.count() == len(leads)
    for assignment in assignments:
        assert assignment.ruleset_version in team_of_version
        assert assignment.team_name == team_of_version[assignment.ruleset_version]
        if assignment.team_name == "Solo":
            assert assignment.rep_name == "Cai"
    assert set(
        Lead.objects.filter(pk__in=[lead.pk for lead in leads]).values_list("status", flat=True)
    ) == {LeadStatus.ASSIGNED}
