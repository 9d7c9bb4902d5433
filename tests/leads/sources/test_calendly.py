"""Calendly webhooks: documented invitee and routing form payloads, and the signature."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime

from leads.sources import kind_get
from leads.sources.base import Inbound
from leads.sources.calendly import question_target
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = "calendly"
SIGNING_KEY = "Xv7-calendly-signing-key-0123456789"
TIMESTAMP = 1492774577
NOW = datetime.fromtimestamp(TIMESTAMP + 60, tz=UTC)
INVITEE = "https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2/invitees/AAAAAAAAAAAAAAAA"


def test_invitee_created() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "invitee_created.json"))
    assert lead.fields == {
        "email": "maximilian.hartmann@vektor-automation.de",
        "email_domain": "vektor-automation.de",
        "first_name": "Maximilian",
        "last_name": "Hartmann",
        "phone": "+49711987654",
        "company": "Vektor Automation GmbH",
        "domain": "vektor-automation.de",
        "title": "VP Operations",
        "country": "DE",
        "utm_source": "linkedin",
        "utm_medium": "paid-social",
        "utm_campaign": "q2-demo",
        "external_id": INVITEE,
    }
    assert lead.custom["Please share anything that will help prepare for our meeting."] == (
        "We run 14 plants and want to consolidate routing."
    )
    # The booking question's phone wins; the SMS reminder number is kept beside it.
    assert lead.custom["text_reminder_number"] == "+49 171 2345678"
    assert lead.custom["utm_content"] == "carousel-b"
    assert lead.custom["event_name"] == "30 Minute Demo"
    assert lead.custom["event_start_time"] == "2024-05-21T09:00:00.000000Z"
    assert lead.custom["calendly_event"] == "invitee.created"
    assert lead.custom["timezone"] == "Europe/Berlin"
    # The host is the customer's own rep, not the lead.
    assert "sales.rep@leadrouter-customer.com" not in repr(lead.custom)
    assert lead.flags == ()


def test_invitee_canceled_gets_a_key_of_its_own() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "invitee_canceled.json"))
    assert lead.fields == {
        "email": "maximilian.hartmann@vektor-automation.de",
        "email_domain": "vektor-automation.de",
        "first_name": "Maximilian",
        "last_name": "Hartmann",
        "domain": "vektor-automation.de",
        "external_id": f"{INVITEE}#canceled",
    }
    assert lead.custom["calendly_event"] == "invitee.canceled"
    assert lead.custom["cancel_reason"] == "Travelling that week"
    assert lead.custom["canceler_type"] == "invitee"
    assert lead.custom["status"] == "canceled"
    assert lead.custom["event_location"] == "Calendly Office"
    assert lead.flags == ()


def test_minimal_invitee_uses_the_reminder_number_and_skips_blank_answers() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "invitee_created_minimal.json"))
    assert lead.fields == {
        "email": "s.yamamoto@kaizen-seiki.co.jp",
        "email_domain": "kaizen-seiki.co.jp",
        "first_name": "山本",
        "last_name": "さくら",
        "phone": "+81312345678",
        "company": "Kaizen Seiki K.K.",
        "domain": "kaizen-seiki.co.jp",
        "external_id": (
            "https://api.calendly.com/scheduled_events/CCCCCCCCCCCCCCCC/invitees/DDDDDDDDDDDDDDDD"
        ),
    }
    assert "Phone" not in lead.custom
    assert lead.custom["event_name"] == "Intro call"


def test_routing_form_submission() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "routing_form_submission_created.json"))
    assert lead.fields == {
        "email": "ingrid.larsen@fjordline-shipping.no",
        "email_domain": "fjordline-shipping.no",
        "first_name": "Ingrid",
        "last_name": "Larsen",
        "company": "Fjordline Shipping AS",
        "domain": "fjordline-shipping.no",
        "country": "NO",
        "employees": 201,
        "utm_source": "google",
        "utm_medium": "cpc",
        "utm_campaign": "nordics",
        "external_id": "https://api.calendly.com/routing_form_submissions/AAAAAAAAAAAAAAAA",
    }
    assert lead.custom["Which product are you interested in?"] == "Fleet analytics"
    assert lead.custom["utm_term"] == "fleet analytics"
    assert lead.custom["routing_result_type"] == "event_type"
    assert lead.custom["calendly_event"] == "routing_form_submission.created"


def test_question_texts() -> None:
    assert question_target("Company") == "company"
    assert question_target("Company website") == "website"
    assert question_target("What is your job title?") == "title"
    assert question_target("Mobile number") == "phone"
    assert question_target("Your name") == "full_name"
    assert question_target("How many employees work at your company?") == "employees"
    assert question_target("Please share anything that will help prepare for our meeting.") is None
    assert question_target("How did you hear about us?") is None


# --- signature -----------------------------------------------------------------------------


def _signed(
    body: bytes, *, secret: str = SIGNING_KEY, timestamp: int = TIMESTAMP, header: str | None = None
) -> Inbound:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    value = f"t={timestamp},v1={digest}" if header is None else header
    return Inbound(
        method="POST",
        body=body,
        content_type="application/json",
        headers={"calendly-webhook-signature": value},
    )


def test_a_valid_signature_passes() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "invitee_created.json")
    assert verify(_signed(body), SIGNING_KEY, NOW)
    assert kind_get(KIND).signature_header == "Calendly-Webhook-Signature"


def test_wrong_key_tampered_body_stale_timestamp_and_missing_header_fail() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "invitee_created.json")
    assert not verify(_signed(body, secret="another-key"), SIGNING_KEY, NOW)
    signed = _signed(body)
    tampered = Inbound(
        method="POST",
        body=body.replace(b"VP Operations", b"CEO"),
        content_type="application/json",
        headers=signed.headers,
    )
    assert not verify(tampered, SIGNING_KEY, NOW)
    # Signed 4 minutes before now: outside Calendly's 3-minute tolerance.
    stale = datetime.fromtimestamp(TIMESTAMP + 4 * 60, tz=UTC)
    assert not verify(_signed(body), SIGNING_KEY, stale)
    assert verify(_signed(body), SIGNING_KEY, datetime.fromtimestamp(TIMESTAMP + 179, tz=UTC))
    assert not verify(_signed(body, header=""), SIGNING_KEY, NOW)
    assert not verify(_signed(body, header=f"t={TIMESTAMP}"), SIGNING_KEY, NOW)
    # A signature over another timestamp does not pass under this one.
    other = _signed(body, timestamp=TIMESTAMP - 1).headers["calendly-webhook-signature"]
    moved = other.replace(f"t={TIMESTAMP - 1}", f"t={TIMESTAMP}")
    assert not verify(_signed(body, header=moved), SIGNING_KEY, NOW)
