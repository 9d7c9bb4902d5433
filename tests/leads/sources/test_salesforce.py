"""The Salesforce kind: Flow / Apex callout JSON, and the Outbound Message (SOAP) with its ack."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leads.sources import kind_get
from leads.sources.base import DecodeError, Inbound, Record
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = "salesforce"
OM_NS = "{http://soap.sforce.com/2005/09/outbound}"
SOAP_NS = "{http://schemas.xmlsoap.org/soap/envelope/}"


def parse(body: bytes) -> list[Record]:
    hook = kind_get(KIND).parse
    assert hook is not None
    return hook(Inbound(method="POST", body=body, content_type="text/xml", headers={}))


def parse_fixture(name: str) -> list[Record]:
    return parse(fixture_bytes(KIND, name))


def test_outbound_message_lead() -> None:
    records = parse_fixture("outbound_message_lead.xml")
    assert len(records) == 1
    lead = lead_from(KIND, records[0])
    assert lead.fields == {
        "email": "katrin.vogel@nordlicht-logistik.de",
        "email_domain": "nordlicht-logistik.de",
        "first_name": "Katrin",
        "last_name": "Vogel",
        "phone": "+494038612290",
        "company": "Nordlicht Logistik GmbH",
        "domain": "nordlicht-logistik.de",
        "title": "Head of Supply Chain",
        "country": "DE",
        "region": "HH",
        "city": "Hamburg",
        "postal_code": "20457",
        "employees": 250,
        "annual_revenue": 42000000,
        "industry": "Transportation",
        "website": "www.nordlicht-logistik.de",
        # The notification id: Salesforce resends an unacknowledged notification with it.
        "external_id": "04l5e00000Gx7QzAAJ",
    }
    assert lead.custom["salesforce_id"] == "00Q5e00000AbCdEEAV"
    assert lead.custom["sobject_type"] == "Lead"
    assert lead.custom["LeadSource"] == "Web"
    assert lead.custom["Status"] == "Open - Not Contacted"
    assert lead.custom["Product_Interest__c"] == "Routing;Analytics"
    assert lead.custom["OrganizationId"] == "00D5e000000KQ2eEAG"
    assert lead.custom["ActionId"] == "04k5e000000CaRkAAK"
    assert lead.flags == ()


def test_outbound_message_with_two_contacts_is_two_records() -> None:
    first, second = parse_fixture("outbound_message_two_contacts.xml")
    assert "SessionId" not in first  # a live API session: never stored
    assert "00D5e000000KQ2e!AQ4AQFakeSessionIdForTheFixture" not in repr(first)
    one = lead_from(KIND, first)
    assert one.fields == {
        "email": "yuki.tanaka@sakura-denki.co.jp",
        "email_domain": "sakura-denki.co.jp",
        "first_name": "Yuki",
        "last_name": "Tanaka",
        "phone": "+819012345678",  # MobilePhone: Phone is xsi:nil
        "domain": "sakura-denki.co.jp",
        "title": "営業部長",
        "country": "JP",
        "city": "Osaka",
        "external_id": "04l5e00000Gx8AbAAJ",
    }
    assert one.custom["AccountId"] == "0015e00000ZkM3hAAF"
    assert one.custom["sobject_type"] == "Contact"
    two = lead_from(KIND, second)
    assert two.fields == {
        "email": "o.brien@emeraldsoftware.ie",
        "email_domain": "emeraldsoftware.ie",
        "first_name": "Siobhán",
        "last_name": "O'Brien",
        "phone": "+35315550142",
        "domain": "emeraldsoftware.ie",
        "country": "IE",  # MailingCountryCode, as MailingCountry is empty
        "external_id": "04l5e00000Gx8AcAAJ",
    }
    assert two.custom["salesforce_id"] == "0035e00000XyZ13AAF"
    assert two.flags == ()


def test_flow_callout_lead_json() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "flow_callout_lead.json"))
    assert lead.fields == {
        "email": "marco.rossi@fonderia-alpina.it",
        "email_domain": "fonderia-alpina.it",
        "first_name": "Marco",
        "last_name": "Rossi",
        "phone": "+390287654321",
        "company": "Fonderia Alpina S.p.A.",
        "domain": "fonderia-alpina.it",
        "title": "Direttore Acquisti",
        "country": "IT",
        "region": "25",  # ISO 3166-2 IT-25, Lombardia
        "city": "Milano",
        "postal_code": "20121",
        "employees": 1200,
        "annual_revenue": 350000000,
        "industry": "Manufacturing",
        "lead_score": 87,
        "utm_source": "linkedin",
        "utm_medium": "paid_social",
        "utm_campaign": "emea-q1-foundry",
        "website": "https://www.fonderia-alpina.it",
        "external_id": "00Q5e00000AbCdFEAV:2026-01-20T11:05:03.000+0000",
    }
    assert lead.custom["LeadSource"] == "Trade Show"
    assert lead.custom["Rating"] == "Hot"
    assert lead.custom["HasOptedOutOfEmail"] is False
    assert lead.custom["salesforce_record_url"] == (
        "/services/data/v61.0/sobjects/Lead/00Q5e00000AbCdFEAV"
    )
    assert "Description" not in lead.custom  # null
    assert lead.flags == ()


def test_flow_sobject_wrapped_contact_with_account_and_owner() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "flow_sobject_contact.json"))
    assert lead.fields == {
        "email": "ana.souza@cafeserra.com.br",
        "email_domain": "cafeserra.com.br",
        "first_name": "Ana",
        "last_name": "Souza",
        "phone": "+551134567890",
        "company": "Café Serra Ltda.",  # Account.Name
        "domain": "cafeserra.com.br",
        "title": "Gerente de Compras",
        "country": "BR",
        "region": "SP",
        "city": "São Paulo",
        "external_id": "0035e00000XyZ14AAF:2026-02-03T14:00:00.000+0000",
    }
    # The owner is another person: kept whole, never read as the lead.
    assert lead.custom["Owner"]["Email"] == "peter.hall@acme-saas.example"
    assert lead.custom["event"] == "contact_created"
    assert lead.flags == ()


def test_query_result_first_record_with_name_and_country_code() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "query_records.json"))
    assert lead.fields == {
        "email": "emma.johansson@fjordtech.se",
        "email_domain": "fjordtech.se",
        "first_name": "Emma",
        "last_name": "Johansson",
        "phone": "+46812345678",
        "company": "Fjordtech AB",
        "domain": "fjordtech.se",
        "country": "SE",
        "external_id": "00Q5e00000AbCdGEAV",
    }
    assert lead.custom["totalSize"] == 1
    assert lead.flags == ()


def test_acknowledge_is_the_soap_notifications_response() -> None:
    hook = kind_get(KIND).acknowledge
    assert hook is not None
    reply = hook(["3f1c…"])
    assert reply.status == 200
    assert reply.content_type.startswith("text/xml")
    root = ET.fromstring(reply.body)  # noqa: S314 - our own constant
    assert root.tag == f"{SOAP_NS}Envelope"
    ack = root.find(f"{SOAP_NS}Body/{OM_NS}notificationsResponse/{OM_NS}Ack")
    assert ack is not None
    assert ack.text == "true"


@pytest.mark.parametrize(
    "body",
    [
        b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">]><notifications/>',
        b'<!doctype x SYSTEM "file:///etc/passwd"><notifications/>',
        b"<notifications><Notification>",  # not well-formed
        b"<Envelope><Body><other/></Body></Envelope>",  # no notifications
        b'<notifications xmlns="http://soap.sforce.com/2005/09/outbound"/>',  # none inside
        '<!DOCTYPE x [<!ENTITY a "b">]><notifications/>'.encode("utf-16"),
        b"\xff\xfe not utf-8",
    ],
)
def test_parse_refuses_dtds_bad_xml_and_other_bodies(body: bytes) -> None:
    with pytest.raises(DecodeError):
        parse(body)


def test_parse_refuses_more_than_a_hundred_notifications() -> None:
    one = b"<Notification><Id>04l</Id><sObject><Email>a@b.de</Email></sObject></Notification>"
    with pytest.raises(DecodeError):
        parse(b"<notifications>" + one * 101 + b"</notifications>")
    assert len(parse(b"<notifications>" + one * 100 + b"</notifications>")) == 100


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=12), _JSON, max_size=6))
def test_decode_never_raises(record: dict) -> None:
    decode = kind_get(KIND).decode
    for key in ("sobject", "records", "Account", "attributes"):
        assert isinstance(decode({**record, key: record.get(key, record)}, {}), dict)
    assert isinstance(decode(record, {}), dict)
