"""POST /api/v1/routing/simulate/: the contract of api.md, auth and errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from rest_framework.authtoken.models import Token

from routing import decisions
from routing.models import Assignment, Team
from tests.leads.factories import SourceFactory
from tests.routing.factories import make_rep, published_ruleset, team_with

URL = "/api/v1/routing/simulate/"


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    decisions.clear_live_config_cache()


@pytest.fixture
def revops(db: Any) -> User:
    user = User.objects.create_user("revops", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_ruleset"))
    return user


def _token(user: User) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Token {Token.objects.get_or_create(user=user)[0].key}"}


def _post(body: Any, **headers: Any) -> Any:
    return Client().post(URL, data=json.dumps(body), content_type="application/json", **headers)


@pytest.fixture
def ruleset(db: Any) -> Team:
    ana = make_rep(email="ana@x.example", name="Ana")
    ben = make_rep(email="ben@x.example", name="Ben")
    team = team_with([ana, ben], name="EMEA SDR", sla_minutes=60)
    published_ruleset(
        {
            "name": "Hot",
            "when": {"all": [{"field": "lead_score", "op": "gte", "value": 80}]},
            "action": {"type": "tag", "priority": "hot", "tags": ["hot"]},
        },
        {
            "name": "Germany",
            "when": {"all": [{"field": "country", "op": "eq", "value": "DE"}]},
            "action": {"type": "team", "team": "EMEA SDR"},
        },
    )
    return team


def test_simulate_returns_the_decision_and_writes_nothing(revops, ruleset):
    response = _post(
        {"Email": "Ana@Acme.com", "Country": "Germany", "lead_score": "90"}, **_token(revops)
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["outcome"] == "owner"
    assert body["rep"] == {"id": body["rep"]["id"], "email": "ana@x.example", "name": "Ana"}
    assert (body["team"], body["rule"], body["sla_minutes"], body["tags"]) == (
        "EMEA SDR",
        "Germany",
        60,
        ["hot"],
    )
    assert body["ruleset_version"] >= 1
    assert body["reason"].startswith("Germany:")
    assert [(t["rule"], t["matched"]) for t in body["trace"]] == [("Hot", True), ("Germany", True)]
    assert all(isinstance(t["why"], str) for t in body["trace"])
    ruleset.refresh_from_db()
    assert ruleset.rotation_state == {}
    assert not Assignment.objects.exists()


def test_envelope_with_source_field_map_and_version(revops, ruleset):
    SourceFactory(slug="webinar", field_map={"Land": "country"})
    version = decisions.live_config().version
    response = _post(
        {
            "lead": {"email": "x@corp.example", "Land": "DE"},
            "source": "webinar",
            "ruleset_version": version,
        },
        **_token(revops),
    )
    assert response.status_code == 200, response.content
    assert response.json()["rule"] == "Germany"
    nothing = _post({"lead": {"email": "x@corp.example", "country": "FR"}}, **_token(revops))
    assert nothing.json()["outcome"] == "nothing"
    assert nothing.json()["rep"] is None


def test_session_auth_works(revops, ruleset):
    client = Client()
    client.force_login(revops)
    response = client.post(URL, data={"email": "a@corp.example"}, content_type="application/json")
    assert response.status_code == 200


def test_unauthenticated_is_401(ruleset):
    response = _post({"email": "a@corp.example"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


def test_without_permission_is_403(ruleset):
    user = User.objects.create_user("sales", password="pw")
    response = _post({"email": "a@corp.example"}, **_token(user))
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


def test_no_published_ruleset_is_404(revops):
    response = _post({"email": "a@corp.example"}, **_token(revops))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "ruleset_not_found"


def test_unknown_version_and_source_are_404(revops, ruleset):
    missing = _post({"lead": {"email": "a@b.example"}, "ruleset_version": 999}, **_token(revops))
    assert missing.json()["error"]["code"] == "ruleset_not_found"
    source = _post({"lead": {"email": "a@b.example"}, "source": "nope"}, **_token(revops))
    assert source.status_code == 404
    assert source.json()["error"]["code"] == "source_not_found"


@pytest.mark.parametrize("body", [[1, 2], "text", None, 3])
def test_a_body_that_is_not_an_object_is_400(revops, ruleset, body):
    response = _post(body, **_token(revops))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_body"


def test_malformed_json_and_bad_envelope_are_400(revops, ruleset):
    response = Client().post(
        URL, data="{not json", content_type="application/json", **_token(revops)
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_body"
    bad = _post({"lead": {"email": "a@b.example"}, "ruleset_version": "x"}, **_token(revops))
    assert bad.status_code == 400
    assert "ruleset_version" in bad.json()["error"]["fields"]


def test_schema_documents_the_endpoint(revops):
    client = Client()
    client.force_login(revops)
    response = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert "/api/v1/routing/simulate/" in response.content.decode()


@pytest.mark.parametrize(
    "body", [b"[" * 50_000, b'{"lead":' * 3000 + b"{}" + b"}" * 3000, b'{"a": 1, "a": 2}']
)
def test_hostile_json_is_a_json_400_not_a_500(body, db):
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    user = User.objects.create_user("sim-hostile")
    user.user_permissions.add(Permission.objects.get(codename="view_ruleset"))
    client = Client()
    client.force_login(user)
    response = client.post("/api/v1/routing/simulate/", data=body, content_type="application/json")
    assert response.status_code == 400, response.content[:200]
    assert response.json()["error"]["code"] == "invalid_body"


def test_simulate_sees_the_same_facts_as_the_worker(db):
    from routing import decisions
    from routing.services import lead_process
    from tests.leads.factories import LeadFactory
    from tests.routing.factories import make_rep, published_ruleset

    decisions.clear_live_config_cache()
    rep = make_rep(email="web@x.example")
    published_ruleset(
        {
            "name": "By website",
            "when": {"all": [{"field": "website", "op": "exists"}]},
            "action": {"type": "rep", "rep": rep.email},
        }
    )
    payload = {"email": "a@acme.com", "website": "https://acme.com"}
    simulated = decisions.simulate(lead_data=payload).decision.outcome
    lead = LeadFactory(raw_payload=payload)
    lead_process(lead_id=lead.id)
    lead.refresh_from_db()
    worker = "owner" if lead.status == "assigned" else "nothing"
    assert simulated == worker
    decisions.clear_live_config_cache()


@pytest.mark.parametrize("version", [2**31, 2**63, 10**30])
def test_a_version_out_of_range_is_a_400_not_a_500(revops, ruleset, version):
    """SQLite cannot bind integers past 2**63 (OverflowError, a 500 before)."""
    response = _post(
        {"lead": {"email": "a@b.example"}, "ruleset_version": version}, **_token(revops)
    )
    assert response.status_code == 400
    assert "ruleset_version" in response.json()["error"]["fields"]
