"""The Segment kind: documented Identify / Track calls and the X-Signature HMAC."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime

from leads.sources import kind_get
from leads.sources.base import Inbound
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = "segment"
SECRET = "segment-shared-secret"
NOW = datetime(2026, 3, 4, 9, 16, tzinfo=UTC)


def test_identify_spec_example() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "identify_spec_example.json"))
    assert lead.fields == {
        "email": "peter@example.com",
        "email_domain": "example.com",
        "first_name": "Peter",
        "last_name": "Gibbons",
        "domain": "example.com",
        "country": "US",
        "region": "CA",
        "city": "San Francisco",
        "postal_code": "94103",
        "external_id": "022bb90c-bbac-11e4-8dfc-aa07a5b093db",
    }
    assert lead.custom["plan"] == "premium"
    assert lead.custom["logins"] == 5
    assert lead.custom["street"] == "6th St"
    assert lead.custom["segment_user_id"] == "97980cfea0067"
    assert lead.custom["segment_anonymous_id"] == "507f191e810c19729de860ea"
    assert lead.flags == ()


def test_identify_webhooks_destination_sample() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "identify_webhooks_destination.json"))
    assert lead.fields == {
        "email": "achilles@segment.com",
        "email_domain": "segment.com",
        "first_name": "Achilles",
        "domain": "segment.com",
    }
    assert lead.custom["subscriptionPlan"] == "Premium"
    assert lead.custom["friendCount"] == 29
    assert lead.custom["segment_call"] == "identify"


def test_identify_b2b_reserved_traits() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "identify_b2b.json"))
    assert lead.fields == {
        "email": "k.vogel@brennwerk-energie.de",
        "email_domain": "brennwerk-energie.de",
        "first_name": "Katrin",
        "last_name": "Vogel",
        "phone": "+498920195500",
        "company": "Brennwerk Energie GmbH",
        "domain": "brennwerk-energie.de",
        "title": "VP Procurement",
        "country": "DE",
        "region": "BY",
        "city": "München",
        "postal_code": "80331",
        "employees": 850,
        "industry": "Utilities",
        "utm_source": "linkedin",
        "utm_medium": "paid_social",
        "utm_campaign": "crm-migration-2026",
        "website": "https://www.brennwerk-energie.de",
        "external_id": "api-2f8c7d6e-3b1a-4e5f-9c8d-7a6b5c4d3e2f",
    }
    assert lead.custom["company_id"] == "acct_48213"
    assert lead.custom["company_plan"] == "Enterprise"
    assert lead.custom["utm_term"] == "crm software"
    assert lead.custom["utm_content"] == "carousel-a"
    assert lead.custom["page_url"] == "https://www.example.com/demo"
    assert lead.flags == ()


def test_identify_snake_case_and_company_string() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "identify_snake_case.json"))
    assert lead.fields == {
        "email": "soren.kjaer@havnekontor.dk",
        "email_domain": "havnekontor.dk",
        "first_name": "Søren",
        "last_name": "Kjær",
        "phone": "+4532123456",
        "company": "Havnekontoret ApS",
        "domain": "havnekontor.dk",
        "country": "DK",
        "city": "København",
        "postal_code": "1050",
        "external_id": "ajs-next-1a2b3c4d5e6f708192a3b4c5d6e7f809",
    }
    assert lead.custom["newsletter"] is True
    assert "segment_user_id" not in lead.custom  # userId null: an anonymous visitor


def test_track_with_context_traits() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "track_signed_up.json"))
    assert lead.fields == {
        "email": "ines.moreau@atelier-lumiere.fr",
        "email_domain": "atelier-lumiere.fr",
        "first_name": "Inès",
        "last_name": "Moreau",
        "phone": "+33142685300",
        "company": "Atelier Lumière SAS",
        "domain": "atelier-lumiere.fr",
        "country": "FR",
        "city": "Paris",
        "employees": 51,
        "external_id": "ajs-0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a",
    }
    assert lead.custom["event"] == "Signed Up"
    assert lead.custom["plan"] == "Team"
    assert lead.custom["seats"] == "25"
    assert lead.custom["segment_call"] == "track"


def test_message_wrapped_by_a_mapping() -> None:
    message = fixture_record(KIND, "identify_b2b.json")
    lead = lead_from(KIND, {"data": message, "receivedBy": "actions-webhook"})
    assert lead.fields["email"] == "k.vogel@brennwerk-energie.de"
    assert lead.fields["external_id"] == "api-2f8c7d6e-3b1a-4e5f-9c8d-7a6b5c4d3e2f"
    assert lead.custom["receivedBy"] == "actions-webhook"


def test_group_traits_are_the_company() -> None:
    group = {
        "type": "group",
        "groupId": "0e8c78ea9d97a7b8185e8632",
        "userId": "019mr8mf4r",
        "traits": {"name": "Initech", "industry": "Technology", "employees": 329},
    }
    flat = kind_get(KIND).decode(group, {})
    assert flat["company"] == "Initech"
    assert flat["employees"] == 329
    assert "full_name" not in flat


def _signed(body: bytes, secret: str = SECRET) -> Inbound:
    digest = hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()
    return Inbound("POST", body, "application/json", {"x-signature": digest})


def test_verify() -> None:
    kind = kind_get(KIND)
    assert kind.verify is not None
    assert kind.signature_header == "X-Signature"
    body = fixture_bytes(KIND, "identify_b2b.json")
    assert kind.verify(_signed(body), SECRET, NOW)
    assert not kind.verify(_signed(body, "wrong"), SECRET, NOW)
    tampered = Inbound("POST", body + b" ", "application/json", _signed(body).headers)
    assert not kind.verify(tampered, SECRET, NOW)
    assert not kind.verify(Inbound("POST", body, "application/json", {}), SECRET, NOW)
    assert not kind.verify(_signed(body), "", NOW)
