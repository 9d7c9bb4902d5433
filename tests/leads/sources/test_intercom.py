"""The Intercom kind: its documented notifications, the signature and the ping handshake."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime

from leads.sources import flatten, kind_get, record_is_lead
from leads.sources.base import Inbound, Reply
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = "intercom"
SECRET = "a1b2c3d4e5f6client_secret"
NOW = datetime(2026, 1, 10, 4, 42, tzinfo=UTC)


def test_contact_lead_created() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "contact_lead_created.json"))
    assert lead.fields == {
        "email": "jana.schroeder@nordwind-logistik.de",
        "email_domain": "nordwind-logistik.de",
        "first_name": "Jana",
        "last_name": "Schröder",
        "phone": "+49301234567",
        "company": "Nordwind Logistik GmbH",
        "domain": "nordwind-logistik.de",
        "title": "Head of Operations",
        "country": "DE",
        "region": "BE",
        "city": "Berlin",
        "utm_source": "google",
        "utm_medium": "cpc",
        "utm_campaign": "q1-logistics",
        "external_id": "notif_204d32ad-f47a-4276-8074-e5ce789d2987",
    }
    # "role" is Intercom's lead/user switch, not a job title; its own ids are kept apart.
    assert lead.custom["intercom_role"] == "lead"
    assert lead.custom["intercom_contact_id"] == "6961d897719c606240178da8"
    assert lead.custom["intercom_user_id"] == "c3ca7689-a3c1-4a05-b81d-6cdf995cea85"
    assert lead.custom["plan_interest"] == "Enterprise"
    assert lead.custom["intercom_topic"] == "contact.lead.created"
    assert "utm_term" not in lead.custom  # null values are no answers
    assert lead.flags == ()


def test_contact_user_created_with_company_and_tag() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "contact_user_created.json"))
    assert lead.fields == {
        "email": "m.keller@alpenglas.ch",
        "email_domain": "alpenglas.ch",
        "first_name": "Martina",
        "last_name": "Keller",
        "phone": "+41446681800",
        "company": "Alpenglas AG",
        "domain": "alpenglas.ch",
        "country": "CH",
        "region": "ZH",
        "city": "Zurich",
        "employees": 240,
        "industry": "Manufacturing",
        "website": "https://www.alpenglas.ch",
        "external_id": "notif_c47f7aeb-bdeb-4d35-8fc7-eb945334fdad",
    }
    assert lead.custom["tags"] == "trial"
    assert lead.custom["intercom_company_id"] == "alpenglas"
    assert lead.custom["intercom_role"] == "user"
    assert lead.flags == ()


def test_conversation_user_created_takes_the_author() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "conversation_user_created.json"))
    assert lead.fields == {
        "email": "lukas.bauer@kraemer-maschinenbau.de",
        "email_domain": "kraemer-maschinenbau.de",
        "first_name": "Lukas",
        "last_name": "Bauer",
        "domain": "kraemer-maschinenbau.de",
        "external_id": "notif_3ac27816-d27c-45fd-a65a-bbaf021cf780",
    }
    assert lead.custom["intercom_conversation_id"] == "21321941764"
    assert lead.custom["intercom_contact_id"] == "5c9553cb27e377f24eed49f7"
    assert lead.custom["message"].startswith("<p>Hallo, wir suchen")
    assert lead.flags == ()


def test_conversation_v1_anonymous_lead_is_no_lead() -> None:
    record = fixture_record(KIND, "conversation_user_created_v1.json")
    flat = flatten(record, kind=KIND)
    assert not record_is_lead(flat, None)  # a pseudonym and no e-mail
    assert flat.record["full_name"] == "Rose Poodle from St. John's"
    assert flat.record["intercom_user_id"] == "75067020-1204-495c-8edc-abb7d88bdd43"
    assert flat.record["external_id"] == "notif_3ac27816-d27c-45fd-a65a-bbaf021cf780"
    assert flat.record["intercom_role"] == "lead"
    assert "intercom_role (2)" not in flat.record  # the message's author is the same person
    lead = lead_from(KIND, record)
    assert lead.fields == {
        "first_name": "Rose",
        "last_name": "Poodle from St. John's",
        # not a lead, so the generic look below the top level adds what it finds
        "website": "http://localhost:9991/api/",
        "external_id": "notif_3ac27816-d27c-45fd-a65a-bbaf021cf780",
    }
    assert lead.flags == ("found_below_top_level", "unknown_region")


def test_ping_is_answered_and_no_lead() -> None:
    body = fixture_bytes(KIND, "ping.json")
    ping = Inbound("POST", body, "application/json", {})
    handshake = kind_get(KIND).handshake
    assert handshake is not None
    assert handshake(ping, SECRET, {}) == Reply(200, b"")
    assert handshake(Inbound("HEAD", b"", "", {}), SECRET, {}) == Reply(200, b"")
    lead_body = fixture_bytes(KIND, "contact_lead_created.json")
    assert handshake(Inbound("POST", lead_body, "application/json", {}), SECRET, {}) is None
    assert lead_from(KIND, json.loads(body)).fields == {}


def _signed(body: bytes, secret: str = SECRET) -> Inbound:
    digest = hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()
    return Inbound("POST", body, "application/json", {"x-hub-signature": f"sha1={digest}"})


def test_verify() -> None:
    kind = kind_get(KIND)
    assert kind.verify is not None
    assert kind.signature_header == "X-Hub-Signature"
    body = fixture_bytes(KIND, "contact_lead_created.json")
    assert kind.verify(_signed(body), SECRET, NOW)
    assert not kind.verify(_signed(body, "another secret"), SECRET, NOW)
    tampered = _signed(body)
    tampered = Inbound("POST", body.replace(b"Jana", b"Jena"), "", tampered.headers)
    assert not kind.verify(tampered, SECRET, NOW)
    assert not kind.verify(Inbound("POST", body, "", {}), SECRET, NOW)
    bare = _signed(body).headers["x-hub-signature"].removeprefix("sha1=")
    assert not kind.verify(Inbound("POST", body, "", {"x-hub-signature": bare}), SECRET, NOW)
    assert not kind.verify(_signed(body), "", NOW)


def test_bare_contact_object() -> None:
    item = fixture_record(KIND, "contact_lead_created.json")["data"]["item"]
    lead = lead_from(KIND, item)
    assert lead.fields["email"] == "jana.schroeder@nordwind-logistik.de"
    assert lead.fields["external_id"] == "6961d897719c606240178da8"  # no envelope: the item id
