"""The Webflow kind: the documented v2 and v1 form_submission events, a B2B form, and the
``x-webflow-signature`` check with its 5-minute window."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta

from leads.sources import kind_get
from leads.sources.base import Inbound
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = "webflow"
SECRET = "wf_client_secret_0c4e9d"
NOW = datetime(2026, 2, 18, 15, 22, 10, tzinfo=UTC)
STAMP = str(int(NOW.timestamp() * 1000) - 1500)


def test_documented_v2_event() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "form_submission_v2.json"))
    assert lead.fields == {
        "email": "zaphod@heartofgold.ai",
        "email_domain": "heartofgold.ai",
        "first_name": "Zaphod",
        "last_name": "Beeblebrox",
        "domain": "heartofgold.ai",
        "external_id": "6321ca84df3949bfc6752327",
    }
    # The docs' phone is a JSON number of a fictional 555 line: kept, and flagged.
    assert lead.custom["phone"] == 15550000000
    assert lead.custom["webflow_form_name"] == "Contact Us"
    assert lead.custom["webflow_form_id"] == "65429eadebe8a9f3a30f62d0"
    assert lead.custom["submitted_at"] == "2022-09-14T12:35:16.117Z"
    assert lead.flags == ("invalid_phone",)


def test_documented_v1_event() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "form_submission_v1.json"))
    assert lead.fields == {
        "email": "some.one@home.com",
        "email_domain": "home.com",
        "first_name": "Some",
        "last_name": "One",
        "domain": "home.com",
        "external_id": "6321ca84df3949bfc6752327",
    }
    assert lead.custom["webflow_site_id"] == "62749158efef318abc8d5a0f"
    assert lead.flags == ()


def test_b2b_form_with_question_labels() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "contact_b2b_v2.json"))
    assert lead.fields == {
        "email": "a.weiss@hafenblick-media.de",
        "email_domain": "hafenblick-media.de",
        "first_name": "Annika",
        "last_name": "Weiß",
        "phone": "+494087654321",
        "company": "Hafenblick Media GmbH",
        "domain": "hafenblick-media.de",
        "title": "Head of Growth",
        "country": "DE",
        "employees": 11,
        "website": "hafenblick-media.de",
        "external_id": "65d2208171c9b3a4d2e1f0aa",
    }
    assert lead.custom["Nachricht"] == "Wir möchten Leads nach Region verteilen."
    assert lead.custom["Newsletter"] == "true"
    assert lead.flags == ()


def _inbound(body: bytes, signature: str | None, stamp: str | None = STAMP) -> Inbound:
    headers = {}
    if signature is not None:
        headers["x-webflow-signature"] = signature
    if stamp is not None:
        headers["x-webflow-timestamp"] = stamp
    return Inbound("POST", body, "application/json", headers)


def _sign(body: bytes, stamp: str = STAMP, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), stamp.encode() + b":" + body, hashlib.sha256).hexdigest()


def test_verify_accepts_the_documented_signature() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "contact_b2b_v2.json")
    assert verify(_inbound(body, _sign(body)), SECRET, NOW)
    assert kind_get(KIND).signature_header == "x-webflow-signature"


def test_verify_refuses_bad_or_stale_signatures() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "contact_b2b_v2.json")
    assert not verify(_inbound(body, _sign(body, secret="other")), SECRET, NOW)
    assert not verify(_inbound(body.replace(b"Annika", b"Anna"), _sign(body)), SECRET, NOW)
    assert not verify(_inbound(body, None), SECRET, NOW)
    assert not verify(_inbound(body, _sign(body), stamp=None), SECRET, NOW)
    # Signed with another timestamp than the one sent.
    other = str(int(STAMP) - 1)
    assert not verify(_inbound(body, _sign(body, stamp=other)), SECRET, NOW)
    # Older than 5 minutes: a replay, even with a valid signature.
    stale = str(int((NOW - timedelta(minutes=5, seconds=1)).timestamp() * 1000))
    assert not verify(_inbound(body, _sign(body, stamp=stale), stamp=stale), SECRET, NOW)
    fresh = str(int((NOW - timedelta(minutes=4, seconds=59)).timestamp() * 1000))
    assert verify(_inbound(body, _sign(body, stamp=fresh), stamp=fresh), SECRET, NOW)
