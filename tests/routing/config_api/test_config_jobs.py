"""The configuration API's background jobs (docs/api.md, "Jobs"): a publish, a rollback and a
test of more than REPLAY_SYNC_MAX_LEADS leads answer 202 with a job document and its URL; the
job, run as the worker runs it, ends with what the call answered when it ran in the request,
or failed with the error it answered (test cases named, stale draft, a draft changed after the
publish was asked for). A scope missing is 403 with nothing queued; a job delivered twice, or
asked for twice, publishes once; new sources' tokens are shown once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from leads.models import LeadStatus
from routing.admin_jobs import admin_job_run
from routing.config_api.tokens import api_token_create
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigDraft, ConfigSnapshot
from routing.models import AdminJob, Rep, Team, ValueList
from routing.rules_io import rules_import
from tests.leads.factories import LeadFactory
from tests.routing.config_api.jobs import job_done, job_queued, job_read
from tests.routing.factories import AssignmentFactory, user_with_perms
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

BASE = "/api/v1/config/"
CASE = {
    "name": "A lead goes to EMEA SDR",
    "lead": {"email": "someone@acme.com"},
    "expected_status": "assigned",
    "expected_team": "EMEA SDR",
}


def _token(scopes: str, name: str) -> str:
    user = user_with_perms(f"owner-{name}", "read,draft,publish,roster")
    return api_token_create(user=user, name=name, scopes=scopes, actor="test").secret


def _call(client: Any, method: str, url: str, secret: str, body: Any = None) -> Any:
    return getattr(client, method)(
        url,
        body if body is not None else {},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )


@pytest.fixture
def published() -> Any:
    clear_live_config_cache()
    rules_import({**RULES, "test_cases": [CASE]}, publish=True)
    yield
    clear_live_config_cache()


@pytest.fixture
def secret(published: Any) -> str:
    return _token("read,draft,publish", "ci")


def _draft(client: Any, secret: str, patch: dict[str, Any] | None = None) -> int:
    response = _call(client, "post", f"{BASE}drafts/", secret)
    assert response.status_code == 201, response.content
    draft_id = int(response.json()["id"])
    patch = patch or {"value_lists": {"competitors": {"values": ["a.io"]}}}
    changed = _call(client, "patch", f"{BASE}drafts/{draft_id}/", secret, patch)
    assert changed.status_code == 200, changed.content
    return draft_id


def test_a_publish_is_202_and_its_job_ends_with_the_version_it_published(client, secret):
    draft_id = _draft(client, secret)
    diff = _call(client, "get", f"{BASE}drafts/{draft_id}/diff/", secret).json()
    response = _call(client, "post", f"{BASE}drafts/{draft_id}/publish/", secret, {"note": "Q3"})
    queued = job_queued(response)
    assert (queued["kind"], queued["draft"], queued["version"]) == ("publish", draft_id, None)
    assert queued["progress"] == {"done": 0, "total": 1, "percent": 0}
    assert queued["stalled"] is False
    assert ValueList.objects.get().values == ["rival.io"]  # nothing yet: a worker publishes
    assert job_read(client, queued, secret)["status"] == "queued"

    job = job_done(client, response, secret)
    assert job["status"] == "done", job
    assert (job["error"], job["progress"]["percent"], job["phase"]) == (None, 100, "")
    result = job["result"]
    version = _call(client, "get", f"{BASE}versions/2/", secret).json()
    del version["document"]
    # What the publish answered when it ran in the request: the version, the rows in words.
    assert result == {
        "version": version,
        "changes": diff["changes"],
        "failing_test_cases": [],
        "source_tokens": {},
    }
    assert (version["note"], version["kind"], version["published_by"]) == (
        "Q3",
        "draft",
        "token:ci",
    )
    assert ValueList.objects.get().values == ["a.io"]
    assert ConfigDraft.objects.get(pk=draft_id).status == "published"


def test_a_rollback_is_202_and_its_job_ends_with_the_version_it_published(client, secret):
    draft_id = _draft(client, secret)
    assert (
        job_done(
            client, _call(client, "post", f"{BASE}drafts/{draft_id}/publish/", secret), secret
        )["status"]
        == "done"
    )
    response = _call(client, "post", f"{BASE}versions/1/rollback/", secret, {"note": "undo"})
    assert job_queued(response)["version"] == 1
    job = job_done(client, response, secret)
    assert job["status"] == "done", job
    assert (job["kind"], job["result"]["version"]["rolled_back_to"]) == ("rollback", 1)
    assert [c["words"] for c in job["result"]["changes"]] == [
        'Value list "competitors": values a.io → rival.io'
    ]
    assert ValueList.objects.get().values == ["rival.io"]
    missing = _call(client, "post", f"{BASE}versions/9/rollback/", secret)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    assert AdminJob.objects.count() == 2  # nothing queued for a version that does not exist


def test_failing_test_cases_end_the_job_failed_with_each_case_named_unless_forced(client, secret):
    patch = {
        "teams": {"Other": {"members": [{"rep": "ben@example.com"}]}},
        "rules": {"Everyone": {"priority": 20, "action": {"type": "team", "team": "Other"}}},
    }
    draft_id = _draft(client, secret, patch)
    url = f"{BASE}drafts/{draft_id}/publish/"
    job = job_done(client, _call(client, "post", url, secret), secret)
    assert (job["status"], job["result"]) == ("failed", None)
    assert job["error"]["code"] == "test_cases_failing"
    assert job["error"]["fields"] == {
        f"test_cases.{CASE['name']}": ["team is Other, expected EMEA SDR"]
    }
    assert "Nothing was published" in job["error"]["message"]
    assert not Team.objects.filter(name="Other").exists()
    assert ConfigSnapshot.objects.count() == 1
    assert ConfigDraft.objects.get(pk=draft_id).status == "open"

    forced = job_done(client, _call(client, "post", url, secret, {"force": True}), secret)
    assert forced["status"] == "done", forced
    assert forced["result"]["failing_test_cases"] == [CASE["name"]]
    assert forced["result"]["version"]["failing_test_cases"] == [CASE["name"]]
    assert Team.objects.filter(name="Other").exists()


def test_a_draft_changed_after_the_publish_was_asked_for_is_refused_not_published(client, secret):
    draft_id = _draft(client, secret)
    response = _call(client, "post", f"{BASE}drafts/{draft_id}/publish/", secret)
    queued = job_queued(response)
    later = {"value_lists": {"competitors": {"values": ["b.io"]}}}
    assert _call(client, "patch", f"{BASE}drafts/{draft_id}/", secret, later).status_code == 200
    admin_job_run(job_id=queued["id"])
    job = job_read(client, queued, secret)
    assert (job["status"], job["error"]["code"]) == ("failed", "draft_changed"), job
    assert "nothing was done" in job["error"]["message"]
    assert ValueList.objects.get().values == ["rival.io"]  # neither a.io nor b.io
    assert ConfigSnapshot.objects.count() == 1
    assert ConfigDraft.objects.get(pk=draft_id).status == "open"


def test_a_stale_draft_ends_the_job_failed_with_what_was_published_since(client, secret):
    first, second = _draft(client, secret), _draft(client, secret)
    done = job_done(client, _call(client, "post", f"{BASE}drafts/{first}/publish/", secret), secret)
    assert done["status"] == "done"
    job = job_done(client, _call(client, "post", f"{BASE}drafts/{second}/publish/", secret), secret)
    assert (job["status"], job["error"]["code"]) == ("failed", "draft_stale")
    assert job["error"]["fields"]["published_since"] == [
        'Value list "competitors": values rival.io → a.io'
    ]


def test_a_job_delivered_twice_or_asked_for_twice_publishes_once(client, secret):
    draft_id = _draft(client, secret)
    url = f"{BASE}drafts/{draft_id}/publish/"
    first = job_queued(_call(client, "post", url, secret))
    second = job_queued(_call(client, "post", url, secret))  # a double click
    admin_job_run(job_id=first["id"])
    admin_job_run(job_id=first["id"])  # redelivered (acks late): finished, left alone
    admin_job_run(job_id=second["id"])
    done, refused = job_read(client, first, secret), job_read(client, second, secret)
    assert done["status"] == "done"
    assert AdminJob.objects.get(pk=first["id"]).attempt == 1
    assert (refused["status"], refused["error"]["code"]) == ("failed", "draft_closed")
    assert ConfigSnapshot.objects.count() == 2  # the baseline and one publish
    closed = _call(client, "post", url, secret)
    assert (closed.status_code, closed.json()["error"]["code"]) == (409, "draft_closed")
    assert AdminJob.objects.count() == 2  # nothing queued for a closed draft


def test_without_the_scope_it_is_403_and_nothing_is_queued(client, published):
    drafter = _token("read,draft", "drafter")
    draft_id = _draft(client, drafter)
    for url in (f"{BASE}drafts/{draft_id}/publish/", f"{BASE}versions/1/rollback/"):
        response = _call(client, "post", url, drafter)
        assert response.status_code == 403, response.content
        assert response.json()["error"]["code"] == "forbidden"
    assert not AdminJob.objects.exists()

    publisher = _token("publish", "publisher")
    job = job_queued(_call(client, "post", f"{BASE}drafts/{draft_id}/publish/", publisher))
    # The scope that started it reads it, and so does read; another scope does not.
    assert job_read(client, job, publisher)["id"] == job["id"]
    assert job_read(client, job, drafter)["id"] == job["id"]
    draft_only = _token("draft", "draft-only")
    refused = client.get(job["url"], HTTP_AUTHORIZATION=f"Bearer {draft_only}")
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    roster = _token("roster", "hr")
    refused = client.get(job["url"], HTTP_AUTHORIZATION=f"Bearer {roster}")
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    anonymous = client.get(job["url"])
    assert (anonymous.status_code, anonymous.json()["error"]["code"]) == (401, "unauthorized")
    missing = client.get(f"{BASE}jobs/99999/", HTTP_AUTHORIZATION=f"Bearer {publisher}")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    other = AdminJob.objects.create(kind="reroute_away")  # not a job of this API
    hidden = client.get(f"{BASE}jobs/{other.pk}/", HTTP_AUTHORIZATION=f"Bearer {publisher}")
    assert hidden.status_code == 404


def test_a_new_sources_token_is_shown_once_to_the_publish_scope(client, secret):
    patch = {"sources": {"webinar-2": {"name": "Webinar 2"}}}
    draft_id = _draft(client, secret, patch)
    response = _call(client, "post", f"{BASE}drafts/{draft_id}/publish/", secret)
    job = job_queued(response)
    admin_job_run(job_id=job["id"])
    stored = AdminJob.objects.get(pk=job["id"]).result
    assert stored["source_tokens"] == {}  # the token is kept sealed, never in clear
    assert len(str(stored["sealed_source_tokens"])) > 40
    reader = _token("read", "reader")
    assert job_read(client, job, reader)["result"]["source_tokens"] == {}  # not theirs to take
    shown = job_read(client, job, secret)["result"]["source_tokens"]
    assert list(shown) == ["webinar-2"]
    assert len(shown["webinar-2"]) >= 32
    assert shown["webinar-2"] not in str(stored)
    assert job_read(client, job, secret)["result"]["source_tokens"] == {}  # once
    assert "sealed_source_tokens" not in AdminJob.objects.get(pk=job["id"]).result
    intake = client.post(
        "/api/v1/intake/webinar-2/",
        {"email": "x@acme.com"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {shown['webinar-2']}",
    )
    assert intake.status_code == 202, intake.content


def _processed_leads(count: int) -> None:
    rep, team = Rep.objects.get(email="ana@example.com"), Team.objects.get(name="EMEA SDR")
    for i in range(count):
        lead = LeadFactory(
            status=LeadStatus.ASSIGNED,
            email=f"lead{i}@firma.de",
            raw_payload={"email": f"lead{i}@firma.de"},
            processed_at=timezone.now() - timedelta(seconds=count - i),
        )
        AssignmentFactory(lead=lead, rep=rep, team=team, team_name=team.name)


def test_a_large_test_is_a_job_whose_result_is_the_test_the_request_answers(
    client, secret, settings
):
    _processed_leads(12)
    patch = {
        "teams": {"Other": {"members": [{"rep": "ben@example.com"}]}},
        "rules": {"Everyone": {"priority": 20, "action": {"type": "team", "team": "Other"}}},
    }
    draft_id = _draft(client, secret, patch)
    url = f"{BASE}drafts/{draft_id}/test/"
    settings.REPLAY_SYNC_MAX_LEADS = 500
    inline = _call(client, "post", url, secret, {"leads": 12})
    assert inline.status_code == 200, inline.content
    assert not AdminJob.objects.exists()
    assert inline.json()["replay"]["considered"] == 12

    settings.REPLAY_SYNC_MAX_LEADS = 5
    response = _call(client, "post", url, secret, {"leads": 12})
    queued = job_queued(response)
    assert (queued["kind"], queued["progress"]["total"]) == ("test", 12)
    job = job_done(client, response, secret)
    assert job["status"] == "done", job
    assert job["progress"] == {"done": 12, "total": 12, "percent": 100}
    assert job["result"] == inline.json()
    assert job["result"]["failing"] == 1
    # The test scope reads its own job; a publish-only token, which did not start it, not.
    publisher = _token("publish", "publisher")
    refused = client.get(queued["url"], HTTP_AUTHORIZATION=f"Bearer {publisher}")
    assert refused.status_code == 403
