"""The Unbounce kind: the form post with ``data.json`` (field → list of values)."""

from __future__ import annotations

import json

from tests.leads.sources.kindtest import fixture_record, lead_from

KIND = "unbounce"


def test_webhook_sample_body() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "webhook_sample.form"))
    assert lead.fields == {}
    # Nothing is lost: the answer and what Unbounce adds, unwrapped from their lists.
    assert lead.custom == {
        "userfield1": "asdfasdfad",
        "ip_address": "85.73.39.163",
        "page_uuid": "7648177d-7323-4330-b4f9-9951a52138b6",
        "variant": "a",
        "time_submitted": "12:12 PM UTC",
        "date_submitted": "2017-11-15",
        "page_url": "http://unbouncepages.com/wayfaring-147/",
        "page_name": "Wayfaring",
        "unbounce_page_id": "7648177d-7323-4330-b4f9-9951a52138b6",
    }
    assert lead.flags == ()


def test_b2b_lead() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "lead_b2b.form"))
    assert lead.fields == {
        "email": "m.schaefer@weserbahn-logistik.de",
        "email_domain": "weserbahn-logistik.de",
        "first_name": "Miriam",
        "last_name": "Schäfer",
        "phone": "+494219876543",
        "company": "Weserbahn Logistik GmbH",
        "domain": "weserbahn-logistik.de",
        "title": "Leiterin Vertrieb",
        "country": "DE",
        "employees": 51,
        "utm_source": "google",
        "utm_medium": "cpc",
        "utm_campaign": "logistik-demo-2026",
    }
    assert lead.custom["interested_in"] == "Lead routing; CRM sync"  # checkboxes
    assert lead.custom["what_is_your_monthly_lead_volume"] == "2,500"
    assert lead.custom["page_name"] == "Demo Logistik"
    assert "data.xml" not in lead.custom  # the same answers again, as XML
    assert lead.flags == ()


def test_name_field_and_question_named_field() -> None:
    # "Danmark" is read by the localised country names (leads.normalize).
    lead = lead_from(KIND, fixture_record(KIND, "name_only_dk.form"))
    assert lead.fields == {
        "email": "soren@kobenhavn-data.dk",
        "email_domain": "kobenhavn-data.dk",
        "first_name": "Søren",
        "last_name": "Kierkegård",
        "phone": "+4533123456",
        "company": "København Data ApS",
        "domain": "kobenhavn-data.dk",
        "country": "DK",
    }
    assert "message" not in lead.custom  # [""] is no answer
    assert lead.flags == ()


def test_data_json_renamed_by_a_php_relay() -> None:
    record = fixture_record(KIND, "lead_b2b.form")
    record["data_json"] = record.pop("data.json")
    del record["data.xml"]
    assert lead_from(KIND, record).fields["email"] == "m.schaefer@weserbahn-logistik.de"


def test_without_data_json_the_form_fields_are_read() -> None:
    answers = json.loads(fixture_record(KIND, "lead_b2b.form")["data.json"])
    record = {"page_id": "p1", **{k: v[0] for k, v in answers.items()}}
    lead = lead_from(KIND, record)
    assert lead.fields["company"] == "Weserbahn Logistik GmbH"
    assert lead.custom["unbounce_page_id"] == "p1"
