"""LinkedIn Lead Gen Forms: documented form responses and notification, signature, validation."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime

import pytest

from leads.models import RefusedPayload
from leads.sources import kind_get
from leads.sources.base import Inbound
from tests.leads.conftest import auth
from tests.leads.factories import SourceFactory
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = "linkedin"
NOW = datetime(2024, 6, 3, 9, 0, tzinfo=UTC)
CLIENT_SECRET = "WPL_AP1.k3yS3cr3t.Abc123=="
QUESTIONS = {
    "1": "first_name",
    "2": "last_name",
    "3": "email",
    "4": "company",
    "5": "title",
    "6": "country",
    "7": "phone",
    "8": "Preferred contact time",
}


def test_form_response_mapped_by_the_questions_option() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "form_response.json"), {"questions": QUESTIONS})
    assert lead.fields == {
        "email": "anna.schroeder@kraftwerk-systems.de",
        "email_domain": "kraftwerk-systems.de",
        "first_name": "Anna",
        "last_name": "Schröder",
        "phone": "+498921803456",
        "company": "Kraftwerk Systems AG",
        "domain": "kraftwerk-systems.de",
        "title": "Head of Procurement",
        "country": "DE",
        "external_id": "1ccd2ccc-67fa-4c5a-a123-fb3d8b1ffd71-4",
    }
    # A label that is no field names the answer; a choice without its form stays an option id.
    assert lead.custom["Preferred contact time"] == "2"
    assert lead.custom["question 9"] == "Rollout in Q3"
    assert lead.custom["linkedin_lead_type"] == "SPONSORED"
    assert lead.custom["linkedin_owner"] == "urn:li:sponsoredAccount:522529623"
    assert lead.custom["linkedin_campaign"] == "urn:li:sponsoredCampaign:367378525"
    assert lead.custom["linkedin_submitted_at"] == 1686182358881
    assert lead.custom["linkedin_test_lead"] is False
    assert lead.custom["consent 5"] == "true"
    assert lead.flags == ()


def test_questions_option_as_a_json_string() -> None:
    options = {"questions": json.dumps(QUESTIONS)}
    lead = lead_from(KIND, fixture_record(KIND, "form_response.json"), options)
    assert lead.fields["company"] == "Kraftwerk Systems AG"
    assert lead.fields["country"] == "DE"


def test_form_response_without_mapping_keeps_answers_by_question_id() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "form_response.json"))
    # Only what a value itself proves is read: a valid e-mail and an international phone.
    assert lead.fields == {
        "email": "anna.schroeder@kraftwerk-systems.de",
        "email_domain": "kraftwerk-systems.de",
        "phone": "+498921803456",
        "domain": "kraftwerk-systems.de",
        "external_id": "1ccd2ccc-67fa-4c5a-a123-fb3d8b1ffd71-4",
    }
    assert lead.custom["question 1"] == "Anna"
    assert lead.custom["question 4"] == "Kraftwerk Systems AG"
    assert lead.custom["question 6"] == "Deutschland"
    assert lead.custom["question 8"] == "2"


def test_form_response_with_its_form_reads_predefined_fields_and_choice_labels() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "form_response_with_form.json"))
    assert lead.fields == {
        "email": "jl.pena@finanzas-iberica.es",
        "email_domain": "finanzas-iberica.es",
        "first_name": "José Luis",
        "last_name": "Peña Álvarez",
        "phone": "+34912345678",
        "company": "Finanzas Ibérica S.L.",
        "domain": "finanzas-iberica.es",
        "country": "ES",
        "external_id": "8b3f0c1e-2d4a-4e7b-9c1d-5a6f7e8d9c0b-2",
    }
    assert lead.custom["Seniority"] == "Director"
    assert lead.custom["¿Qué productos le interesan?"] == "Contabilidad; Tesorería"
    assert lead.custom["hidden_field"] == "abc678"
    assert lead.custom["campo_escondido"] == "def789"
    assert lead.custom["linkedin_form_name"] == "Form with written spanish"
    assert lead.custom["linkedin_campaign_name"] == "ES - Finance leaders - Q2"
    assert lead.custom["consent 12"] == "false"
    assert lead.flags == ()


def test_option_mapping_wins_over_the_form() -> None:
    record = fixture_record(KIND, "form_response_with_form.json")
    lead = lead_from(KIND, record, {"questions": {"707234246": "title"}})
    assert lead.fields["title"] == "Director"
    assert "Seniority" not in lead.custom


def test_lead_notification_carries_the_response_id() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "lead_notification.json"))
    # The bare id: the same key as the response the notification announces.
    assert lead.fields == {"external_id": "1ccd2ccc-67fa-4c5a-a123-fb3d8b1ffd71-4"}
    assert lead.custom == {
        "linkedin_lead_response": (
            "urn:li:leadGenFormResponse:1ccd2ccc-67fa-4c5a-a123-fb3d8b1ffd71-4"
        ),
        "linkedin_notification_type": "LEAD_ACTION",
        "linkedin_lead_action": "CREATED",
        "linkedin_occurred_at": 1686182358881,
        "linkedin_lead_type": "SPONSORED",
        "linkedin_form": "urn:li:versionedLeadGenForm:(urn:li:leadGenForm:5001,1)",
        "linkedin_owner": "urn:li:sponsoredAccount:522529623",
        "linkedin_associated_entity": "urn:li:sponsoredCreative:241257736",
    }


def test_answers_naming_their_own_fields_and_a_flat_forward() -> None:
    record = {
        "id": "abc-1",
        "answers": [
            {
                "questionId": 1,
                "name": "firstName",
                "answerDetails": {"textQuestionAnswer": {"answer": "Ana"}},
            },
            {
                "questionId": 2,
                "predefinedField": "COMPANY_NAME",
                "answerDetails": {"textQuestionAnswer": {"answer": "Acme"}},
            },
        ],
        "Country": "Portugal",
    }
    lead = lead_from(KIND, record)
    assert lead.fields == {
        "first_name": "Ana",
        "company": "Acme",
        "country": "PT",
        "external_id": "abc-1",
    }


# --- signature and validation --------------------------------------------------------------


def _signed(body: bytes, secret: str = CLIENT_SECRET, header: str | None = None) -> Inbound:
    digest = hmac.new(secret.encode(), b"hmacsha256=" + body, hashlib.sha256).hexdigest()
    headers = {"x-li-signature": digest if header is None else header}
    return Inbound(method="POST", body=body, content_type="application/json", headers=headers)


def test_a_valid_signature_passes() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "lead_notification.json")
    assert verify(_signed(body), CLIENT_SECRET, NOW)
    digest = hmac.new(CLIENT_SECRET.encode(), b"hmacsha256=" + body, hashlib.sha256).hexdigest()
    assert verify(_signed(body, header=f"hmacsha256={digest}"), CLIENT_SECRET, NOW)
    assert kind_get(KIND).signature_header == "X-LI-Signature"


def test_wrong_secret_tampered_body_and_missing_header_fail() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "lead_notification.json")
    assert not verify(_signed(body, secret="not-the-secret"), CLIENT_SECRET, NOW)
    signed = _signed(body)
    tampered = Inbound(
        method="POST",
        body=body.replace(b"CREATED", b"DELETED"),
        content_type="application/json",
        headers=signed.headers,
    )
    assert not verify(tampered, CLIENT_SECRET, NOW)
    assert not verify(_signed(body, header=""), CLIENT_SECRET, NOW)
    # The digest of the bare body (without the "hmacsha256=" prefix) is not LinkedIn's.
    bare = hmac.new(CLIENT_SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert not verify(_signed(body, header=bare), CLIENT_SECRET, NOW)


def _get(query: dict[str, str], method: str = "GET") -> Inbound:
    return Inbound(method=method, body=b"", content_type="", headers={}, query=query)


def test_challenge_is_answered_with_its_hmac() -> None:
    handshake = kind_get(KIND).handshake
    assert handshake is not None
    code = "890e4665-4dfe-4ab1-b689-ed553bceeed0"
    reply = handshake(_get({"challengeCode": code}), CLIENT_SECRET, {})
    assert reply is not None
    assert reply.status == 200
    assert reply.content_type == "application/json"
    expected = hmac.new(CLIENT_SECRET.encode(), code.encode(), hashlib.sha256).hexdigest()
    assert json.loads(reply.body) == {"challengeCode": code, "challengeResponse": expected}


def test_challenge_that_is_no_uuid_or_without_secret_is_refused() -> None:
    handshake = kind_get(KIND).handshake
    assert handshake is not None
    # Answering this would sign a forged notification body for the caller.
    forged = 'hmacsha256={"leadAction": "CREATED"}'
    reply = handshake(_get({"challengeCode": forged}), CLIENT_SECRET, {})
    assert reply is not None
    assert reply.status == 400
    code = "890e4665-4dfe-4ab1-b689-ed553bceeed0"
    reply = handshake(_get({"challengeCode": code}), "", {})
    assert reply is not None
    assert reply.status == 403


def test_other_requests_are_no_handshake() -> None:
    handshake = kind_get(KIND).handshake
    assert handshake is not None
    assert handshake(_get({}), CLIENT_SECRET, {}) is None
    code = "890e4665-4dfe-4ab1-b689-ed553bceeed0"
    assert handshake(_get({"challengeCode": code}, method="POST"), CLIENT_SECRET, {}) is None


@pytest.mark.django_db
def test_a_lead_notification_is_refused_saying_where_the_answers_come_from(
    client, published
) -> None:
    source = SourceFactory(slug="li", kind="linkedin")
    response = client.post(
        "/api/v1/intake/li/",
        fixture_bytes("linkedin", "lead_notification.json"),
        content_type="application/json",
        **auth("li"),
    )
    assert response.status_code == 422
    message = response.json()["error"]["message"]
    assert "LinkedIn lead notification" in message
    assert "leadFormResponses" in message
    refused = RefusedPayload.objects.get(source=source)
    assert "LinkedIn lead notification" in refused.message
    # A form response is still a lead, whatever the notice says.
    assert (
        kind_get("linkedin").awaits_fetch(fixture_record("linkedin", "form_response.json"), {})
        is None
    )
