"""A publish keeps leads waiting only for its final swap, never for its preparation
(PostgreSQL, real transactions, a worker's ``lock_timeout``): a lead claimed while a big publish
writes and checks its tables is decided at once with the version before it; one claimed at the
swap waits for the commit, then is decided with the new version."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from leads.models import LeadStatus
from routing.configuration import configuration_lock, decide_lock_exclusive
from routing.decisions import clear_live_config_cache
from routing.drafts import services as draft_services
from routing.drafts.models import ConfigSnapshot
from routing.drafts.services import config_draft_create, config_draft_patch, config_draft_publish
from routing.models import Assignment
from routing.rules_io import rules_import
from routing.services import lead_process
from tests.leads.factories import LeadFactory
from tests.routing.test_pipeline import RULES

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WORKER_LOCK_TIMEOUT = "5s"  # as config.celery sets it for every worker
PREPARATION_SECONDS = 6.0  # longer than the worker's lock_timeout


@pytest.fixture
def published() -> Any:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield
    clear_live_config_cache()


def _routed_by_a_worker(lead_id: Any, out: dict[str, Any]) -> threading.Thread:
    def work() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = %s", [WORKER_LOCK_TIMEOUT])
            start = time.monotonic()
            out["status"] = lead_process(lead_id=lead_id)
            out["seconds"] = time.monotonic() - start
        except BaseException as exc:
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def test_a_claim_during_a_long_publish_is_decided_at_once_by_the_version_before(
    published: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    draft = config_draft_create(actor="t")  # stores the baseline, version 1
    config_draft_patch(
        draft_id=draft.pk,
        changes={"value_lists": {"competitors": {"values": ["other.io"]}}},
        actor="t",
    )
    preparing = threading.Event()
    diff = draft_services.configuration_diff

    def slow_diff(**kwargs: Any) -> Any:
        # The publish has written its tables and is still checking: as with 20,000 rows.
        preparing.set()
        time.sleep(PREPARATION_SECONDS)
        return diff(**kwargs)

    monkeypatch.setattr(draft_services, "configuration_diff", slow_diff)
    publishing: dict[str, Any] = {}

    def publish() -> None:
        try:
            publishing["result"] = config_draft_publish(draft_id=draft.pk, actor="t")
        except BaseException as exc:
            publishing["error"] = exc
        finally:
            connection.close()

    publisher = threading.Thread(target=publish)
    publisher.start()
    assert preparing.wait(30)
    routed: dict[str, Any] = {}
    _routed_by_a_worker(lead.id, routed).join(30)
    publisher.join(60)
    assert "error" not in routed, routed
    assert routed["status"] == LeadStatus.ASSIGNED
    assert routed["seconds"] < PREPARATION_SECONDS  # not kept waiting by the preparation
    assert "error" not in publishing, publishing
    before = ConfigSnapshot.objects.get(number=1)
    assert Assignment.objects.get(lead=lead).ruleset_version == before.ruleset_version


def test_a_claim_at_the_swap_waits_for_the_commit_then_succeeds(published: Any) -> None:
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    routed: dict[str, Any] = {}
    with transaction.atomic():
        configuration_lock()
        decide_lock_exclusive()  # a publish at its swap
        worker = _routed_by_a_worker(lead.id, routed)
        time.sleep(1.5)
        assert routed == {}  # waiting for the commit, under its lock_timeout
    worker.join(30)
    assert "error" not in routed, routed
    assert routed["status"] == LeadStatus.ASSIGNED
    assert routed["seconds"] >= 1.0
