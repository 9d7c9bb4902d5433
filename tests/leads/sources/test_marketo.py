"""The Marketo kind: the recommended webhook template (JSON and Form/Url), REST field names and
token display names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from leads.sources import kind_get
from tests.leads.sources.kindtest import fixture_record, lead_from

KIND = "marketo"


def test_recommended_template_json() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "recommended_template.json"))
    assert lead.fields == {
        "email": "stefan.keller@alpenwerk-systems.ch",
        "email_domain": "alpenwerk-systems.ch",
        "first_name": "Stefan",
        "last_name": "Keller",
        "phone": "+41446681800",
        "company": "Alpenwerk Systems AG",
        "domain": "alpenwerk-systems.ch",
        "title": "CTO",
        "country": "CH",
        "region": "ZH",
        "city": "Zürich",
        "postal_code": "8005",
        "industry": "Software",
        "website": "alpenwerk-systems.ch",
        "external_id": "1048213:2026-03-04 09:21:44",
    }
    assert lead.custom["marketo_lead_id"] == 1048213
    assert lead.custom["leadSource"] == "Website"
    assert lead.custom["campaign"] == "Demo Request - Trigger"
    assert lead.custom["program"] == "2026 Q1 Demo Program"
    assert lead.flags == ()


def test_recommended_template_form_encoded_with_marketos_quotes() -> None:
    record = fixture_record(KIND, "recommended_template.form")
    assert record["company"] == '"Bresse Agro & Fils"'  # as Marketo sends it
    lead = lead_from(KIND, record)
    assert lead.fields == {
        "email": "claire.martin@bresse-agro.fr",
        "email_domain": "bresse-agro.fr",
        "first_name": "Claire",
        "last_name": "Martin",
        "phone": "+33385214410",
        "company": "Bresse Agro & Fils",
        "domain": "bresse-agro.fr",
        "title": "Directrice commerciale",
        "country": "FR",
        "city": "Bourg-en-Bresse",
        "postal_code": "01000",
        "industry": "Agriculture",
        "external_id": "1048377:2026-03-05 14:02:10",
    }
    assert lead.custom["campaign"] == "SIA 2026 follow-up"
    assert lead.custom["marketo_lead_id"] == "1048377"
    assert lead.flags == ()


def test_rest_field_names() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "rest_field_names.json"))
    assert lead.fields == {
        "email": "anna.schmidt@rheinfracht.de",
        "email_domain": "rheinfracht.de",
        "first_name": "Anna",
        "last_name": "Schmidt",
        "phone": "+4922198765430",
        "company": "Rheinfracht GmbH & Co. KG",
        "domain": "rheinfracht.de",
        "title": "Logistikleiterin",
        "country": "DE",  # "Deutschland"
        "region": "NW",
        "city": "Köln",
        "postal_code": "50667",
        "employees": 180,
        "annual_revenue": 45000000,
        "lead_score": 62,
        "external_id": "318812:2026-03-02T16:45:09Z",
    }
    assert lead.custom["mobilePhone"] == "+49 171 2345678"
    assert lead.custom["leadStatus"] == "MQL"
    assert lead.custom["unsubscribed"] is False
    assert lead.flags == ()


def test_display_names_nested_and_an_unrendered_token() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "display_names_nested.json"))
    assert lead.fields == {
        "email": "raj.patel@indigo-textiles.in",
        "email_domain": "indigo-textiles.in",
        "first_name": "Raj",
        "last_name": "Patel",
        "phone": "+912267890123",
        "company": "Indigo Textiles Pvt. Ltd.",
        "domain": "indigo-textiles.in",
        "title": "Head of Procurement",
        "country": "IN",
        "employees": 1000,
        "industry": "Textiles",
        "lead_score": 48,
        "external_id": "902771",
    }
    assert lead.custom["Preferred Language"] is None  # "{{lead.Preferred Language}}", unfilled
    assert lead.custom["trigger"] == "Fills Out Form: Contact Sales"
    assert lead.flags == ()


def test_token_names_as_keys() -> None:
    lead = lead_from(
        KIND,
        {"lead.Email Address": "li.wei@jade-robotics.cn", "company.Company Name": "Jade Robotics"},
    )
    assert lead.fields["email"] == "li.wei@jade-robotics.cn"
    assert lead.fields["company"] == "Jade Robotics"
    assert "external_id" not in lead.fields


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
    for key in ("lead", "company", "leadId"):
        assert isinstance(decode({**record, key: record.get(key, record)}, {}), dict)
    assert isinstance(decode(record, {}), dict)
