"""The configuration API: scopes (403 and nothing written), drafts read/replace/patch, validate,
test, diff, publish all or nothing (invalid document, failing test case, stale draft), rollback,
every error in the API's JSON shape, and the audit trail by token."""

from __future__ import annotations

from typing import Any

import pytest

from audit.models import Event, EventType
from routing.config_api.tokens import api_token_create
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigDraft, ConfigSnapshot
from routing.models import RuleSet, Team, Territory
from routing.rules_io import rules_import
from tests.routing.config_api.jobs import job_done
from tests.routing.factories import user_with_perms
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

BASE = "/api/v1/config/"
CASE = {
    "name": "A lead goes to EMEA SDR",
    "lead": {"email": "someone@acme.com"},
    "expected_status": "assigned",
    "expected_team": "EMEA SDR",
}
ALL = "read,draft,publish"


def _token(scopes: str, name: str = "ci") -> str:
    user = user_with_perms("pipeline", ALL)
    return api_token_create(user=user, name=name, scopes=scopes, actor="test").secret


def _call(client: Any, method: str, url: str, secret: str, body: Any = None) -> Any:
    return getattr(client, method)(
        url,
        body if body is not None else {},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )


def _published(client: Any, url: str, secret: str, body: Any = None) -> dict[str, Any]:
    """A publish or rollback: 202 and a job, run by the worker, done; its result."""
    job = job_done(client, _call(client, "post", url, secret, body), secret)
    assert job["status"] == "done", job
    return dict(job["result"])


def _refused_job(client: Any, url: str, secret: str, code: str, body: Any = None) -> dict[str, Any]:
    """A publish or rollback: 202 and a job, which ends failed with the error ``code``."""
    job = job_done(client, _call(client, "post", url, secret, body), secret)
    assert job["status"] == "failed", job
    assert job["error"]["code"] == code, job["error"]
    assert job["error"]["message"]
    return dict(job["error"])


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"]
    return error


@pytest.fixture
def published() -> Any:
    clear_live_config_cache()
    rules_import({**RULES, "test_cases": [CASE]}, publish=True)
    yield
    clear_live_config_cache()


def _draft(client: Any, secret: str) -> int:
    response = _call(client, "post", f"{BASE}drafts/", secret, {"note": "move Bavaria"})
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def test_reading_needs_read_and_a_token_without_the_scope_writes_nothing(client, published):
    roster = _token("roster", name="hr")
    _error(_call(client, "get", BASE, roster), 403, "forbidden")
    _error(_call(client, "post", f"{BASE}drafts/", roster), 403, "forbidden")
    reader = _token("read", name="reader")
    body = _call(client, "get", BASE, reader).json()
    assert body["document"]["teams"][0]["name"] == "EMEA SDR"
    assert body["live_edits"] is False
    _error(_call(client, "post", f"{BASE}drafts/", reader), 403, "forbidden")
    assert not ConfigDraft.objects.exists()
    drafter = _token("read,draft", name="drafter")
    draft_id = _draft(client, drafter)
    patch = {"value_lists": {"competitors": {"values": ["x.io"]}}}
    _error(_call(client, "patch", f"{BASE}drafts/{draft_id}/", reader, patch), 403, "forbidden")
    assert ConfigDraft.objects.get().document["value_lists"][0]["values"] == ["rival.io"]
    _error(_call(client, "post", f"{BASE}drafts/{draft_id}/publish/", drafter), 403, "forbidden")
    _error(_call(client, "post", f"{BASE}versions/1/rollback/", drafter), 403, "forbidden")
    assert ConfigSnapshot.objects.count() == 1  # the baseline only
    _error(_call(client, "get", BASE, "lrt_nonsense"), 401, "unauthorized")


def test_a_draft_is_changed_checked_diffed_and_published_through_the_api(client, published):
    secret = _token(ALL)
    draft_id = _draft(client, secret)
    draft = _call(client, "get", f"{BASE}drafts/{draft_id}/", secret).json()
    assert (draft["status"], draft["base_version"]) == ("open", 1)
    patch = {
        "teams": {"DACH AE": {"members": [{"rep": "ben@example.com"}]}},
        "territories": {"Bavaria": {"countries": ["DE"], "regions": ["BY"], "team": "DACH AE"}},
        "rules": {
            "Bavaria": {
                "priority": 5,
                "when": {"all": [{"field": "region", "op": "eq", "value": "BY"}]},
                "action": {"type": "team", "team": "DACH AE"},
            }
        },
    }
    assert _call(client, "patch", f"{BASE}drafts/{draft_id}/", secret, patch).status_code == 200
    valid = _call(client, "post", f"{BASE}drafts/{draft_id}/validate/", secret).json()
    assert valid == {"valid": True, "errors": []}
    tested = _call(client, "post", f"{BASE}drafts/{draft_id}/test/", secret, {"leads": 10}).json()
    assert tested["failing"] == 0
    assert tested["test_cases"][0]["outcome"]["team"] == "EMEA SDR"
    diff = _call(client, "get", f"{BASE}drafts/{draft_id}/diff/", secret).json()
    assert diff["stale"] is False
    words = [change["words"] for change in diff["changes"]]
    assert 'Territory "Bavaria" added: countries DE; regions BY; team DACH AE' in words
    assert not Territory.objects.exists()

    published = _published(client, f"{BASE}drafts/{draft_id}/publish/", secret, {"note": "Q3"})
    version = published["version"]
    assert (version["number"], version["kind"], version["note"]) == (2, "draft", "Q3")
    assert Territory.objects.get().name == "Bavaria"
    assert version["ruleset_version"] == RuleSet.objects.get(status="published").version
    listed = _call(client, "get", f"{BASE}versions/", secret).json()
    assert [v["number"] for v in listed["results"]] == [2, 1]
    one = _call(client, "get", f"{BASE}versions/2/", secret).json()
    assert one["document"]["territories"][0]["name"] == "Bavaria"
    event = Event.objects.filter(type=EventType.CONFIG_CHANGED, data__action="published").get()
    assert event.actor == "token:ci"
    _error(_call(client, "post", f"{BASE}drafts/{draft_id}/publish/", secret), 409, "draft_closed")


def test_an_invalid_document_is_refused_with_paths_and_publish_is_all_or_nothing(client, published):
    secret = _token(ALL)
    draft_id = _draft(client, secret)
    document = _call(client, "get", f"{BASE}drafts/{draft_id}/", secret).json()["document"]
    document["teams"][0]["strategy"] = "random"
    document["territories"] = [{"name": "X", "countries": ["DE"], "team": "Ghost"}]
    error = _error(
        _call(client, "put", f"{BASE}drafts/{draft_id}/", secret, document), 400, "invalid_document"
    )
    assert set(error["fields"]) == {"teams[0].strategy", "territories[0].team"}
    error = _error(
        _call(client, "patch", f"{BASE}drafts/{draft_id}/", secret, {"widgets": {}}),
        400,
        "invalid_document",
    )
    assert "widgets" in error["fields"]
    assert ConfigDraft.objects.get().document["teams"][0]["strategy"] == "round_robin"
    _error(
        _call(client, "post", f"{BASE}drafts/{draft_id}/test/", secret, {"leads": "ten"}),
        400,
        "invalid_body",
    )
    _error(
        _call(client, "post", f"{BASE}drafts/{draft_id}/publish/", secret, {"force": "yes"}),
        400,
        "invalid_body",
    )
    _error(_call(client, "get", f"{BASE}drafts/999/", secret), 404, "not_found")
    _error(_call(client, "get", f"{BASE}versions/77/", secret), 404, "not_found")


def test_a_failing_test_case_refuses_the_publish_with_422_unless_forced(client, published):
    secret = _token(ALL)
    draft_id = _draft(client, secret)
    patch = {
        "teams": {"Other": {"members": [{"rep": "ben@example.com"}]}},
        "rules": {"Everyone": {"priority": 20, "action": {"type": "team", "team": "Other"}}},
    }
    assert _call(client, "patch", f"{BASE}drafts/{draft_id}/", secret, patch).status_code == 200
    tested = _call(client, "post", f"{BASE}drafts/{draft_id}/test/", secret).json()
    assert tested["failing"] == 1
    error = _refused_job(client, f"{BASE}drafts/{draft_id}/publish/", secret, "test_cases_failing")
    assert error["fields"] == {f"test_cases.{CASE['name']}": ["team is Other, expected EMEA SDR"]}
    assert not Team.objects.filter(name="Other").exists()
    assert ConfigSnapshot.objects.count() == 1
    forced = _published(client, f"{BASE}drafts/{draft_id}/publish/", secret, {"force": True})
    assert forced["failing_test_cases"] == [CASE["name"]]
    assert Team.objects.filter(name="Other").exists()


def test_a_stale_draft_is_409_with_what_was_published_since(client, published):
    secret = _token(ALL)
    first, second = _draft(client, secret), _draft(client, secret)
    patch = {"value_lists": {"competitors": {"values": ["a.io"]}}}
    _call(client, "patch", f"{BASE}drafts/{first}/", secret, patch)
    _published(client, f"{BASE}drafts/{first}/publish/", secret)
    diff = _call(client, "get", f"{BASE}drafts/{second}/diff/", secret).json()
    assert diff["stale"] is True
    assert [c["words"] for c in diff["published_since"]] == [
        'Value list "competitors": values rival.io → a.io'
    ]
    error = _refused_job(client, f"{BASE}drafts/{second}/publish/", secret, "draft_stale")
    assert error["fields"]["published_since"] == [
        'Value list "competitors": values rival.io → a.io'
    ]
    assert ConfigSnapshot.objects.count() == 2
    rebased = _call(client, "post", f"{BASE}drafts/{second}/rebase/", secret)
    assert rebased.status_code == 200, rebased.content
    assert rebased.json()["base_version"] == 2
    _published(client, f"{BASE}drafts/{second}/publish/", secret)


def test_rollback_through_the_api(client, published):
    secret = _token(ALL)
    draft_id = _draft(client, secret)
    patch = {"value_lists": {"competitors": {"values": ["a.io"]}}}
    _call(client, "patch", f"{BASE}drafts/{draft_id}/", secret, patch)
    _published(client, f"{BASE}drafts/{draft_id}/publish/", secret)
    body = _published(client, f"{BASE}versions/1/rollback/", secret, {"note": "undo"})
    assert (body["version"]["number"], body["version"]["rolled_back_to"]) == (3, 1)
    assert [c["words"] for c in body["changes"]] == [
        'Value list "competitors": values a.io → rival.io'
    ]
    _error(_call(client, "post", f"{BASE}versions/9/rollback/", secret), 404, "not_found")
    draft = _call(client, "delete", f"{BASE}drafts/{_draft(client, secret)}/", secret)
    assert draft.json()["status"] == "discarded"


def test_nothing_published_is_a_409_for_a_new_draft(client):
    _error(_call(client, "post", f"{BASE}drafts/", _token(ALL)), 409, "nothing_published")
    _error(_call(client, "get", BASE, _token("read", name="r")), 404, "not_found")


def test_publishing_an_invalid_document_is_400_and_writes_nothing(client, published):
    secret = _token(ALL)
    draft_id = _draft(client, secret)
    draft = ConfigDraft.objects.get(pk=draft_id)
    # A document stored before the checks it now fails (an older release, a database edit).
    document = {**draft.document, "teams": [{"name": "EMEA SDR", "strategy": "random"}]}
    document["value_lists"] = [{"name": "competitors", "values": ["z.io"]}]
    ConfigDraft.objects.filter(pk=draft_id).update(document=document)
    error = _refused_job(client, f"{BASE}drafts/{draft_id}/publish/", secret, "invalid_document")
    assert list(error["fields"]) == ["teams[0].strategy"]
    valid = _call(client, "post", f"{BASE}drafts/{draft_id}/validate/", secret).json()
    assert valid["valid"] is False
    assert valid["errors"][0]["path"] == "teams[0].strategy"
    assert ConfigSnapshot.objects.count() == 1
    assert _competitors() == ["rival.io"]  # nothing of it written


def test_removing_a_row_live_leads_need_is_409_prune_refused(client, published):
    from tests.leads.factories import LeadFactory

    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    secret = _token(ALL)
    draft_id = _draft(client, secret)
    slug = lead.source.slug
    patch = {"sources": {slug: None}, "value_lists": {"competitors": {"values": ["q.io"]}}}
    assert _call(client, "patch", f"{BASE}drafts/{draft_id}/", secret, patch).status_code == 200
    error = _refused_job(client, f"{BASE}drafts/{draft_id}/publish/", secret, "prune_refused")
    assert error["fields"]["sources"] == [
        f'"{slug}" is not in the file but leads came from it: keep it in the file'
    ]
    assert _competitors() == ["rival.io"]
    assert ConfigSnapshot.objects.count() == 1


def _competitors() -> list[str]:
    from routing.models import ValueList

    return list(ValueList.objects.get(name="competitors").values)


def test_a_territory_csv_lands_in_the_draft_with_row_precise_errors(client, published):
    secret = _token(ALL)
    draft_id = _draft(client, secret)
    url = f"{BASE}drafts/{draft_id}/tables/"
    bad = (
        "territory,country,region,postal_prefix,team,rep\n"
        "Bavaria,XX,BY,,EMEA SDR,\nNorth,DE,,,Ghost,\n"
    )
    error = _error(
        _call(client, "post", url, secret, {"table": "territories", "csv": bad}), 400, "invalid_csv"
    )
    assert error["fields"]["csv"] == [
        'row 2, column country: unknown country code "XX" (ISO 3166-1 alpha-2, e.g. DE)',
        'row 3, column team: no team named "Ghost" in the draft',
    ]
    assert ConfigDraft.objects.get().document["territories"] == []
    good = (
        "territory,country,region,postal_prefix,team,rep\n"
        "Bavaria,DE,BY,,EMEA SDR,\nBavaria,AT,,,,\nBerlin,DE,BE,,,ana@example.com\n"
    )
    done = _call(client, "post", url, secret, {"table": "territories", "csv": good})
    assert done.status_code == 200, done.content
    assert (done.json()["rows"], done.json()["set"]) == (3, 2)
    territories = ConfigDraft.objects.get().document["territories"]
    assert territories[0] == {
        "name": "Bavaria",
        "countries": ["DE", "AT"],
        "regions": ["BY"],
        "postal_prefixes": [],
        "team": "EMEA SDR",
    }
    assert not Territory.objects.exists()  # only the draft
    words = [
        c["words"]
        for c in _call(client, "get", f"{BASE}drafts/{draft_id}/diff/", secret).json()["changes"]
    ]
    assert (
        'Territory "Berlin" added: countries DE; postal prefixes none; regions BE; '
        "rep ana@example.com" in words
    )
    _error(_call(client, "post", url, secret, {"table": "leads", "csv": ""}), 400, "invalid_body")
    accounts = "domain,name,owner_email,tier\nacme.com,Acme,ben@example.com,enterprise\n"
    done = _call(client, "post", url, secret, {"table": "accounts", "csv": accounts})
    assert done.status_code == 200, done.content
    assert ConfigDraft.objects.get().document["accounts"] == [
        {"domain": "acme.com", "name": "Acme", "owner": "ben@example.com", "tier": "enterprise"}
    ]
    only = "territory,country,region,postal_prefix,team,rep\nBerlin,DE,BE,,,ana@example.com\n"
    done = _call(
        client, "post", url, secret, {"table": "territories", "csv": only, "delete_missing": True}
    )
    assert done.json()["removed"] == 1
    assert [t["name"] for t in ConfigDraft.objects.get().document["territories"]] == ["Berlin"]
    _published(client, f"{BASE}drafts/{draft_id}/publish/", secret)
    assert list(Territory.objects.values_list("name", flat=True)) == ["Berlin"]
