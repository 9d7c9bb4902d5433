"""The Typeform kind: the documented example payload, B2B answers, a contact-info block, a
partial response, and the ``Typeform-Signature`` check."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime

from leads.sources import kind_get
from leads.sources.base import Inbound
from leads.sources.labels import question_target
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = "typeform"
SECRET = "tf_webhook_secret_3f9a1c"
NOW = datetime(2026, 2, 3, 9, 14, 6, tzinfo=UTC)


def test_documented_example_payload() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "example_payload.json"))
    assert lead.fields == {
        "email": "laura@example.com",
        "email_domain": "example.com",
        "first_name": "Laura",
        "domain": "example.com",
        "lead_score": 9,
        "external_id": "a3a12ec67a1365927098a606107fac15",
    }
    # Every other answer is kept under its question, choices as their labels.
    assert lead.custom["Which pictures do you like? You can choose as many as you like."] == (
        "London; Sydney"
    )
    assert lead.custom["Which of these cities is your favorite?"] == "London"
    # A yes/no about a city is no city, and a date is no field.
    assert lead.custom["Do you have a favorite city we haven't listed?"] is False
    assert lead.custom["When did you move to the place where you live?"] == "2005-10-15"
    assert lead.custom["user_id"] == "abc123456"  # a hidden field
    assert lead.custom["variable name"] == "typeform"
    assert lead.custom["typeform_event_id"] == "LtWXD3crgy"
    assert lead.custom["typeform_form_title"] == "Webhooks example"
    assert lead.flags == ()


def test_b2b_lead_by_refs_titles_and_answer_types() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "b2b_lead.json"))
    assert lead.fields == {
        "email": "jonas.becker@kranwerk-logistik.de",
        "email_domain": "kranwerk-logistik.de",
        "first_name": "Jonas",
        "last_name": "Becker",
        "phone": "+49301234567",
        "company": "Kranwerk Logistik GmbH",
        "domain": "kranwerk-logistik.de",
        "title": "Head of Sales Operations",
        "country": "DE",
        "employees": 51,
        "lead_score": 35,
        "utm_source": "linkedin",
        "utm_medium": "paid-social",
        "utm_campaign": "dach-q1-demo",
        "website": "https://www.kranwerk-logistik.de",
        "external_id": "01HQ3ZK4M7T2V9B8X5N6C1D0EF",
    }
    # Multi-choice labels joined, with the "other" answer; a yes/no kept as a boolean.
    assert lead.custom["Which products are you interested in?"] == (
        "Lead routing; CRM sync; Territory planning"
    )
    assert lead.custom["May we contact you about other products?"] is True
    assert lead.custom["submitted_at"] == "2026-02-03T09:14:05Z"
    assert lead.flags == ()


def test_contact_info_block_with_german_labels() -> None:
    # "Deutschland" is read by the localised country names (leads.normalize).
    lead = lead_from(KIND, fixture_record(KIND, "contact_info.json"))
    assert lead.fields == {
        "email": "z.mueller@alpensolar-energie.de",
        "email_domain": "alpensolar-energie.de",
        "first_name": "Zoë",
        "last_name": "Müller-Lüdenscheidt",
        "phone": "+498921803456",
        "company": "Alpensolar Energie AG",
        "domain": "alpensolar-energie.de",
        "country": "DE",
        "external_id": "1bqf0x2kz8m3r7t4a1bqf0x2kz8m3r7t",
    }
    assert lead.custom["Ihre Nachricht"] == (
        "Bitte um Rückruf wegen eines Angebots für 40 Standorte."
    )
    assert lead.flags == ()


def test_partial_response_skips_unanswered_questions() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "partial_response.json"))
    assert lead.fields == {
        "email": "sam.okafor@brightwave.io",
        "email_domain": "brightwave.io",
        "domain": "brightwave.io",
        "external_id": "9z8y7x6w5v4u3t2s1r9z8y7x6w5v4u3t",
    }
    assert "Name" not in lead.custom
    assert "Phone" not in lead.custom
    assert lead.flags == ()


def test_same_response_resent_has_the_same_idempotency_key() -> None:
    record = fixture_record(KIND, "b2b_lead.json")
    record["event_id"] = "01HQ3ZZZZZZZZZZZZZZZZZZZZZ"  # a re-delivery
    assert lead_from(KIND, record).fields["external_id"] == "01HQ3ZK4M7T2V9B8X5N6C1D0EF"


def test_question_keywords_are_conservative() -> None:
    assert question_target("What's the name of your company?") == "company"
    assert question_target("Which country is your company based in?") == "country"
    assert question_target("How many employees does your company have?") == "employees"
    assert question_target("Their email address") is None
    assert question_target("Your manager's name") is None
    assert question_target("Do you have a favorite city we haven't listed?", {"title"}) is None


def _inbound(body: bytes, signature: str | None) -> Inbound:
    headers = {} if signature is None else {"typeform-signature": signature}
    return Inbound("POST", body, "application/json", headers)


def _sign(body: bytes, secret: str = SECRET) -> str:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).digest()
    return "sha256=" + base64.b64encode(digest).decode()


def test_verify_accepts_the_documented_signature() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "b2b_lead.json")
    assert verify(_inbound(body, _sign(body)), SECRET, NOW)
    assert kind_get(KIND).signature_header == "Typeform-Signature"


def test_verify_refuses_bad_signatures() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "b2b_lead.json")
    assert not verify(_inbound(body, _sign(body, "another_secret")), SECRET, NOW)
    assert not verify(_inbound(body + b" ", _sign(body)), SECRET, NOW)
    assert not verify(_inbound(body, _sign(body)[len("sha256=") :]), SECRET, NOW)  # no prefix
    assert not verify(_inbound(body, None), SECRET, NOW)
    assert not verify(_inbound(body, _sign(body, "")), "", NOW)
