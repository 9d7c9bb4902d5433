"""Two publishes of the whole configuration at once (PostgreSQL, real transactions): one wins,
the other is refused with 409 and the reason, nothing of it written; a publish while an import
holds the configuration lock is refused the same way."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client

from routing.config_api.tokens import api_token_create
from routing.configuration import configuration_lock
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigDraft, ConfigSnapshot
from routing.drafts.services import config_draft_create, config_draft_patch
from routing.models import ValueList
from routing.rules_io import rules_import
from tests.routing.factories import user_with_perms
from tests.routing.test_pipeline import RULES

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _secret() -> str:
    user = user_with_perms("ci", "read,draft,publish")
    return api_token_create(user=user, name="ci", scopes="read,draft,publish", actor="t").secret


def _publish(draft_id: int, secret: str) -> Any:
    return Client().post(
        f"/api/v1/config/drafts/{draft_id}/publish/",
        {},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )


def test_of_two_publishes_at_once_one_wins_and_the_other_is_told_why() -> None:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    secret = _secret()
    drafts = []
    for values in (["a.io"], ["b.io"]):
        draft = config_draft_create(actor="t")
        config_draft_patch(
            draft_id=draft.pk,
            changes={"value_lists": {"competitors": {"values": values}}},
            actor="t",
        )
        drafts.append(draft.pk)
    start = threading.Barrier(2)
    responses: dict[int, Any] = {}
    failures: list[BaseException] = []

    def publish(draft_id: int) -> None:
        try:
            start.wait(10)
            responses[draft_id] = _publish(draft_id, secret)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=publish, args=(pk,)) for pk in drafts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    statuses = sorted(response.status_code for response in responses.values())
    assert statuses == [201, 409], [r.content for r in responses.values()]
    winner = next(pk for pk, r in responses.items() if r.status_code == 201)
    loser = next(r for r in responses.values() if r.status_code == 409)
    error = loser.json()["error"]
    assert error["code"] in {"configuration_busy", "draft_stale"}
    assert "nothing was written" in error["message"].lower() or "changed since" in error["message"]
    assert ConfigSnapshot.objects.count() == 2  # the baseline and the winner
    won = ConfigDraft.objects.get(pk=winner)
    assert ValueList.objects.get().values == won.document["value_lists"][0]["values"]
    assert ConfigDraft.objects.exclude(pk=winner).get().status == "open"
    clear_live_config_cache()


def test_a_publish_during_an_import_is_refused_with_409() -> None:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    secret = _secret()
    draft = config_draft_create(actor="t")
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
        response = _publish(draft.pk, secret)
    finally:
        release.set()
        thread.join(30)
    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "configuration_busy"
    assert "Another import or publish" in response.json()["error"]["message"]
    assert ConfigSnapshot.objects.count() == 1
    assert _publish(draft.pk, secret).status_code == 201  # once it is over
    clear_live_config_cache()
