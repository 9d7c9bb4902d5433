"""The Account Engagement (Pardot) kind: form handler posts (external field names and prospect
field labels) and the prospect record of API v5 and v3/v4."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from leads.sources import kind_get
from tests.leads.sources.kindtest import fixture_record, lead_from

KIND = "pardot"


def test_form_handler_external_field_names() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "form_handler.form"))
    assert lead.fields == {
        "email": "lukas.huber@donau-energie.at",
        "email_domain": "donau-energie.at",
        "first_name": "Lukas",
        "last_name": "Huber",
        "phone": "+4314028810",
        "company": "Donau Energie GmbH",
        "domain": "donau-energie.at",
        "title": "Geschäftsführer",
        "country": "AT",  # "Österreich"
        "region": "9",  # ISO 3166-2 AT-9, Wien
        "city": "Wien",
        "postal_code": "1010",
        "employees": 120,
        "utm_source": "google",
        "utm_medium": "cpc",
        "utm_campaign": "at-brand",
    }
    assert lead.custom["interests"] == "Lead Routing; CRM Sync"  # a repeated checkbox field
    assert lead.custom["comments"] == "Bitte um Rückruf am Vormittag."
    assert lead.custom["opted_in"] == "true"
    assert lead.flags == ()


def test_form_handler_prospect_field_labels() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "form_handler_labels.form"))
    assert lead.fields == {
        "email": "carmen.lopez@valencia-ceramica.es",
        "email_domain": "valencia-ceramica.es",
        "first_name": "Carmen",
        "last_name": "López Ruiz",
        "phone": "+34963123456",
        "company": "Cerámica Valencia S.A.",
        "domain": "valencia-ceramica.es",
        "title": "Jefa de Compras",
        "country": "ES",  # "España"
        "annual_revenue": 12500000,
        "industry": "Manufacturing",
    }
    assert lead.custom["How did you hear about us?"] == "Feria"
    assert lead.custom["website"] == ""
    assert lead.flags == ()


def test_prospect_v5() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "prospect_v5.json"))
    assert lead.fields == {
        "email": "pieter.devries@polderdata.nl",
        "email_domain": "polderdata.nl",
        "first_name": "Pieter",
        "last_name": "de Vries",
        "phone": "+31207946120",
        "company": "PolderData B.V.",
        "domain": "polderdata.nl",
        "title": "Head of Sales Operations",
        "country": "NL",
        "city": "Amsterdam",
        "postal_code": "1017 CE",
        "employees": 51,
        "annual_revenue": 15000000,
        "industry": "Information Technology",
        "lead_score": 145,
        "website": "https://polderdata.nl",
        "external_id": "5123987:2026-02-27T15:03:21-05:00",
    }
    assert lead.custom["pardot_prospect_id"] == 5123987
    assert lead.custom["grade"] == "B+"
    assert lead.custom["salesforceLeadId"] == "00Q5e00000AbCdHEAV"
    assert lead.flags == ()


def test_prospect_v4_wrapped_with_campaign_and_assigned_user() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "prospect_v4.json"))
    assert lead.fields == {
        "email": "oliver.bennett@thamesworks.co.uk",
        "email_domain": "thamesworks.co.uk",
        "first_name": "Oliver",
        "last_name": "Bennett",
        "phone": "+442079460321",
        "company": "Thames Works Ltd",
        "domain": "thamesworks.co.uk",
        "title": "Operations Director",
        "country": "GB",
        "city": "London",
        "postal_code": "N1 7GR",
        "employees": 75,
        "annual_revenue": 5000000,
        "industry": "Engineering",
        "lead_score": 42,
        "website": "www.thamesworks.co.uk",
        "external_id": "4471203:2026-02-12 08:47:30",
    }
    assert lead.custom["campaign"] == "UK Events 2026"
    assert lead.custom["crm_lead_fid"] == "00Q5e00000AbCdIEAV"
    assert lead.custom["address_one"] == "12 Wharf Road"
    # The assigned user is not the lead: kept whole.
    assert lead.custom["assigned_to"]["user"]["email"] == "sarah.reed@acme-saas.example"
    assert lead.flags == ()


def test_salesforce_connected_pi_fields() -> None:
    lead = lead_from(
        KIND,
        {
            "Email": "m.novak@vltava-soft.cz",
            "Company": "Vltava Soft s.r.o.",
            "pi__score__c": "73",
            "pi__utm_campaign__c": "cz-launch",
        },
    )
    assert lead.fields["lead_score"] == 73
    assert lead.fields["utm_campaign"] == "cz-launch"


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
    for key in ("prospect", "values", "campaign"):
        assert isinstance(decode({**record, key: record.get(key, record)}, {}), dict)
    assert isinstance(decode(record, {}), dict)
