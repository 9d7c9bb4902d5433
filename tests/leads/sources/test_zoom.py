"""Zoom Webinars: report CSVs as exported (title rows, host/panelist sections), the
registration webhook, its signature and the URL-validation challenge."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from leads.parsing import Limits, parse_csv
from leads.sources import kind_get
from leads.sources.base import Inbound
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = kind_get("zoom")
SECRET = "zoom-secret-token"
# Zoom's documented example body (developers.zoom.us/docs/api/webhooks/#verify-webhook-events).
SIGNED_BODY = (
    b'{"event":"session.started","payload":{"account_id":"{ACCOUNT_ID}","object":'
    b'{"start_time":"2022-07-27T16:56:34Z","id":"{SESSION_ID}"}},"event_ts":1658940994914}'
)
SIGNED_AT = "1658940994"
# HMAC-SHA256("zoom-secret-token", "v0:1658940994:" + SIGNED_BODY), computed once.
SIGNATURE = "v0=cd0fbb0ee61c1f840ee85aba2300257e1a1508cc14f0dfb4a633b34d2049cd4a"
NOW = datetime.fromtimestamp(1658940994 + 30, tz=UTC)


def rows(name: str) -> list[dict[str, Any]]:
    return parse_csv(fixture_bytes("zoom", name), max_records=100, limits=Limits())


def inbound(body: bytes, headers: dict[str, str], method: str = "POST") -> Inbound:
    return Inbound(method=method, body=body, content_type="application/json", headers=headers)


def test_the_kind_is_registered_as_a_batch_kind() -> None:
    assert KIND.name == "zoom"
    assert KIND.batch is True
    assert KIND.signature_header == "x-zm-signature"


def test_attendee_report_takes_the_attendee_section_only() -> None:
    records = rows("attendee_report.csv")
    # Not the host (Mara) nor the panelist (Tom): the four attendee rows, rejoin included.
    assert [r.get("Email") for r in records] == [
        "jana.mueller@kontor-logistik.de",
        "jana.mueller@kontor-logistik.de",
        "p.lefevre@atelier-numerique.fr",
        "--",
    ]
    leads = [lead_from("zoom", r) for r in records]
    jana = {
        "email": "jana.mueller@kontor-logistik.de",
        "email_domain": "kontor-logistik.de",
        "first_name": "Jana",
        "last_name": "Müller",
        "phone": "+49301234567",
        "company": "Kontor Logistik GmbH",
        "domain": "kontor-logistik.de",
        "title": "Head of Sales Operations",
        "country": "DE",
    }
    assert [lead.fields for lead in leads] == [
        jana,
        jana,
        {
            "email": "p.lefevre@atelier-numerique.fr",
            "email_domain": "atelier-numerique.fr",
            "first_name": "Pierre",
            "last_name": "Lefèvre",
            "company": "Atelier Numérique SAS",
            "domain": "atelier-numerique.fr",
            "title": "CTO",
            "country": "FR",
        },
        # A guest who never registered: only the display name, which is no lead.
        {"first_name": "guest-4711", "country": "US"},
    ]
    assert leads[0].custom == {
        "Attended": "Yes",
        "User Name (Original Name)": "Jana Müller",
        "Registration Time": "03/02/2025 10:14:31 AM",
        "Approval Status": "approved",
        "Join Time": "03/13/2025 04:01:05 PM",
        "Leave Time": "03/13/2025 04:59:40 PM",
        "Time in Session (minutes)": "59",
        "Is Guest": "No",
        "Source Name": "LinkedIn",
    }
    assert leads[1].custom["Time in Session (minutes)"] == "2"
    # Zoom's "--" placeholder is no phone; the attendance columns keep it as sent.
    assert "phone" not in leads[2].fields
    assert leads[2].custom["Join Time"] == "--"
    assert leads[3].custom["Is Guest"] == "Yes"
    assert all(lead.flags == () for lead in leads)


def test_registration_report() -> None:
    leads = [lead_from("zoom", r) for r in rows("registration_report.csv")]
    assert [lead.fields for lead in leads] == [
        {
            "email": "lukasz.wisniewski@hurtownia-plus.pl",
            "email_domain": "hurtownia-plus.pl",
            "first_name": "Łukasz",
            "last_name": "Wiśniewski",
            "phone": "+48225550123",
            "company": "Hurtownia Plus sp. z o.o.",
            "domain": "hurtownia-plus.pl",
            "title": "Kierownik Sprzedaży",
            "country": "PL",
            "region": "14",
            "postal_code": "00-950",
            "employees": 51,
        },
        {
            "email": "ana.garcia@grupo-norte.es",
            "email_domain": "grupo-norte.es",
            "first_name": "Ana",
            "last_name": "García López",
            "phone": "+34912345678",
            "company": "Grupo Norte S.L.",
            "domain": "grupo-norte.es",
            "title": "Directora de Marketing",
            "country": "ES",
            "region": "MD",
            "postal_code": "28013",
            "employees": 101,
        },
        {
            "email": "jill.chill@cooking-org.com",
            "email_domain": "cooking-org.com",
            "first_name": "Jill",
            "last_name": "Chill",
            "company": "Cooking Org",
            "domain": "cooking-org.com",
            "title": "Chef",
            "country": "US",
            "region": "CA",
            "postal_code": "94045",
            "employees": 1,
        },
    ]
    assert leads[0].custom == {
        "Registration Time": "03/01/2025 02:45:10 PM",
        "Approval Status": "approved",
        "What CRM do you use?": "Salesforce",
        "Source Name": "LinkedIn",
        "Attendance Type": "Live",
    }
    assert leads[0].flags == ()
    # Zoom's own sample phone has no country code: kept as sent, flagged.
    assert leads[2].custom["phone"] == "5550100"
    assert leads[2].flags == ("invalid_phone",)


def test_webinar_registration_created_webhook() -> None:
    lead = lead_from("zoom", fixture_record("zoom", "webinar_registration_created.json"))
    assert lead.fields == {
        "email": "jana.mueller@kontor-logistik.de",
        "email_domain": "kontor-logistik.de",
        "first_name": "Jana",
        "last_name": "Müller",
        "phone": "+49301234567",
        "company": "Kontor Logistik GmbH",
        "domain": "kontor-logistik.de",
        "title": "Head of Sales Operations",
        "country": "DE",
        "region": "BE",
        "city": "Berlin",
        "postal_code": "10117",
        "employees": 101,
        "industry": "Logistics",
        "external_id": "9tboDiHUQAeOnbmudzWa5g",
    }
    assert lead.custom["What CRM do you use?"] == "Salesforce"
    assert lead.custom["purchasing_time_frame"] == "1-3 months"
    assert lead.custom["comments"] == "Looking forward to the routing demo."
    assert lead.custom["webinar_topic"] == "Pipeline Automation for RevOps"
    assert lead.custom["event"] == "webinar.registration_created"
    assert lead.flags == ()


def test_a_webhook_without_a_registrant_is_no_lead_but_no_error() -> None:
    flat = KIND.decode({"event": "webinar.started", "payload": {"object": {"id": 1}}}, {})
    assert flat == {"webinar_id": 1, "event": "webinar.started"}


def test_verify_accepts_the_documented_signature() -> None:
    headers = {"x-zm-signature": SIGNATURE, "x-zm-request-timestamp": SIGNED_AT}
    assert KIND.verify is not None
    assert KIND.verify(inbound(SIGNED_BODY, headers), SECRET, NOW) is True


def test_verify_refuses_wrong_secret_tampering_staleness_and_missing_headers() -> None:
    assert KIND.verify is not None
    good = {"x-zm-signature": SIGNATURE, "x-zm-request-timestamp": SIGNED_AT}
    assert not KIND.verify(inbound(SIGNED_BODY, good), "another-secret", NOW)
    assert not KIND.verify(inbound(SIGNED_BODY.replace(b"session", b"meeting"), good), SECRET, NOW)
    later = datetime.fromtimestamp(1658940994 + 301, tz=UTC)
    assert not KIND.verify(inbound(SIGNED_BODY, good), SECRET, later)
    other_time = {**good, "x-zm-request-timestamp": "1658940995"}
    assert not KIND.verify(inbound(SIGNED_BODY, other_time), SECRET, NOW)
    assert not KIND.verify(inbound(SIGNED_BODY, {"x-zm-request-timestamp": SIGNED_AT}), SECRET, NOW)
    assert not KIND.verify(inbound(SIGNED_BODY, {"x-zm-signature": SIGNATURE}), SECRET, NOW)
    assert not KIND.verify(inbound(SIGNED_BODY, good), "", NOW)


def test_handshake_answers_the_url_validation_challenge() -> None:
    assert KIND.handshake is not None
    body = json.dumps(
        {
            "payload": {"plainToken": "qgg8vlvZRS6UYooatFL8Aw"},
            "event_ts": 1654503849680,
            "event": "endpoint.url_validation",
        }
    ).encode()
    reply = KIND.handshake(inbound(body, {}), SECRET, {})
    assert reply is not None
    assert reply.status == 200
    assert reply.content_type == "application/json"
    assert json.loads(reply.body) == {
        "plainToken": "qgg8vlvZRS6UYooatFL8Aw",
        # HMAC-SHA256("zoom-secret-token", plainToken) in hex, computed once.
        "encryptedToken": "d9e0d764a78494688ba3f2d5c0ed4ca311394b4834d959759213424d2df961e3",
    }


def test_handshake_ignores_everything_else() -> None:
    assert KIND.handshake is not None
    webhook = fixture_bytes("zoom", "webinar_registration_created.json")
    assert KIND.handshake(inbound(webhook, {}), SECRET, {}) is None
    challenge = b'{"event": "endpoint.url_validation", "payload": {"plainToken": "x"}}'
    assert KIND.handshake(inbound(challenge, {}, method="GET"), SECRET, {}) is None
    assert KIND.handshake(inbound(challenge, {}), "", {}) is None
    assert KIND.handshake(inbound(b"endpoint.url_validation {", {}), SECRET, {}) is None
    no_token = b'{"event": "endpoint.url_validation", "payload": {}}'
    assert KIND.handshake(inbound(no_token, {}), SECRET, {}) is None


def test_the_url_validation_handshake_is_no_signing_oracle() -> None:
    # Review finding: the handshake signed any plainToken with the key that signs deliveries,
    # so "v0:<ts>:<forged body>" gave a stranger a valid x-zm-signature.
    from datetime import UTC, datetime

    from leads.sources.base import Inbound

    now = datetime.now(tz=UTC)
    forged = b'{"event": "webinar.registration_created", "payload": {}}'
    ts = str(int(now.timestamp()))
    plain = "v0:" + ts + ":" + forged.decode()
    ask = json.dumps({"event": "endpoint.url_validation", "payload": {"plainToken": plain}})
    reply = KIND.handshake(Inbound("POST", ask.encode(), "application/json", {}), "zoom-secret", {})
    assert reply is None
    ok = json.dumps(
        {"event": "endpoint.url_validation", "payload": {"plainToken": "qgg8vlvZRS6UYooatFL8Aw"}}
    )
    answer = KIND.handshake(Inbound("POST", ok.encode(), "application/json", {}), "zoom-secret", {})
    assert answer is not None
    assert json.loads(answer.body)["plainToken"] == "qgg8vlvZRS6UYooatFL8Aw"
