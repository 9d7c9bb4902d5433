"""Scoped API tokens and the roster API: scopes, CRUD, validation, re-routing, absences, audit."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone
from rest_framework.authtoken.models import Token

from audit.models import Event, EventType
from routing.config_api.models import ApiToken
from routing.config_api.tokens import api_token_create, api_token_revoke
from routing.decisions import clear_live_config_cache
from routing.models import Assignment, Rep
from routing.rules_io import rules_import
from routing.timeoff.models import RepAbsence
from tests.routing.factories import user_with_perms
from tests.routing.test_lead_actions import _assigned
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

BASE = "/api/v1/config/roster/reps/"


def _token(scopes: str, name: str = "hr-sync", **kwargs) -> str:  # type: ignore[no-untyped-def]
    user = user_with_perms("sync", "read,roster")
    return api_token_create(user=user, name=name, scopes=scopes, actor="test", **kwargs).secret


def _call(client, method, url, secret, body=None):  # type: ignore[no-untyped-def]
    return getattr(client, method)(
        url,
        body if body is not None else {},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )


@pytest.fixture
def rules():  # type: ignore[no-untyped-def]
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield
    clear_live_config_cache()


def _config_events(actor: str) -> list[dict]:  # type: ignore[type-arg]
    return [
        e.data
        for e in Event.objects.filter(type=EventType.CONFIG_CHANGED, actor=actor).order_by("id")
    ]


def test_only_a_hash_is_stored_and_the_command_prints_the_secret_once():
    User.objects.create(username="rita")
    out = StringIO()
    call_command(
        "api_token_create",
        "--user=rita",
        "--scopes=roster,read",
        "--name=hr",
        "--expires-days=30",
        stdout=out,
        stderr=StringIO(),
    )
    secret = out.getvalue().strip()
    token = ApiToken.objects.get(name="hr")
    assert token.scopes == ["read", "roster"]
    assert secret.startswith("lrt_")
    assert len(secret) > 40
    assert secret not in str(ApiToken.objects.filter(pk=token.pk).values().first())
    assert token.expires_at is not None
    # The audit event of its creation redacts the hash.
    assert "[redacted]" in str(_config_events("command:api_token_create"))


def test_a_token_without_the_scope_is_403_and_writes_nothing(client):
    secret = _token("read")
    response = _call(client, "post", BASE, secret, {"email": "x@example.com", "name": "X"})
    assert response.status_code == 403, response.json()
    assert response.json()["error"]["code"] == "forbidden"
    assert "roster" in response.json()["error"]["message"]
    assert not Rep.objects.exists()
    assert not _config_events("token:hr-sync")
    # ... and the read-only token reads.
    assert _call(client, "get", BASE, secret).status_code == 200


def test_expired_revoked_and_unknown_tokens_are_401(client):
    expired = _token("roster,read", name="old")
    ApiToken.objects.filter(name="old").update(expires_at=timezone.now() - timedelta(seconds=1))
    revoked = _token("roster,read", name="gone")
    api_token_revoke(token_id=ApiToken.objects.get(name="gone").pk, actor="test")
    for secret, why in ((expired, "expired"), (revoked, "revoked"), ("lrt_nope", "Invalid")):
        response = _call(client, "get", BASE, secret)
        assert response.status_code == 401, response.content
        assert response.json()["error"]["code"] == "unauthorized"
        assert why in response.json()["error"]["message"]


def test_a_scoped_token_does_not_open_other_endpoints_and_old_tokens_still_work(client):
    secret = _token("roster,read")
    assert _call(client, "get", "/api/v1/leads/", secret).status_code == 403
    user = User.objects.create(username="legacy")
    key = Token.objects.create(user=user).key
    assert client.get("/api/v1/leads/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 403
    # a user's legacy token on the roster needs the Django permission instead of a scope
    assert client.get(BASE, HTTP_AUTHORIZATION=f"Token {key}").status_code == 403


def test_create_read_update_upsert_and_audit(client):
    secret = _token("roster,read")
    created = _call(
        client,
        "post",
        BASE,
        secret,
        {"email": "ana@example.com", "name": "Ana", "timezone": "Europe/Berlin", "max_open": 5},
    )
    assert created.status_code == 201, created.json()
    rep_id = created.json()["id"]
    assert created.json()["available"] is True
    again = _call(client, "post", BASE, secret, {"email": "ANA@example.com", "name": "Ana"})
    assert again.status_code == 409
    assert _call(client, "get", f"{BASE}ANA@example.com/", secret).json()["id"] == rep_id
    patched = _call(client, "patch", f"{BASE}{rep_id}/", secret, {"max_per_day": 20})
    assert patched.status_code == 200
    assert (patched.json()["max_open"], patched.json()["max_per_day"]) == (5, 20)
    put = _call(client, "put", f"{BASE}ben@example.com/", secret, {"name": "Ben"})
    assert put.status_code == 201, put.json()
    put_again = _call(client, "put", f"{BASE}ben@example.com/", secret, {"name": "Ben"})
    assert put_again.status_code == 200
    listed = _call(client, "get", BASE, secret).json()
    assert [r["email"] for r in listed["results"]] == ["ana@example.com", "ben@example.com"]
    actions = [(e["object"], e["action"]) for e in _config_events("token:hr-sync")]
    assert ("Ana <ana@example.com>", "added") in actions
    assert ("Ana <ana@example.com>", "changed") in actions
    assert ("Ben <ben@example.com>", "added") in actions
    assert len(actions) == 3  # the second PUT changed nothing


def test_validation_errors_name_the_path_and_write_nothing(client):
    secret = _token("roster,read")
    Rep.objects.create(email="ana@example.com", name="Ana")
    response = _call(
        client,
        "patch",
        f"{BASE}ana@example.com/",
        secret,
        {"timezone": "Mars/Olympus", "working_hours": {"days": [9]}, "max_open": 0, "x": 1},
    )
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert set(fields) >= {"timezone", "working_hours.days[0]", "max_open", "x"}
    assert Rep.objects.get().max_open is None
    assert _call(client, "post", BASE, secret, [1]).status_code == 400
    bad = _call(client, "put", f"{BASE}not-an-email/", secret, {"name": "N"})
    assert bad.status_code == 400
    assert "email" in bad.json()["error"]["fields"]
    assert _call(client, "get", f"{BASE}nobody@example.com/", secret).status_code == 404


def test_deactivating_reroutes_the_untouched_leads(
    client, rules, django_capture_on_commit_callbacks
):
    secret = _token("roster,read")
    leads = [_assigned(f"p{i}@acme.com") for i in range(2)]  # ana, ben
    with django_capture_on_commit_callbacks(execute=True):
        response = _call(client, "delete", f"{BASE}ana@example.com/", secret)
    assert response.status_code == 200
    assert response.json()["active"] is False
    assert Assignment.objects.get(lead=leads[0], active=True).rep.email == "ben@example.com"
    actions = [e["action"] for e in _config_events("token:hr-sync")]
    assert actions == ["deactivate", "reroute_away"]


def test_out_of_office_by_patch_reroutes_too(client, rules, django_capture_on_commit_callbacks):
    secret = _token("roster")
    leads = [_assigned(f"p{i}@acme.com") for i in range(2)]
    until = (timezone.now() + timedelta(days=2)).isoformat()
    with django_capture_on_commit_callbacks(execute=True):
        response = _call(
            client, "patch", f"{BASE}ana@example.com/", secret, {"out_of_office_until": until}
        )
    assert response.status_code == 200, response.json()
    assert Assignment.objects.get(lead=leads[0], active=True).rep.email == "ben@example.com"


def test_absences_add_list_cancel(client):
    secret = _token("roster,read")
    rep = Rep.objects.create(email="ana@example.com", name="Ana", timezone="Europe/Berlin")
    url = f"{BASE}ana@example.com/absences/"
    start = timezone.now() + timedelta(days=3)
    body = {"from": start.isoformat(), "to": (start + timedelta(days=5)).isoformat()}
    added = _call(client, "post", url, secret, {**body, "note": "Holiday"})
    assert added.status_code == 201, added.json()
    overlapping = _call(client, "post", url, secret, body)
    assert overlapping.status_code == 400
    bad = _call(client, "post", url, secret, {"from": "tomorrow"})
    assert bad.status_code == 400
    assert set(bad.json()["error"]["fields"]) == {"to"}  # "is required"
    assert [a["note"] for a in _call(client, "get", url, secret).json()] == ["Holiday"]
    absence_id = added.json()["id"]
    assert _call(client, "delete", f"{url}{absence_id}/", secret).status_code == 204
    assert not RepAbsence.objects.filter(rep=rep).exists()
    assert _call(client, "delete", f"{url}{absence_id}/", secret).status_code == 404
    actions = [e["action"] for e in _config_events("token:hr-sync")]
    assert actions == ["added", "deleted"]


def test_the_admin_shows_a_new_secret_once_on_the_page_and_revokes(admin_client):
    user = User.objects.create(username="hr")
    response = admin_client.post(
        "/admin/routing/apitoken/add/",
        {"name": "hr-sync", "user": user.pk, "scopes": ["roster", "read"]},
    )
    assert response.status_code == 200, response.content[:1000]
    assert "no-store" in response["Cache-Control"]
    token = ApiToken.objects.get(name="hr-sync")
    secret = response.context["secret"]
    assert secret in response.content.decode()
    assert token.token_hash != secret
    assert not list(response.wsgi_request._messages)  # never in a message (a cookie)
    admin_client.post(
        "/admin/routing/apitoken/",
        {"action": "revoke", "_selected_action": [token.pk]},
    )
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_a_moment_before_the_first_utc_one_is_a_400_not_a_500(client):
    """Found by the schemathesis run: an offset pushing year 1 before UTC's first moment."""
    secret = _token("roster")
    Rep.objects.create(email="ana@example.com", name="Ana")
    response = _call(
        client,
        "post",
        f"{BASE}ana@example.com/absences/",
        secret,
        {"from": "0001-01-01T00:17:40+01:41", "to": "0009-01-01T01:14:07Z"},
    )
    assert response.status_code == 400, response.content
    assert "out of range" in str(response.json()["error"]["fields"])
    assert not RepAbsence.objects.exists()


def test_a_reference_of_unicode_digits_is_an_e_mail_not_an_id_and_a_404_not_a_500(client):
    # str.isdigit() is true of "2³", which int() refuses: found by the schemathesis run.
    Rep.objects.create(email="ana@example.com", name="Ana")
    secret = _token("read,roster")
    for method in ("get", "patch", "delete"):
        response = _call(client, method, f"{BASE}2³/", secret)
        assert response.status_code == 404, (method, response.content)
        assert response.json()["error"]["code"] == "not_found"
    response = _call(client, "put", f"{BASE}2³/", secret, {"name": "X"})
    assert response.status_code == 400, response.content
    assert "email" in response.json()["error"]["fields"]
    assert Rep.objects.count() == 1


def _last_sunday(year: int, month: int) -> date:
    day = date(year, month + 1, 1) - timedelta(days=1)
    return day - timedelta(days=(day.weekday() + 1) % 7)


def test_absence_times_without_an_offset_are_the_reps_wall_clock_across_dst(client):
    # docs/api.md, "Roster": a date-time without an offset is a wall-clock time in the rep's
    # zone; one the clocks skip is a 400 naming the key; a repeated one is taken the first time;
    # an explicit offset is honoured; the answer shows the moments and the local times.
    secret = _token("roster,read")
    Rep.objects.create(email="ana@example.com", name="Ana", timezone="Europe/Berlin")
    Rep.objects.create(email="nia@example.com", name="Nia", timezone="America/New_York")
    year = timezone.now().year + 1
    spring, autumn = _last_sunday(year, 3), _last_sunday(year, 10)  # the EU's DST changes
    url = f"{BASE}ana@example.com/absences/"

    before, after = spring - timedelta(days=1), spring + timedelta(days=2)
    body = {"from": f"{before}T09:00", "to": f"{after}T09:00", "note": "over the change"}
    added = _call(client, "post", url, secret, body)
    assert added.status_code == 201, added.content
    shown = added.json()
    assert shown["timezone"] == "Europe/Berlin"
    assert (shown["from_local"], shown["to_local"]) == (
        f"{before}T09:00:00+01:00",
        f"{after}T09:00:00+02:00",
    )
    absence = RepAbsence.objects.get(pk=shown["id"])
    assert absence.starts_at == datetime.combine(before, time(8), tzinfo=UTC)
    assert absence.ends_at == datetime.combine(after, time(7), tzinfo=UTC)
    assert _call(client, "get", url, secret).json() == [shown]

    skipped = _call(
        client, "post", url, secret, {"from": f"{spring}T02:30", "to": f"{after}T12:00"}
    )
    assert skipped.status_code == 400, skipped.content
    error = skipped.json()["error"]
    assert error["code"] == "invalid_body"
    assert "does not exist in Europe/Berlin" in error["fields"]["from"][0]

    repeated = _call(
        client, "post", url, secret, {"from": f"{autumn}T02:30", "to": f"{autumn}T05:00"}
    )
    assert repeated.status_code == 201, repeated.content
    assert repeated.json()["from_local"] == f"{autumn}T02:30:00+02:00"  # the first 02:30
    assert RepAbsence.objects.get(pk=repeated.json()["id"]).starts_at == datetime.combine(
        autumn, time(0, 30), tzinfo=UTC
    )

    day = date(year, 5, 4)
    explicit = _call(
        client, "post", url, secret, {"from": f"{day}T00:00:00Z", "to": f"{day}T12:00:00+02:00"}
    )
    assert explicit.status_code == 201, explicit.content
    assert (explicit.json()["from_local"], explicit.json()["to_local"]) == (
        f"{day}T02:00:00+02:00",
        f"{day}T12:00:00+02:00",
    )
    assert RepAbsence.objects.get(pk=explicit.json()["id"]).ends_at == datetime.combine(
        day, time(10), tzinfo=UTC
    )

    # Another rep, another zone: the same wall-clock midnight is another moment.
    nia = _call(
        client,
        "post",
        f"{BASE}nia@example.com/absences/",
        secret,
        {"from": f"{day}T00:00", "to": f"{day + timedelta(days=1)}T00:00"},
    )
    assert nia.status_code == 201, nia.content
    assert nia.json()["from_local"] == f"{day}T00:00:00-04:00"
    assert RepAbsence.objects.get(pk=nia.json()["id"]).starts_at == datetime.combine(
        day, time(4), tzinfo=UTC
    )
