"""Issue 20, items 1 and 2: the status URL of an accepted lead, its token, what it reveals, CORS.

In-process (Django's test client, a WSGI request: the status answers at once). The waiting
requests, woken by a real worker through the carriers, are in test_status_wake.py.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from leads.models import LeadStatus, Source
from leads.status import (
    lead_status_read,
    status_link_make,
    status_token_valid,
    status_wait_seconds,
)
from tests.leads.conftest import auth
from tests.leads.factories import LeadFactory, SourceFactory
from tests.routing.factories import AssignmentFactory, make_rep

pytestmark = pytest.mark.django_db

ORIGIN = "https://www.example.com"


def _accepted(client: Client, source: Source, **extra: str) -> dict[str, str]:
    response = client.post(
        f"/api/v1/intake/{source.slug}/",
        json.dumps({"email": "ana@prospect.io", "company": "Prospect"}),
        content_type="application/json",
        **auth(source.slug),
        **extra,
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert response["Location"] == body["status_url"]
    return body


def _not_found_body(response) -> dict[str, object]:  # type: ignore[no-untyped-def]
    assert response.status_code == 404, response.content
    assert response["Content-Type"].startswith("application/json")
    return response.json()


def test_the_202_carries_a_status_url_that_answers_received(client, published):
    source = SourceFactory(slug="webform")
    body = _accepted(client, source)
    answer = client.get(body["status_url"])
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"id": body["id"], "status": "received", "owner": None}
    assert answer["Cache-Control"] == "no-store"


def test_a_replayed_lead_gets_a_status_url_for_the_same_lead(client, published):
    source = SourceFactory(slug="webform")
    first = _accepted(client, source, HTTP_IDEMPOTENCY_KEY="k-1")
    again = _accepted(client, source, HTTP_IDEMPOTENCY_KEY="k-1")
    assert again["id"] == first["id"]
    assert client.get(again["status_url"]).json()["id"] == first["id"]


def test_forged_expired_and_other_leads_tokens_get_the_same_404(client, published):
    source = SourceFactory(slug="webform", status_minutes=1)
    mine = _accepted(client, source)
    other = LeadFactory(source=source)
    prefix, token = mine["status_url"].rstrip("/").rsplit("/", 1)
    expiry, signature = token.split(":")
    old = status_link_make(
        lead_id=mine["id"], source=source, now=timezone.now() - timedelta(seconds=61)
    )
    forged_expiry = format(int(expiry, 16) + 3600, "x")  # a later expiry with the old signature
    urls = {
        "signature changed": f"{prefix}/{expiry}:{signature[:-2]}xx/",
        "expiry pushed back": f"{prefix}/{forged_expiry}:{signature}/",
        "no signature": f"{prefix}/{expiry}/",
        "expired": old.url,
        "another lead's token": f"/api/v1/status/{other.id}/{token}/",
        "not a lead id": f"/api/v1/status/not-a-uuid/{token}/",
        "garbage": "/api/v1/status/%00%ff/%00/",
    }
    answers = {name: client.get(url, HTTP_ORIGIN=ORIGIN) for name, url in urls.items()}
    bodies = {name: _not_found_body(answer) for name, answer in answers.items()}
    assert len({json.dumps(b, sort_keys=True) for b in bodies.values()}) == 1, bodies
    # The same headers too: never cached, and readable by the form page's script (so it shows
    # its fallback at once instead of asking again), whichever origin it is on: the 404 says
    # nothing that requesting the URL outside a browser would not (no cookie is ever read).
    for name, answer in answers.items():
        assert answer["Cache-Control"] == "no-store", name
        assert answer["Access-Control-Allow-Origin"] == "*", name
    assert client.get(mine["status_url"]).status_code == 200  # the real one still works


def test_the_token_lasts_as_long_as_its_source_says():
    source = SourceFactory.build(status_minutes=3)
    now = timezone.now()
    link = status_link_make(lead_id="6f1c1d8e-6a55-4d4f-9d2b-0d9a6e1d2b11", source=source, now=now)
    lead_id, token = link.url.rstrip("/").split("/")[-2:]
    assert link.expires_at == int(now.timestamp()) + 180
    assert status_token_valid(lead_id=lead_id, token=token, now=now + timedelta(seconds=179))
    assert not status_token_valid(lead_id=lead_id, token=token, now=now + timedelta(seconds=181))
    default = SourceFactory.build()
    assert default.status_minutes == 10


def test_a_token_signed_with_another_secret_key_is_refused(settings):
    source = SourceFactory.build()
    now = timezone.now()
    lead_id = "6f1c1d8e-6a55-4d4f-9d2b-0d9a6e1d2b11"
    settings.SECRET_KEY = "another-key-" + "x" * 40
    token = status_link_make(lead_id=lead_id, source=source, now=now).url.rstrip("/").split("/")[-1]
    settings.SECRET_KEY = "the-real-key-" + "y" * 40
    assert status_token_valid(lead_id=lead_id, token=token, now=now) is None


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        (None, 0.0),
        ("", 0.0),
        ("3", 3.0),
        ("2.5", 2.5),
        ("10", 10.0),
        ("11", 10.0),
        ("1e9", 10.0),
        ("-4", 0.0),
        ("inf", 10.0),
    ],
)
def test_wait_is_clamped(raw, seconds):
    assert status_wait_seconds(raw) == seconds


@pytest.mark.parametrize("raw", ["abc", "nan", "1s", "0x10"])
def test_a_wait_that_is_no_number_is_a_400(client, published, raw):
    body = _accepted(client, SourceFactory(slug="webform"))
    response = client.get(body["status_url"], {"wait": raw})
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_wait"
    assert response["Cache-Control"] == "no-store"
    assert response["Access-Control-Allow-Origin"] == "*"


def test_the_sync_web_server_never_holds_a_request(client, published):
    """Under WSGI (gunicorn's sync workers accept leads) ?wait= answers at once."""
    body = _accepted(client, SourceFactory(slug="webform"))
    started = time.monotonic()
    response = client.get(body["status_url"], {"wait": "10"})
    assert response.status_code == 200
    assert response.json()["status"] == "received"
    assert time.monotonic() - started < 2


def _assigned(source: Source, **rep_fields: str):  # type: ignore[no-untyped-def]
    rep = make_rep(
        name="Ana Lima",
        email=f"ana.lima.{source.slug}@northwind.example",
        display_name=rep_fields.pop("display_name", "Ana"),
        photo_url="https://cdn.example.com/ana.jpg",
        booking_url="https://cal.example.com/ana",
        **rep_fields,
    )
    lead = LeadFactory(source=source, status=LeadStatus.ASSIGNED)
    AssignmentFactory(lead=lead, rep=rep, team_name="SDR EMEA", rule_name="By territory")
    return lead


def _status_of(client: Client, lead) -> tuple[dict[str, object], str]:  # type: ignore[no-untyped-def]
    link = status_link_make(lead_id=lead.id, source=lead.source, now=timezone.now())
    response = client.get(link.url)
    assert response.status_code == 200, response.content
    return response.json(), response.content.decode()


def test_an_assigned_lead_shows_the_rep_public_face_by_default_and_nothing_else(client):
    lead = _assigned(SourceFactory(slug="webform"))
    document, text = _status_of(client, lead)
    assert document == {
        "id": str(lead.id),
        "status": "assigned",
        "owner": {
            "name": "Ana",
            "photo_url": "https://cdn.example.com/ana.jpg",
            "booking_url": "https://cal.example.com/ana",
        },
    }
    for secret in ("northwind.example", "SDR EMEA", "By territory", "Lima", "trace"):
        assert secret not in text


def test_a_source_reveals_only_what_it_is_configured_to(client):
    lead = _assigned(SourceFactory(slug="terse", status_reveal=["first_name", "team"]))
    document, _ = _status_of(client, lead)
    assert document["owner"] == {"first_name": "Ana", "team": "SDR EMEA"}
    quiet = _assigned(SourceFactory(slug="quiet", status_reveal=[]), display_name="")
    document, text = _status_of(client, quiet)
    assert document["status"] == "assigned"
    assert document["owner"] == {}
    assert "Ana" not in text


def test_without_a_display_name_the_rep_name_is_shown():
    lead = _assigned(SourceFactory(slug="webform"), display_name="")
    view = lead_status_read(lead_id=lead.id)
    assert view is not None
    assert view.document["owner"]["name"] == "Ana Lima"  # type: ignore[index]


@pytest.mark.parametrize("status", [LeadStatus.EXCLUDED, LeadStatus.UNASSIGNED, LeadStatus.FAILED])
def test_a_lead_without_an_owner_reads_not_assigned_whatever_the_reason(client, status):
    lead = LeadFactory(source=SourceFactory(slug="webform"), status=status)
    document, _ = _status_of(client, lead)
    assert document == {"id": str(lead.id), "status": "not_assigned", "owner": None}


def test_a_duplicate_sticky_to_its_original_owner_reads_assigned(client):
    source = SourceFactory(slug="webform")
    lead = _assigned(source)
    lead.status = LeadStatus.DUPLICATE
    lead.save(update_fields=["status"])
    document, _ = _status_of(client, lead)
    assert document["status"] == "assigned"
    assert document["owner"]["name"] == "Ana"  # type: ignore[index]


def test_cors_only_for_the_origins_the_source_lists(client, published):
    SourceFactory(slug="webform", cors_origins=f"{ORIGIN}/\nhttp://localhost:3000")
    intake = client.post(
        "/api/v1/intake/webform/",
        json.dumps({"email": "bo@prospect.io"}),
        content_type="application/json",
        HTTP_ORIGIN=ORIGIN,
        **auth("webform"),
    )
    assert intake.status_code == 202
    assert intake["Access-Control-Allow-Origin"] == ORIGIN
    url = intake.json()["status_url"]
    allowed = client.get(url, HTTP_ORIGIN=ORIGIN)
    assert allowed["Access-Control-Allow-Origin"] == ORIGIN
    assert "Origin" in allowed["Vary"]
    stranger = client.get(url, HTTP_ORIGIN="https://evil.example.net")
    assert stranger.status_code == 200
    assert not stranger.has_header("Access-Control-Allow-Origin")
    refused = client.post(
        "/api/v1/intake/webform/",
        json.dumps({"email": "cy@prospect.io"}),
        content_type="application/json",
        HTTP_ORIGIN="https://evil.example.net",
        **auth("webform"),
    )
    assert not refused.has_header("Access-Control-Allow-Origin")
    preflight = client.options(url, HTTP_ORIGIN=ORIGIN)
    assert preflight.status_code == 204
    assert preflight["Access-Control-Allow-Origin"] == ORIGIN


def test_a_source_refuses_origins_that_are_not_origins_and_unknown_reveals():
    from django.core.exceptions import ValidationError

    for field, value in [
        ("cors_origins", "https://www.example.com/contact"),
        ("cors_origins", "www.example.com"),
        ("cors_origins", "javascript:alert(1)"),
        ("status_reveal", ["email"]),
        ("status_reveal", "name"),
    ]:
        source = SourceFactory.build(**{field: value})
        with pytest.raises(ValidationError) as caught:
            source.clean()
        assert field in caught.value.message_dict


def test_the_rep_public_face_is_edited_in_the_admin(admin_client):
    rep = make_rep(name="Ana Lima", email="ana.lima@northwind.example")
    page = admin_client.get(f"/admin/routing/rep/{rep.pk}/change/").content.decode()
    for name in ("display_name", "photo_url", "booking_url"):
        assert f'name="{name}"' in page
    source = SourceFactory(slug="webform")
    page = admin_client.get(f"/admin/leads/source/{source.pk}/change/").content.decode()
    for name in ("status_minutes", "status_reveal", "cors_origins"):
        assert f'name="{name}"' in page


def test_the_embed_script_is_served_small_and_plain(client):
    response = client.get("/embed/owner.js")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/javascript")
    assert len(response.content) < 8 * 1024
    script = response.content.decode()
    assert "innerHTML" not in script  # the rep's name is text, never markup
    assert "import " not in script
    assert "require(" not in script


def test_the_status_url_is_in_the_openapi_document_as_it_answers(client, published):
    """The status URL (a plain async view, added by leads.openapi) is documented, and what it
    answers validates against what is documented."""
    import jsonschema
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    operations = schema["paths"]["/api/v1/status/{lead_id}/{token}/"]
    assert set(operations) == {"get", "options"}
    get = operations["get"]
    assert get["security"] == []
    assert {p["name"] for p in get["parameters"]} == {"lead_id", "token", "wait"}
    path = _accepted(client, SourceFactory(slug="webform"))["status_url"]
    answer = client.get(path)
    document = _json_schema(get["responses"]["200"]["content"]["application/json"]["schema"])
    jsonschema.validate(answer.json(), document)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**answer.json(), "status": "excluded"}, document)
    error = get["responses"]["404"]["content"]["application/json"]["schema"]
    jsonschema.validate(client.get(path[:-2] + "x/").json(), error)


def _json_schema(openapi: object) -> object:
    """An OpenAPI 3.0 schema as JSON Schema (``nullable: true`` is a type that admits null)."""
    if isinstance(openapi, list):
        return [_json_schema(item) for item in openapi]
    if not isinstance(openapi, dict):
        return openapi
    out = {key: _json_schema(value) for key, value in openapi.items() if key != "nullable"}
    if openapi.get("nullable"):
        out["type"] = [openapi["type"], "null"]
    return out


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_a_write_to_the_status_url_is_a_json_405_not_a_csrf_page(published, method):
    """Even with CSRF checks on (as for a browser), the status URL answers a write with the
    API's 405 and the methods it serves; the embed script's URL too."""
    csrf_client = Client(enforce_csrf_checks=True)
    lead = LeadFactory(source=SourceFactory(slug="webform"))
    url = status_link_make(lead_id=lead.id, source=lead.source, now=timezone.now()).url
    for path, allow in ((url, "GET, HEAD, OPTIONS"), ("/embed/owner.js", "GET, HEAD")):
        response = getattr(csrf_client, method)(path, "{}", content_type="application/json")
        assert response.status_code == 405, (path, response.content)
        assert response["Content-Type"].startswith("application/json")
        assert response["Allow"] == allow
        assert response.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize("assigned", [True, False])
def test_the_status_read_is_one_query(django_assert_num_queries, assigned):
    """The lead, its source's settings, its current assignment and rep: one LEFT JOIN, whether
    the lead is assigned, still waiting or finished without an owner."""
    source = SourceFactory(slug="webform")
    if assigned:
        lead = _assigned(source)
    else:
        lead = LeadFactory(source=source, status=LeadStatus.UNASSIGNED)
    with django_assert_num_queries(1):
        view = lead_status_read(lead_id=lead.id)
    assert view is not None
    assert view.document["status"] == ("assigned" if assigned else "not_assigned")
    if assigned:
        assert view.document["owner"]["name"] == "Ana"
    pending = LeadFactory(source=source)
    with django_assert_num_queries(1):
        view = lead_status_read(lead_id=pending.id)
    assert view is not None
    assert view.document == {"id": str(pending.id), "status": "received", "owner": None}
