"""The Tally kind: a FORM_RESPONSE with every question type, the lead-generation payload,
non-ASCII answers with blanks, and the ``Tally-Signature`` check."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime

from leads.sources import kind_get
from leads.sources.base import Inbound
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = "tally"
SECRET = "tally-signing-secret-7b21"
NOW = datetime(2026, 2, 10, 10, 15, 22, tzinfo=UTC)


def test_form_response_with_choices_resolved_to_their_text() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "form_response.json"))
    assert lead.fields == {
        "email": "k.vogel@rheinmetall-services.de",
        "email_domain": "rheinmetall-services.de",
        "first_name": "Katharina",
        "last_name": "Vogel",
        "phone": "+492115566778",
        "company": "Rheintal Maschinenbau GmbH",
        "domain": "rheintal-maschinenbau.de",
        "country": "DE",
        "employees": 51,
        "utm_source": "google",
        "utm_campaign": "dach-brand",
        "website": "https://rheintal-maschinenbau.de",
        "external_id": "2wgx4n",
    }
    # Checkbox option ids → texts; the per-option true/false entries are not repeated.
    assert lead.custom["What are you interested in?"] == "Lead routing; CRM sync"
    assert not any(key.startswith("What are you interested in? (") for key in lead.custom)
    assert lead.custom["Upload your current routing rules"] == (
        "https://storage.tally.so/private/routing-rules.pdf?id=5mRkzA"
    )
    assert lead.custom["How many sales reps do you have?"] == 24
    assert lead.custom["tally_respondent_id"] == "dwQKYm"
    assert lead.custom["tally_form_name"] == "Demo request"
    assert lead.flags == ()


def test_lead_generation_form() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "lead_generation.json"))
    assert lead.fields == {
        "email": "lukas.hartmann@elbwerk-it.de",
        "email_domain": "elbwerk-it.de",
        "first_name": "Lukas",
        "last_name": "Hartmann",
        "phone": "+49403344556",
        "domain": "elbwerk-it.de",
        "external_id": "jaMb6Ka",
    }
    # "Company size: Enterprise" is no head count: kept as answered.
    assert lead.custom["employees"] == "Enterprise"
    assert lead.custom["Interest Level"] == "High"
    assert lead.custom["Budget"] == 25000
    assert lead.flags == ()


def test_non_ascii_answers_and_blank_ones() -> None:
    # "日本" is read by the localised country names (leads.normalize).
    lead = lead_from(KIND, fixture_record(KIND, "non_ascii_missing.json"))
    assert lead.fields == {
        "email": "t.yamada@sakura-robotics.co.jp",
        "email_domain": "sakura-robotics.co.jp",
        "first_name": "山田",
        "last_name": "太郎",
        "company": "さくらロボティクス株式会社",
        "domain": "sakura-robotics.co.jp",
        "country": "JP",
        "employees": 350,
        "external_id": "pQr8sT",
    }
    # A null phone, an empty multi-select and an empty message are no answers.
    assert "Phone" not in lead.custom
    assert "Topics" not in lead.custom
    assert "Message" not in lead.custom
    assert lead.flags == ()


def _inbound(body: bytes, signature: str | None) -> Inbound:
    headers = {} if signature is None else {"tally-signature": signature}
    return Inbound("POST", body, "application/json", headers)


def _sign(body: bytes, secret: str = SECRET) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def test_verify_accepts_the_documented_signature() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "form_response.json")
    assert verify(_inbound(body, _sign(body)), SECRET, NOW)
    assert kind_get(KIND).signature_header == "Tally-Signature"


def test_verify_refuses_bad_signatures() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "form_response.json")
    assert not verify(_inbound(body, _sign(body, "wrong-secret")), SECRET, NOW)
    assert not verify(_inbound(body.replace(b"Vogel", b"Vogl"), _sign(body)), SECRET, NOW)
    assert not verify(_inbound(body, None), SECRET, NOW)
    assert not verify(_inbound(body, hashlib.sha256(body).hexdigest()), SECRET, NOW)
