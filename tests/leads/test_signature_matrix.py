"""The HMAC signature matrix (reliability guide, test 11): each case's exact answer, and no lead
stored for any refusal.

api.md: a source may require `X-Signature: sha256=<hex of HMAC-SHA256(secret, raw body)>`,
compared in constant time. Secrets rotate with an overlap during which the old one still works.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from leads.models import Lead, Source, SourceAuthMode
from leads.services import source_set_hmac_secret, source_set_token
from tests.leads.factories import SourceFactory

pytestmark = [pytest.mark.django_db, pytest.mark.reliability]
URL = "/api/v1/intake/signed/"
BODY = json.dumps({"email": "ana@acme.example", "company": "Acme"}).encode()


def sign(secret: str, body: bytes = BODY) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Case:
    """A request to send: headers and body, built once the sources' secrets exist."""

    def __init__(self, build: Callable[[dict[str, Any]], tuple[dict[str, str], bytes]]) -> None:
        self.build = build


def _secrets(auth_mode: str = SourceAuthMode.HMAC) -> dict[str, Any]:
    source = SourceFactory(slug="signed", auth_mode=auth_mode)
    other = SourceFactory(slug="other-signed", auth_mode=SourceAuthMode.HMAC)
    old = source_set_hmac_secret(source=source)
    current = source_set_hmac_secret(source=source, overlap=timedelta(hours=24))
    token = source_set_token(source=source)
    return {
        "source": source,
        "old": old,
        "current": current,
        "other": source_set_hmac_secret(source=other),
        "token": token,
    }


# (name, auth mode, build(secrets) -> (headers, body), expected status)
CASES: list[tuple[str, str, Callable[[dict[str, Any]], tuple[dict[str, str], bytes]], int]] = [
    ("valid", "hmac", lambda s: ({"HTTP_X_SIGNATURE": sign(s["current"])}, BODY), 202),
    ("missing header", "hmac", lambda s: ({}, BODY), 401),
    ("bad signature", "hmac", lambda s: ({"HTTP_X_SIGNATURE": "sha256=" + "0" * 64}, BODY), 401),
    (
        "body one byte longer",
        "hmac",
        lambda s: ({"HTTP_X_SIGNATURE": sign(s["current"])}, BODY + b" "),
        401,
    ),
    (
        "another source's secret",
        "hmac",
        lambda s: ({"HTTP_X_SIGNATURE": sign(s["other"])}, BODY),
        401,
    ),
    (
        "old secret inside the overlap",
        "hmac",
        lambda s: ({"HTTP_X_SIGNATURE": sign(s["old"])}, BODY),
        202,
    ),
    (
        "several signatures, one valid",
        "hmac",
        lambda s: ({"HTTP_X_SIGNATURE": f"sha256={'1' * 64}, {sign(s['current'])}"}, BODY),
        202,
    ),
    (
        "upper-case hex",
        "hmac",
        lambda s: ({"HTTP_X_SIGNATURE": "sha256=" + sign(s["current"])[7:].upper()}, BODY),
        202,
    ),
    (
        "GitHub's header name is not ours",
        "hmac",
        lambda s: ({"HTTP_X_HUB_SIGNATURE_256": sign(s["current"])}, BODY),
        401,
    ),
    (
        "Stripe's format",
        "hmac",
        lambda s: (
            {"HTTP_X_SIGNATURE": "t=1700000000,v1=" + sign(s["current"])[7:]},
            BODY,
        ),
        401,
    ),
    (
        "sha1 instead of sha256",
        "hmac",
        lambda s: (
            {
                "HTTP_X_SIGNATURE": "sha1="
                + hmac.new(s["current"].encode(), BODY, hashlib.sha1).hexdigest()
            },
            BODY,
        ),
        401,
    ),
    (
        "the secret itself as the signature",
        "hmac",
        lambda s: ({"HTTP_X_SIGNATURE": f"sha256={s['current']}"}, BODY),
        401,
    ),
    (
        "token and HMAC source, signature only",
        "token_and_hmac",
        lambda s: ({"HTTP_X_SIGNATURE": sign(s["current"])}, BODY),
        401,
    ),
    (
        "token and HMAC source, token only",
        "token_and_hmac",
        lambda s: ({"HTTP_AUTHORIZATION": f"Bearer {s['token']}"}, BODY),
        401,
    ),
    (
        "token and HMAC source, both",
        "token_and_hmac",
        lambda s: (
            {"HTTP_AUTHORIZATION": f"Bearer {s['token']}", "HTTP_X_SIGNATURE": sign(s["current"])},
            BODY,
        ),
        202,
    ),
]


@pytest.mark.parametrize(
    ("mode", "build", "status"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_signature_matrix(client, published, mode, build, status) -> None:  # type: ignore[no-untyped-def]
    secrets = _secrets(mode)
    headers, body = build(secrets)
    response = client.post(URL, data=body, content_type="application/json", **headers)
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    if status == 401:
        assert response.json()["error"]["code"] == "unauthorized"
        assert Lead.objects.count() == 0
        assert published == []
    else:
        assert Lead.objects.count() == 1


def test_the_old_secret_is_refused_once_the_overlap_is_over(client, published) -> None:  # type: ignore[no-untyped-def]
    secrets = _secrets()
    Source.objects.filter(pk=secrets["source"].pk).update(
        previous_hmac_valid_until=timezone.now() - timedelta(seconds=1)
    )
    response = client.post(
        URL, data=BODY, content_type="application/json", HTTP_X_SIGNATURE=sign(secrets["old"])
    )
    assert response.status_code == 401
    assert Lead.objects.count() == 0


def test_a_replayed_signed_request_with_its_key_makes_no_second_lead(client, published) -> None:  # type: ignore[no-untyped-def]
    secrets = _secrets()
    headers = {"HTTP_X_SIGNATURE": sign(secrets["current"]), "HTTP_IDEMPOTENCY_KEY": "evt-1"}
    first = client.post(URL, data=BODY, content_type="application/json", **headers)
    again = client.post(URL, data=BODY, content_type="application/json", **headers)
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json()["id"] == first.json()["id"]
    assert again["Idempotent-Replayed"] == "true"
    assert Lead.objects.count() == 1


def test_no_secret_or_signature_is_compared_with_double_equals() -> None:
    """A static check: `==` on a secret, token hash or signature leaks timing."""
    suspicious = ("secret", "signature", "digest", "token_hash", "candidate", "expected")
    offenders = []
    for name in ("leads/source_auth.py", "leads/models.py", "routing/delivery/signing.py"):
        path = Path(settings.BASE_DIR) / name
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                isinstance(op, ast.Eq | ast.NotEq) for op in node.ops
            ):
                text = ast.unparse(node)
                if any(word in text.lower() for word in suspicious):
                    offenders.append(f"{name}:{node.lineno}: {text}")
    assert offenders == []
