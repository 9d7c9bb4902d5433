"""Publishes of the whole configuration at once (PostgreSQL, real transactions), each a job the
API queued and a worker runs: of two, one is published, the other ends failed with the reason,
nothing of it written; a publish while an import holds the configuration lock ends failed the
same way; a long publish keeps its job's heartbeat, so a redelivery meanwhile leaves it alone
rather than publishing a second time."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client

from routing.admin_jobs import admin_job_run
from routing.config_api.tokens import api_token_create
from routing.configuration import configuration_lock
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigDraft, ConfigSnapshot
from routing.drafts.services import config_draft_create, config_draft_patch
from routing.models import AdminJob, ValueList
from routing.rules_io import rules_import
from tests.routing.config_api.jobs import job_queued, job_read
from tests.routing.factories import user_with_perms
from tests.routing.test_pipeline import RULES

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _secret() -> str:
    user = user_with_perms("ci", "read,draft,publish")
    return api_token_create(user=user, name="ci", scopes="read,draft,publish", actor="t").secret


def _publish(draft_id: int, secret: str) -> dict[str, Any]:
    """The publish asked for: its job, queued (a worker would take it; the test runs it)."""
    return job_queued(
        Client().post(
            f"/api/v1/config/drafts/{draft_id}/publish/",
            {},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {secret}",
        )
    )


def _changed_draft(values: list[str]) -> int:
    draft = config_draft_create(actor="t")
    config_draft_patch(
        draft_id=draft.pk,
        changes={"value_lists": {"competitors": {"values": values}}},
        actor="t",
    )
    return int(draft.pk)


def _run_at_once(job_ids: list[int]) -> None:
    """Run the jobs as workers would, each in a thread of its own, all at once."""
    start = threading.Barrier(len(job_ids))
    failures: list[BaseException] = []

    def run(job_id: int) -> None:
        try:
            start.wait(10)
            admin_job_run(job_id=job_id)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(job_id,)) for job_id in job_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures


def test_of_two_publishes_at_once_one_wins_and_the_other_is_told_why() -> None:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    secret = _secret()
    drafts = [_changed_draft(["a.io"]), _changed_draft(["b.io"])]
    jobs = [_publish(draft_id, secret) for draft_id in drafts]
    _run_at_once([job["id"] for job in jobs])
    ended = [job_read(Client(), job, secret) for job in jobs]
    assert sorted(job["status"] for job in ended) == ["done", "failed"], ended
    won = next(job for job in ended if job["status"] == "done")
    lost = next(job for job in ended if job["status"] == "failed")
    assert lost["error"]["code"] in {"configuration_busy", "draft_stale"}, lost
    assert (
        "nothing was written" in lost["error"]["message"].lower()
        or "changed since" in lost["error"]["message"]
    )
    assert ConfigSnapshot.objects.count() == 2  # the baseline and the winner
    assert won["result"]["version"]["number"] == 2
    winner = ConfigDraft.objects.get(pk=won["draft"])
    assert ValueList.objects.get().values == winner.document["value_lists"][0]["values"]
    assert ConfigDraft.objects.get(pk=lost["draft"]).status == "open"
    clear_live_config_cache()


def test_a_publish_during_an_import_ends_failed_with_the_reason() -> None:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    secret = _secret()
    draft_id = _changed_draft(["a.io"])
    held, release = threading.Event(), threading.Event()

    def importing() -> None:
        try:
            with transaction.atomic():
                configuration_lock()
                held.set()
                release.wait(20)
        finally:
            held.set()
            connection.close()

    thread = threading.Thread(target=importing)
    thread.start()
    try:
        assert held.wait(20)
        job = _publish(draft_id, secret)
        admin_job_run(job_id=job["id"])
    finally:
        release.set()
        thread.join(30)
    ended = job_read(Client(), job, secret)
    assert (ended["status"], ended["error"]["code"]) == ("failed", "configuration_busy")
    assert "Another import or publish" in ended["error"]["message"]
    assert ConfigSnapshot.objects.count() == 1
    assert ConfigDraft.objects.get(pk=draft_id).status == "open"
    again = _publish(draft_id, secret)  # once it is over
    admin_job_run(job_id=again["id"])
    assert job_read(Client(), again, secret)["status"] == "done"
    clear_live_config_cache()


def test_a_long_publish_keeps_its_heartbeat_and_a_redelivery_meanwhile_does_nothing(
    settings: Any,
) -> None:
    settings.ADMIN_JOB_STALE_SECONDS = 2  # a heartbeat every second
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    secret = _secret()
    draft_id = _changed_draft(["a.io"])
    job = _publish(draft_id, secret)
    # Someone holds the draft's row: the publish, its transaction begun, waits for it.
    held, release = threading.Event(), threading.Event()

    def holding() -> None:
        try:
            with transaction.atomic():
                list(ConfigDraft.objects.select_for_update().filter(pk=draft_id))
                held.set()
                release.wait(30)
        finally:
            held.set()
            connection.close()

    holder = threading.Thread(target=holding)
    holder.start()
    assert held.wait(20)
    worker = threading.Thread(target=_run_at_once, args=([job["id"]],))
    worker.start()
    try:
        time.sleep(settings.ADMIN_JOB_STALE_SECONDS * 2.5)  # past stale, had no one beaten
        running = AdminJob.objects.get(pk=job["id"])
        assert (running.status, running.attempt, running.stalled) == ("running", 1, False)
        admin_job_run(job_id=job["id"])  # redelivered meanwhile: running elsewhere, left alone
        assert AdminJob.objects.get(pk=job["id"]).attempt == 1
    finally:
        release.set()
        holder.join(30)
        worker.join(60)
    ended = job_read(Client(), job, secret)
    assert ended["status"] == "done", ended
    assert ConfigSnapshot.objects.count() == 2  # published once
    assert ValueList.objects.get().values == ["a.io"]
    clear_live_config_cache()
