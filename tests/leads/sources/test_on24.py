"""ON24: the registration report export (title block, non-ASCII names, quoted numbers) and the
API registrant record."""

from __future__ import annotations

from typing import Any

from leads.parsing import Limits, parse_csv
from leads.sources import kind_get
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = kind_get("on24")


def rows(name: str) -> list[dict[str, Any]]:
    return parse_csv(fixture_bytes("on24", name), max_records=100, limits=Limits())


def test_the_kind_is_registered_as_a_batch_kind() -> None:
    assert KIND.name == "on24"
    assert KIND.batch is True


def test_registration_report() -> None:
    leads = [lead_from("on24", r) for r in rows("registration_report.csv")]
    assert [lead.fields for lead in leads] == [
        {
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
            "utm_source": "linkedin",
        },
        {
            "email": "kenji.sato@sato-seiki.co.jp",
            "email_domain": "sato-seiki.co.jp",
            "first_name": "Kenji",
            "last_name": "佐藤",
            "phone": "+81312345678",
            "company": "佐藤精機株式会社",
            "domain": "sato-seiki.co.jp",
            "title": "Sales Manager",
            "country": "JP",
            "city": "Tokyo",
            "postal_code": "100-0005",
            "employees": 1001,
            "industry": "Manufacturing",
            "utm_source": "newsletter",
        },
        {
            "email": "amy.chen@northwind.example.com",
            "email_domain": "northwind.example.com",
            "first_name": "Amy",
            "last_name": "Chen",
            "phone": "+12065550142",
            "company": "Northwind Traders",
            "domain": "northwind.example.com",
            "title": "VP Revenue Operations",
            "country": "US",
            "region": "WA",
            "city": "Seattle",
            "postal_code": "98101",
            "employees": 5001,
            "industry": "Retail",
        },
    ]
    assert leads[0].custom == {
        "Registration Date": "03/03/2025 10:20 AM ET",
        "Attended": "Yes",
        "Live Minutes": "58",
        "Archive Minutes": "0",
        "Engagement Score": "7.4",
        "Which CRM do you use?": "Salesforce",
    }
    assert leads[1].custom["Archive Minutes"] == "12"
    assert all(lead.flags == () for lead in leads)


def test_api_registrant() -> None:
    lead = lead_from("on24", fixture_record("on24", "registrant.json"))
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
        "utm_source": "linkedin",
        "external_id": "327616781",
    }
    assert lead.custom == {
        "address_street1": "Friedrichstraße 68",
        "createtimestamp": "2025-03-03T10:20:44-05:00",
        "engagementscore": 7.4,
        "Which CRM do you use?": "Salesforce",
    }
    assert lead.flags == ()


def test_odd_values_never_break_the_decoder() -> None:
    flat = KIND.decode({"userquestions": {"a": 1}, "email": [{"x": 1}], "zip": "--"}, {})
    assert flat == {"email (as sent)": [{"x": 1}]}
