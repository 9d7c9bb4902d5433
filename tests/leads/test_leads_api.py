"""GET /api/v1/leads/ and /api/v1/leads/<id>/ (token or session auth)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from rest_framework.authtoken.models import Token

from leads.models import LeadStatus
from tests.leads.factories import LeadFactory, SourceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(db):
    user = User.objects.create_user("manager", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    return user


@pytest.fixture
def api(client, viewer):
    token = Token.objects.create(user=viewer)
    client.defaults["HTTP_AUTHORIZATION"] = f"Token {token.key}"
    return client


def test_lead_document_has_the_contract_fields(api):
    lead = LeadFactory(
        email="ana@acme.com", country="DE", employees=250, custom={"x": 1}, flags=["free_email"]
    )
    response = api.get(f"/api/v1/leads/{lead.id}/")
    assert response.status_code == 200
    doc = response.json()
    assert doc["id"] == str(lead.id)
    assert doc["status"] == "received"
    assert doc["source"] == lead.source.slug
    assert doc["fields"] == {
        "email": "ana@acme.com",
        "country": "DE",
        "employees": 250,
        "custom": {"x": 1},
    }
    assert doc["duplicate_of"] is None
    assert doc["assignment"] is None
    assert doc["trace"] == []
    assert [event["type"] for event in doc["events"]] == ["received"]
    assert doc["processed_at"] is None
    assert doc["flags"] == ["free_email"]


def test_unknown_or_malformed_id_is_a_json_404(api):
    for lead_id in ("00000000-0000-0000-0000-000000000000", "nope"):
        response = api.get(f"/api/v1/leads/{lead_id}/")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_auth_is_required_and_permission_checked(client, db):
    lead = LeadFactory()
    response = client.get(f"/api/v1/leads/{lead.id}/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    User.objects.create_user("nobody", password="pw")
    client.login(username="nobody", password="pw")
    response = client.get(f"/api/v1/leads/{lead.id}/")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


def test_session_auth_works(client, viewer):
    client.login(username="manager", password="pw")
    assert client.get("/api/v1/leads/").status_code == 200


def test_list_filters(api):
    web, fair = SourceFactory(slug="web"), SourceFactory(slug="fair")
    now = timezone.now()
    a = LeadFactory(
        source=web, email="ana@acme.com", company="Acme", received_at=now - timedelta(days=2)
    )
    b = LeadFactory(source=fair, email="bo@beta.io", status=LeadStatus.UNASSIGNED, received_at=now)
    c = LeadFactory(source=web, last_name="Acmeson", received_at=now - timedelta(hours=1))

    def ids(query: str) -> list[str]:
        response = api.get(f"/api/v1/leads/?{query}")
        assert response.status_code == 200, response.content
        return [r["id"] for r in response.json()["results"]]

    assert ids("") == [str(b.id), str(c.id), str(a.id)]
    assert ids("status=unassigned") == [str(b.id)]
    assert ids("source=web") == [str(c.id), str(a.id)]
    assert ids("q=acme") == [str(c.id), str(a.id)]
    since = (now - timedelta(days=1)).isoformat().replace("+", "%2B")
    assert ids(f"since={since}") == [str(b.id), str(c.id)]
    assert ids(f"until={since}") == [str(a.id)]


def test_rep_filter_matches_no_lead_until_assignments_exist(api):
    LeadFactory(email="ana@acme.com")
    response = api.get("/api/v1/leads/?rep=ana@example.com")
    assert response.status_code == 200, response.content
    assert response.json()["count"] == 0
    assert response.json()["results"] == []
    assert api.get("/api/v1/leads/?rep=").json()["count"] == 1  # empty: no filter
    response = api.get("/api/v1/leads/?rep=not-an-email")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_filter"
    assert "rep" in response.json()["error"]["fields"]


def test_rep_filter_is_in_the_schema(client, db):
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    params = schema["paths"]["/api/v1/leads/"]["get"]["parameters"]
    assert "rep" in {p["name"] for p in params}


def test_an_unknown_format_is_a_404_with_the_not_found_code(api):
    response = api.get("/api/v1/leads/?format=xml")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_bad_filters_are_400(api):
    response = api.get("/api/v1/leads/?status=bogus")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_filter"
    assert api.get("/api/v1/leads/?since=yesterday").status_code == 400
    # Offsets PostgreSQL would refuse, and instants outside Python's range (found by fuzzing).
    assert api.get("/api/v1/leads/?until=9552-04-09T08:20:45%2B23:05").status_code == 200
    assert api.get("/api/v1/leads/?since=0001-01-01T00:00:00%2B08:00").status_code == 400


def test_list_costs_constant_queries(api, django_assert_max_num_queries):
    for _ in range(20):
        LeadFactory()
    with django_assert_max_num_queries(7):  # token, count, page, assignments, events
        assert len(api.get("/api/v1/leads/").json()["results"]) == 20


def test_schema_and_docs_are_served_without_a_cdn(client, db):
    schema = client.get("/api/v1/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/intake/{slug}/" in paths
    assert "/api/v1/intake/{slug}/batch/" in paths
    assert "/api/v1/leads/{lead_id}/" in paths
    docs = client.get("/api/v1/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "swagger-ui" in html
    assert "cdn" not in html.lower()
    assert "unpkg" not in html.lower()
