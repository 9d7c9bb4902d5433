"""The hostile-payload corpus (reliability guide, test 13): every body answers a JSON 4xx as
api.md specifies, or is accepted clean; never a 5xx, never a half-written lead, never a NUL or a
lone surrogate stored."""

from __future__ import annotations

import json

import pytest

from audit.models import Event
from leads.models import Lead
from tests.leads.conftest import auth

pytestmark = [pytest.mark.django_db, pytest.mark.reliability]
URL = "/api/v1/intake/webform/"
BATCH = "/api/v1/intake/webform/batch/"

JSON = "application/json"
DEEP = b"[" * 10_000 + b"]" * 10_000
DEEP_OBJECT = b'{"a":' * 5_000 + b"1" + b"}" * 5_000
MANY_KEYS = json.dumps({f"k{i}": i for i in range(5_000)} | {"email": "a@b.co"}).encode()
HUGE = b'{"email": "a@b.co", "note": "' + b"x" * (3 * 1024 * 1024) + b'"}'

# (name, content type, body, the statuses api.md allows for it)
CORPUS: list[tuple[str, str, bytes, set[int]]] = [
    ("3 MB body", JSON, HUGE, {413}),
    ("10,000-deep array", JSON, DEEP, {400}),
    ("5,000-deep object", JSON, DEEP_OBJECT, {400}),
    ("5,000 keys", JSON, MANY_KEYS, {400, 413}),
    ("NUL in a value", JSON, b'{"email": "a@b.co", "company": "Ac\\u0000me"}', {202, 400}),
    ("NUL in a key", JSON, b'{"email": "a@b.co", "k\\u0000": "v"}', {202, 400}),
    ("nested NUL", JSON, b'{"email": "a@b.co", "x": {"y": ["\\u0000"]}}', {202, 400}),
    ("lone surrogate", JSON, b'{"email": "a@b.co", "company": "\\ud800"}', {202, 400}),
    ("invalid UTF-8", JSON, b'{"email": "a@b.co", "company": "\xff\xfe"}', {400}),
    ("top-level array", JSON, b'[{"email": "a@b.co"}]', {400}),
    ("top-level null", JSON, b"null", {400}),
    ("top-level string", JSON, b'"a@b.co"', {400}),
    ("top-level number", JSON, b"1e999", {400}),
    ("empty body", JSON, b"", {400, 415}),
    ("only whitespace", JSON, b"   \n ", {400}),
    ("truncated JSON", JSON, b'{"email": "a@b.co"', {400}),
    ("NaN", JSON, b'{"email": "a@b.co", "lead_score": NaN}', {400, 202}),
    ("Infinity score", JSON, b'{"email": "a@b.co", "lead_score": Infinity}', {400, 202}),
    ("huge integer", JSON, b'{"email": "a@b.co", "employees": ' + b"9" * 5000 + b"}", {400, 202}),
    ("duplicate keys", JSON, b'{"email": "a@b.co", "email": "c@d.co"}', {400}),
    ("text/plain", "text/plain", b'{"email": "a@b.co"}', {415}),
    ("XML", "application/xml", b"<lead><email>a@b.co</email></lead>", {415}),
    ("no content type", "", b'{"email": "a@b.co"}', {415, 400}),
    ("form with NUL", "application/x-www-form-urlencoded", b"email=a%40b.co&c=%00", {202, 400}),
    (
        "form with bad UTF-8",
        "application/x-www-form-urlencoded",
        b"email=a%40b.co&c=%ff",
        {202, 400},
    ),
    ("multipart without boundary", "multipart/form-data", b"--x\r\n", {400}),
    ("BOM then JSON", JSON, b'\xef\xbb\xbf{"email": "a@b.co"}', {202, 400}),
    ("not a lead", JSON, b'{"favourite": "teal"}', {422}),
    ("email as an object", JSON, b'{"email": {"$ne": null}}', {202, 422}),
    ("email as a list", JSON, b'{"email": ["a@b.co", "c@d.co"]}', {202, 422}),
    ("10,000-character e-mail", JSON, b'{"email": "' + b"a" * 10_000 + b'@b.co"}', {202, 400, 422}),
    ("script in company", JSON, b'{"email": "a@b.co", "company": "<script>x</script>"}', {202}),
    ("formula in company", JSON, b'{"email": "a@b.co", "company": "=HYPERLINK(1)"}', {202}),
]


def _clean(value: object) -> bool:
    """No NUL and no lone surrogate anywhere in a stored value, keys included."""
    if isinstance(value, str):
        return "\x00" not in value and not any(0xD800 <= ord(ch) <= 0xDFFF for ch in value)
    if isinstance(value, dict):
        return all(_clean(k) and _clean(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_clean(v) for v in value)
    return True


@pytest.mark.parametrize(
    ("content_type", "body", "allowed"),
    [case[1:] for case in CORPUS],
    ids=[case[0] for case in CORPUS],
)
def test_hostile_single_intake(client, source, published, content_type, body, allowed):  # type: ignore[no-untyped-def]
    response = client.post(URL, data=body, content_type=content_type, **auth())
    assert response.status_code in allowed, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json")
    error = response.json().get("error")
    if response.status_code == 202:
        lead = Lead.objects.get()
        assert _clean(lead.raw_payload)
        assert _clean(Lead.objects.values().get())
        assert Event.objects.filter(lead=lead, type="received").count() == 1
    else:
        assert error["code"]
        assert error["message"]
        assert Lead.objects.count() == 0
        assert Event.objects.count() == 0
        assert published == []


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        (JSON, DEEP),
        (JSON, b"[" + b",".join([b'{"email": "a@b.co"}'] * 1_001) + b"]"),
        (JSON, b'{"email": "a@b.co"}'),
        (JSON, b"[1, null, []]"),
        ("text/csv", b"email,company\n\x00,\xff\n"),
        ("text/csv", b'email\n"unterminated'),
        ("text/csv", b""),
        ("text/csv", b"," * 100_000),
    ],
    ids=[
        "deep",
        "1,001 records",
        "an object",
        "scalars",
        "NUL CSV",
        "bad quote",
        "empty",
        "commas",
    ],
)
def test_hostile_batches_never_break_the_server(client, source, published, content_type, body):  # type: ignore[no-untyped-def]
    response = client.post(BATCH, data=body, content_type=content_type, **auth())
    assert 200 <= response.status_code < 500, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    if response.status_code == 202:
        result = response.json()
        assert result["accepted"] == Lead.objects.count()
        for lead in Lead.objects.all():
            assert _clean(lead.raw_payload)
    else:
        assert Lead.objects.count() == 0
