"""A publish during a replay, and a replay during a publish, are serialised (PostgreSQL, real
transactions): the replay or check reads the live configuration under the publish lock shared,
so a publish meanwhile is refused (the API's publish job ends failed with configuration_busy,
the reason everywhere),
nothing of it written; a replay or ``routing_check`` while a publish holds the lock is refused
with the reason, and an admin replay job fails with it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import Client

from leads.models import LeadStatus
from routing.admin_jobs import admin_job_run, admin_job_start_replay
from routing.config_api.tokens import api_token_create
from routing.configuration import ConfigurationBusy, configuration_lock
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigSnapshot
from routing.drafts.services import config_draft_create, config_draft_patch, config_draft_publish
from routing.models import AdminJobStatus, RuleSet, ValueList
from routing.rules_io import REPLAY_BUSY, rules_import
from routing.selectors import ruleset_published
from routing.services import lead_process
from routing.versions import ruleset_replay
from tests.leads.factories import LeadFactory
from tests.routing.config_api.jobs import job_queued, job_read
from tests.routing.factories import user_with_perms
from tests.routing.test_pipeline import RULES

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def published() -> Any:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    yield ruleset_published()
    clear_live_config_cache()


def _draft() -> int:
    draft = config_draft_create(actor="t")
    config_draft_patch(
        draft_id=draft.pk,
        changes={"value_lists": {"competitors": {"values": ["other.io"]}}},
        actor="t",
    )
    return draft.pk


class _Replaying:
    """A replay in another connection, held inside its first progress report."""

    def __init__(self, ruleset: RuleSet) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.failures: list[BaseException] = []
        self.result: list[Any] = []

        def progress(done: int, total: int) -> None:
            self.inside.set()
            self.release.wait(20)

        def run() -> None:
            try:
                self.result.append(ruleset_replay(ruleset=ruleset, limit=10, progress=progress))
            except BaseException as exc:
                self.failures.append(exc)
            finally:
                self.inside.set()
                connection.close()

        self.thread = threading.Thread(target=run)

    def __enter__(self) -> _Replaying:
        self.thread.start()
        assert self.inside.wait(20)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(30)
        assert not self.failures, self.failures
        assert self.result[0].considered == 1


def test_a_publish_during_a_replay_is_refused_and_writes_nothing(published: RuleSet) -> None:
    draft_id = _draft()
    user = user_with_perms("ci", "read,draft,publish")
    secret = api_token_create(user=user, name="ci", scopes="read,draft,publish", actor="t").secret
    before = ConfigSnapshot.objects.count()
    with _Replaying(published):
        with pytest.raises(ConfigurationBusy, match="replay"):
            config_draft_publish(draft_id=draft_id, actor="t")
        response = Client().post(
            f"/api/v1/config/drafts/{draft_id}/publish/",
            {},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {secret}",
        )
        job = job_queued(response)
        admin_job_run(job_id=job["id"])  # as the worker would, while the replay reads
        error = job_read(Client(), job, secret)["error"]
        assert error["code"] == "configuration_busy"
        assert "nothing was written" in error["message"]
        assert ConfigSnapshot.objects.count() == before
        assert ValueList.objects.get().values == ["rival.io"]
    config_draft_publish(draft_id=draft_id, actor="t")  # once the replay is over
    assert ValueList.objects.get().values == ["other.io"]


def test_two_replays_run_side_by_side(published: RuleSet) -> None:
    with _Replaying(published):
        assert ruleset_replay(ruleset=published, limit=10).considered == 1


def _while_a_publish_holds_the_lock(action: Any) -> Any:
    held, release = threading.Event(), threading.Event()

    def publishing() -> None:
        try:
            with transaction.atomic():
                configuration_lock()
                held.set()
                release.wait(20)
        finally:
            held.set()
            connection.close()

    thread = threading.Thread(target=publishing)
    thread.start()
    try:
        assert held.wait(20)
        return action()
    finally:
        release.set()
        thread.join(30)


def test_a_replay_during_a_publish_is_refused_with_the_reason(published: RuleSet) -> None:
    def replay() -> None:
        with pytest.raises(ConfigurationBusy) as refused:
            ruleset_replay(ruleset=published, limit=10)
        assert str(refused.value) == REPLAY_BUSY

    _while_a_publish_holds_the_lock(replay)
    assert ruleset_replay(ruleset=published, limit=10).considered == 1  # once it is over


def test_routing_check_during_a_publish_is_refused_with_the_reason(
    published: RuleSet, tmp_path: Any
) -> None:
    import json

    path = tmp_path / "routing.json"
    path.write_text(json.dumps(RULES))

    def check() -> None:
        with pytest.raises(CommandError, match="in progress"):
            call_command("routing_check", str(path))

    _while_a_publish_holds_the_lock(check)


def test_an_admin_replay_job_during_a_publish_fails_with_the_reason(published: RuleSet) -> None:
    job = admin_job_start_replay(ruleset=published, limit=10, actor=None)

    def run() -> None:
        admin_job_run(job_id=job.pk)

    _while_a_publish_holds_the_lock(run)
    job.refresh_from_db()
    assert job.status == AdminJobStatus.FAILED
    assert job.error == REPLAY_BUSY
