"""POST /api/v1/intake/<slug>/ — api.md's contract, row by row."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from leads.models import Lead, LeadStatus, SourceAuthMode
from leads.services import source_set_hmac_secret, source_set_token
from tests.leads.conftest import auth
from tests.leads.factories import SourceFactory

pytestmark = pytest.mark.django_db
URL = "/api/v1/intake/webform/"


def post_json(client, payload, url=URL, headers=None, **extra):
    body = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
    headers = auth() if headers is None else headers
    return client.post(url, data=body, content_type="application/json", **headers, **extra)


def assert_error(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body


def test_json_lead_is_accepted_stored_verbatim_and_enqueued_after_commit(
    client, source, published, django_capture_on_commit_callbacks
):
    payload = {"Email Address": "Ana@Acme.com ", "Org": "Acme", "favourite": {"colour": "teal"}}
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = post_json(client, payload)
    assert response.status_code == 202, response.content
    body = response.json()
    lead = Lead.objects.get()
    status_url = body.pop("status_url")
    assert body == {"id": str(lead.id), "status": "received", "url": f"/api/v1/leads/{lead.id}/"}
    # The Location is the lead's status URL (issue 20), signed for this lead.
    assert status_url.startswith(f"/api/v1/status/{lead.id}/")
    assert response["Location"] == status_url
    assert lead.raw_payload == payload
    assert lead.status == LeadStatus.RECEIVED
    assert lead.source == source
    assert len(callbacks) == 1
    assert published == [str(lead.id)]


def test_form_encoded_lead_is_accepted(client, source, published):
    response = client.post(
        URL,
        data="email=bo%40example.com&company=Beta&tags=a&tags=b",
        content_type="application/x-www-form-urlencoded",
        **auth(),
    )
    assert response.status_code == 202, response.content
    assert Lead.objects.get().raw_payload == {
        "email": "bo@example.com",
        "company": "Beta",
        "tags": ["a", "b"],
    }


def test_multipart_lead_is_accepted(client, source, published):
    response = client.post(URL, data={"phone": "+49 30 1234567", "note": "hi"}, **auth())
    assert response.status_code == 202, response.content
    assert Lead.objects.get().raw_payload == {"phone": "+49 30 1234567", "note": "hi"}


def test_a_malformed_email_is_accepted_not_rejected(client, source, published):
    response = post_json(client, {"email": "not-an-email@", "first_name": "X"})
    assert response.status_code == 202


@pytest.mark.parametrize(
    "payload",
    [
        {"email": "a@b.co"},
        {"phone": "+1 415 555 0100"},
        {"company": "Acme", "last_name": "Smith"},
        {"Company Name": "Acme", "full_name": "Ana Smith"},
        {"Org": "Acme", "fname": "Ana"},  # the source's field map
    ],
)
def test_the_minimal_lead_check_accepts(client, source, published, payload):
    assert post_json(client, payload).status_code == 202


@pytest.mark.parametrize(
    "payload",
    [{}, {"company": "Acme"}, {"first_name": "Ana"}, {"email": "   "}, {"note": "hello"}],
)
def test_not_a_lead_is_422(client, source, published, payload):
    assert_error(post_json(client, payload), 422, "not_a_lead")
    assert not Lead.objects.exists()


def test_unknown_source_is_404(client, db):
    assert_error(
        post_json(client, {"email": "a@b.co"}, url="/api/v1/intake/nope/"), 404, "source_not_found"
    )


def test_disabled_source_is_404(client, db):
    SourceFactory(slug="webform", active=False)
    assert_error(post_json(client, {"email": "a@b.co"}), 404, "source_not_found")


@pytest.mark.parametrize(
    "headers",
    [{}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": "token-webform"}],
)
def test_missing_or_wrong_token_is_401(client, source, headers):
    assert_error(post_json(client, {"email": "a@b.co"}, headers=headers), 401, "unauthorized")
    assert not Lead.objects.exists()


def test_url_token_only_where_the_source_allows_it(client, source, published):
    url = f"{URL}?token=token-webform"
    assert_error(post_json(client, {"email": "a@b.co"}, url=url, headers={}), 401, "unauthorized")
    source.allow_query_token = True
    source.save()
    assert post_json(client, {"email": "a@b.co"}, url=url, headers={}).status_code == 202


def test_rotated_token_overlap(client, source, published):
    new = source_set_token(source=source, overlap=timedelta(hours=1))
    assert post_json(client, {"email": "a@b.co"}).status_code == 202  # old still works
    assert (
        post_json(
            client, {"email": "b@b.co"}, headers={"HTTP_AUTHORIZATION": f"Bearer {new}"}
        ).status_code
        == 202
    )
    source.refresh_from_db()
    source.previous_token_valid_until = timezone.now() - timedelta(seconds=1)
    source.save()
    assert_error(post_json(client, {"email": "c@b.co"}), 401, "unauthorized")


def test_rotation_without_overlap_revokes_at_once(client, source):
    source_set_token(source=source)
    assert_error(post_json(client, {"email": "a@b.co"}), 401, "unauthorized")


def _signed(secret: str, body: bytes) -> dict[str, str]:
    return {
        "HTTP_X_SIGNATURE": "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    }


def test_hmac_mode(client, source, published):
    source.auth_mode = SourceAuthMode.HMAC
    source.save()
    secret = source_set_hmac_secret(source=source)
    body = json.dumps({"email": "a@b.co"}).encode()
    assert post_json(client, body, headers=_signed(secret, body)).status_code == 202
    assert_error(post_json(client, body, headers={}), 401, "unauthorized")
    assert_error(post_json(client, body + b" ", headers=_signed(secret, body)), 401, "unauthorized")
    assert_error(post_json(client, body, headers=_signed("other", body)), 401, "unauthorized")
    # Several signatures during a rotation: one valid is enough.
    multi = {"HTTP_X_SIGNATURE": "sha256=00ff, " + _signed(secret, body)["HTTP_X_SIGNATURE"]}
    assert post_json(client, body, headers=multi).status_code == 202


def test_token_and_hmac_mode_needs_both(client, source, published):
    source.auth_mode = SourceAuthMode.TOKEN_AND_HMAC
    source.save()
    secret = source_set_hmac_secret(source=source)
    body = json.dumps({"email": "a@b.co"}).encode()
    assert_error(post_json(client, body, headers=_signed(secret, body)), 401, "unauthorized")
    assert post_json(client, body, headers={**auth(), **_signed(secret, body)}).status_code == 202


def test_unsupported_content_type_is_415(client, source):
    response = client.post(URL, data="email=a@b.co", content_type="text/plain", **auth())
    assert_error(response, 415, "unsupported_media_type")


def test_body_over_the_limit_is_413(client, source, settings):
    settings.INTAKE_MAX_BODY_BYTES = 100
    assert_error(post_json(client, {"email": "a@b.co", "note": "x" * 200}), 413, "body_too_large")


def test_over_the_rate_limit_is_429_with_retry_after(client, source, published):
    source.rate_limit_per_minute = 2
    source.save()
    assert post_json(client, {"email": "a@b.co"}).status_code == 202
    assert post_json(client, {"email": "b@b.co"}).status_code == 202
    response = post_json(client, {"email": "c@b.co"})
    assert_error(response, 429, "rate_limited")
    assert 1 <= int(response["Retry-After"]) <= 60
    assert Lead.objects.count() == 2


def test_rate_limits_are_per_source(client, source, published):
    source.rate_limit_per_minute = 1
    source.save()
    SourceFactory(slug="other")
    assert post_json(client, {"email": "a@b.co"}).status_code == 202
    assert post_json(client, {"email": "a@b.co"}).status_code == 429
    other = post_json(
        client, {"email": "a@b.co"}, url="/api/v1/intake/other/", headers=auth("other")
    )
    assert other.status_code == 202


# --- Idempotency ------------------------------------------------------------------------------


def test_replay_with_the_same_key_and_body_returns_the_same_lead(
    client, source, published, django_capture_on_commit_callbacks
):
    headers = {**auth(), "HTTP_IDEMPOTENCY_KEY": "k-1"}
    with django_capture_on_commit_callbacks(execute=True):
        first = post_json(client, {"email": "a@b.co"}, headers=headers)
        again = post_json(client, {"email": "a@b.co"}, headers=headers)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    assert Lead.objects.count() == 1
    assert len(published) == 1


def test_a_replay_a_second_later_answers_the_same_status_url(client, source, published):
    """The status URL's lifetime counts from when the lead was received, so a replay's body and
    Location are the first answer's, byte for byte (a replay used to sign a new expiry)."""
    headers = {**auth(), "HTTP_IDEMPOTENCY_KEY": "k-later"}
    first = post_json(client, {"email": "a@b.co"}, headers=headers)
    time.sleep(1.1)  # the token's expiry has a resolution of one second
    again = post_json(client, {"email": "a@b.co"}, headers=headers)
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert again["Location"] == first["Location"]


def test_same_key_with_another_body_is_422(client, source, published):
    headers = {**auth(), "HTTP_IDEMPOTENCY_KEY": "k-1"}
    post_json(client, {"email": "a@b.co"}, headers=headers)
    assert_error(
        post_json(client, {"email": "z@b.co"}, headers=headers), 422, "idempotency_key_reused"
    )
    assert Lead.objects.count() == 1


def test_external_id_serves_as_the_key_and_keys_are_per_source(client, source, published):
    SourceFactory(slug="other")
    payload = {"email": "a@b.co", "external_id": "crm-42"}
    first = post_json(client, payload)
    replay = post_json(client, payload)
    assert replay.json()["id"] == first.json()["id"]
    other = post_json(client, payload, url="/api/v1/intake/other/", headers=auth("other"))
    assert other.json()["id"] != first.json()["id"]
    assert Lead.objects.count() == 2


def test_an_overlong_idempotency_key_is_400(client, source):
    headers = {**auth(), "HTTP_IDEMPOTENCY_KEY": "k" * 256}
    assert_error(
        post_json(client, {"email": "a@b.co"}, headers=headers), 400, "invalid_idempotency_key"
    )


# --- Hostile input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"  ",
        b"{",
        b"[1, 2]",
        b"null",
        b'"a string"',
        b"42",
        b"[" * 10_000 + b"]" * 10_000,
        b'{"a":' * 40 + b"1" + b"}" * 40,
        b'{"email": "a\\u0000@b.co"}',
        b'{"email": "a@b.co", "x": "\\ud800"}',
        b'{"email": "a@b.co", "email": "b@b.co"}',
        b'{"email": "caf\xe9@b.co"}',
        b'{"email": "a@b.co", "n": NaN}',
        json.dumps({"email": "a@b.co", **{f"k{i}": i for i in range(5000)}}).encode(),
        json.dumps({"email": "a@b.co", "big": "x" * 70_000}).encode(),
    ],
    ids=[
        "empty",
        "truncated",
        "array",
        "null",
        "string",
        "number",
        "deep-array",
        "deep-object",
        "nul",
        "lone-surrogate",
        "duplicate-keys",
        "invalid-utf8",
        "nan",
        "5000-keys",
        "long-string",
    ],
)
def test_hostile_json_is_a_json_400_and_stores_nothing(client, source, body):
    assert_error(post_json(client, body), 400, "invalid_body")
    assert not Lead.objects.exists()


def _chunked(client, body):
    # The WSGI server de-chunks the body; what the app sees is no Content-Length at all.
    return client.generic(
        "POST",
        URL,
        data=body,
        content_type="application/json",
        HTTP_TRANSFER_ENCODING="chunked",
        CONTENT_LENGTH="",
        **{"wsgi.input": io.BytesIO(body)},  # reads stop at the end, like gunicorn's reader
        **auth(),
    )


def test_a_chunked_body_is_read(client, source, published):
    response = _chunked(client, json.dumps({"email": "a@b.co"}).encode())
    assert response.status_code == 202, response.content
    assert Lead.objects.get().raw_payload == {"email": "a@b.co"}


def test_an_oversize_chunked_body_is_413(client, source, settings):
    settings.INTAKE_MAX_BODY_BYTES = 100
    body = json.dumps({"email": "a@b.co", "note": "x" * 200}).encode()
    assert_error(_chunked(client, body), 413, "body_too_large")
    assert not Lead.objects.exists()


def test_too_many_form_fields_is_400(client, source):
    body = "&".join(f"k{i}=v" for i in range(5000)) + "&email=a%40b.co"
    response = client.post(
        URL, data=body, content_type="application/x-www-form-urlencoded", **auth()
    )
    assert_error(response, 400, "invalid_body")


def test_invalid_utf8_form_is_400(client, source):
    response = client.post(
        URL,
        data=b"email=caf\xe9%40b.co",
        content_type="application/x-www-form-urlencoded",
        **auth(),
    )
    assert_error(response, 400, "invalid_body")


def test_a_form_in_the_charset_it_declares_is_read_in_it(client, source, published):
    # Review finding (issue 16 §6, Windows-1252): a form declaring charset=windows-1252 (an old
    # German PHP or CMS page) was refused as "not valid UTF-8"; re-accepting it from the inbox
    # could never succeed, the parser being the same. Undeclared, such bytes stay a 400.
    body = "email=j%FCrgen%40m%FCller.de&name=J%FCrgen+M%FCller&country=%D6sterreich&note=caf\xe9"
    response = client.post(
        URL,
        data=body,  # the test client encodes it in the declared charset
        content_type="application/x-www-form-urlencoded; charset=windows-1252",
        **auth(),
    )
    assert response.status_code == 202, response.content
    assert Lead.objects.get().raw_payload == {
        "email": "jürgen@müller.de",
        "name": "Jürgen Müller",
        "country": "Österreich",
        "note": "café",
    }
    refused = client.post(
        URL,
        data=b"email=a%40b.de&name=J%81",  # 0x81 is no Windows-1252 character
        content_type="application/x-www-form-urlencoded; charset=windows-1252",
        **auth(),
    )
    assert_error(refused, 400, "invalid_body")


def data_queries(captured):
    """Queries other than transaction control (the test's own transaction adds savepoints)."""
    return [
        q["sql"]
        for q in captured
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "BEGIN", "ROLLBACK"))
    ]


def test_the_kickoff_costs_three_queries_two_on_postgresql(client, source, published):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        assert post_json(client, {"email": "a@b.co"}).status_code == 202
    queries = data_queries(ctx.captured_queries)
    if connection.vendor == "postgresql":
        # The source, then the lead and its `received` audit event in one statement
        # (leads.kickoff_sql, issue 18).
        assert len(queries) == 2, queries
        assert queries[1].startswith('WITH new_lead AS (INSERT INTO "leads_lead"')
        assert 'INSERT INTO "audit_event"' in queries[1]
        return
    # The source, then the lead and its `received` audit event (one transaction).
    assert len(queries) == 3, queries
    assert queries[1].startswith('INSERT INTO "leads_lead"')
    assert queries[2].startswith('INSERT INTO "audit_event"')


def test_unsigned_requests_neither_use_up_the_limit_nor_learn_about_the_body(
    client, source, published
):
    source.auth_mode = SourceAuthMode.HMAC
    source.rate_limit_per_minute = 1
    source.save()
    secret = source_set_hmac_secret(source=source)
    for _ in range(3):
        assert_error(post_json(client, b"{not json", headers={}), 401, "unauthorized")
    body = json.dumps({"email": "a@b.co"}).encode()
    assert post_json(client, body, headers=_signed(secret, body)).status_code == 202


def test_sources_are_cached_briefly_and_deactivation_applies_after_the_ttl(
    client, source, published, settings, monkeypatch
):
    from leads import selectors

    clock = [1000.0]
    monkeypatch.setattr(selectors.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(selectors, "_source_cache", {})
    settings.SOURCE_CACHE_SECONDS = 5
    assert post_json(client, {"email": "a@b.co"}).status_code == 202
    source.active = False
    source.save()
    assert post_json(client, {"email": "b@b.co"}).status_code == 202  # cached
    clock[0] += 5.1
    assert_error(post_json(client, {"email": "c@b.co"}), 404, "source_not_found")


def test_a_url_without_the_trailing_slash_is_not_redirected(client, source, published):
    response = post_json(client, {"email": "a@b.co"}, url=URL.rstrip("/"))
    assert response.status_code == 202
    batch = client.post(
        "/api/v1/intake/webform/batch",
        data=json.dumps([{"email": "b@b.co"}]),
        content_type="application/json",
        **auth(),
    )
    assert batch.status_code == 202


@pytest.mark.parametrize("signature", ["sha256=\u00e9", "sha256=" + "g" * 64, "md5=abc", "sha256="])
def test_malformed_signatures_are_401_not_500(client, source, signature):
    source.auth_mode = SourceAuthMode.HMAC
    source.save()
    source_set_hmac_secret(source=source)
    headers = {"HTTP_X_SIGNATURE": signature.encode().decode("unicode_escape")}
    assert_error(post_json(client, {"email": "a@b.co"}, headers=headers), 401, "unauthorized")


@pytest.mark.parametrize("slug", ["w%00b", "%C3%A9", "a" * 65, "has%20space"])
def test_odd_slugs_are_404(client, db, slug):
    response = post_json(client, {"email": "a@b.co"}, url=f"/api/v1/intake/{slug}/")
    assert_error(response, 404, "source_not_found")


def test_an_idempotency_key_with_control_characters_is_400(client, source):
    headers = {**auth(), "HTTP_IDEMPOTENCY_KEY": "abc\x01def"}
    assert_error(
        post_json(client, {"email": "a@b.co"}, headers=headers), 400, "invalid_idempotency_key"
    )


def test_a_huge_key_is_400(client, source):
    assert_error(post_json(client, {"email": "a@b.co", "k" * 257: 1}), 400, "invalid_body")


def test_bad_percent_escapes_in_a_form_are_400(client, source):
    response = client.post(
        URL,
        data="email=a%40b.co&name=caf%FF",
        content_type="application/x-www-form-urlencoded",
        **auth(),
    )
    assert_error(response, 400, "invalid_body")


def test_long_external_ids_are_hashed_not_truncated(client, source, published):
    common = "x" * 300
    first = post_json(client, {"email": "a@b.co", "external_id": common + "1"})
    second = post_json(client, {"email": "b@b.co", "external_id": common + "2"})
    assert first.status_code == second.status_code == 202
    keys = set(Lead.objects.values_list("idempotency_key", flat=True))
    assert len(keys) == 2
    assert all(key.startswith("sha256:") and len(key) <= 255 for key in keys)


def test_a_database_outage_during_intake_is_503_json_with_retry_after(
    client, source, monkeypatch, settings
):
    from django.db import OperationalError

    from leads import api

    def down(*, slug):  # type: ignore[no-untyped-def]
        raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")

    monkeypatch.setattr(api.selectors, "source_for_intake", down)
    settings.DB_UNAVAILABLE_RETRY_AFTER_SECONDS = 9
    response = post_json(client, {"email": "a@b.co"})
    assert_error(response, 503, "service_unavailable")
    assert response["Retry-After"] == "9"


def _multipart(client, body: bytes, boundary: str = "XYZ"):
    return client.generic(
        "POST", URL, data=body, content_type=f"multipart/form-data; boundary={boundary}", **auth()
    )


def test_a_multipart_body_without_its_closing_boundary_is_400(client, source):
    body = b'--XYZ\r\nContent-Disposition: form-data; name="email"\r\n\r\nm@b.co\r\n--OTHER--\r\n'
    assert_error(_multipart(client, body), 400, "invalid_body")
    assert not Lead.objects.exists()


def test_invalid_utf8_in_a_multipart_value_is_400(client, source):
    body = b'--XYZ\r\nContent-Disposition: form-data; name="email"\r\n\r\nm\xff@b.co\r\n--XYZ--\r\n'
    assert_error(_multipart(client, body), 400, "invalid_body")


def test_a_well_formed_raw_multipart_body_is_accepted(client, source, published):
    body = (
        b'--XYZ\r\nContent-Disposition: form-data; name="email"\r\n\r\nm@b.co\r\n'
        b'--XYZ\r\nContent-Disposition: form-data; name="company"\r\n\r\nCaf\xc3\xa9\r\n--XYZ--\r\n'
    )
    response = _multipart(client, body)
    assert response.status_code == 202, response.content
    assert Lead.objects.get().raw_payload == {"email": "m@b.co", "company": "Café"}


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "multipart/form-data; boundary=b"]
)
def test_a_form_body_with_too_many_fields_is_a_json_400(client, source, settings, content_type):
    """More fields than DATA_UPLOAD_MAX_NUMBER_FIELDS (our own form parser for urlencoded
    bodies, Django's for multipart): a JSON 400 in the API's shape, as Django's own path
    answers TooManyFieldsSent, and nothing stored."""
    count = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1
    if content_type.startswith("multipart"):
        parts = "".join(
            f'--b\r\nContent-Disposition: form-data; name="f{i}"\r\n\r\nx\r\n' for i in range(count)
        )
        body = parts + "--b--\r\n"
    else:
        body = "email=bo%40example.com&" + "&".join(f"f{i}=x" for i in range(count))
    response = client.post(URL, data=body, content_type=content_type, **auth())
    assert_error(response, 400, "invalid_body")
    assert not Lead.objects.exists()
