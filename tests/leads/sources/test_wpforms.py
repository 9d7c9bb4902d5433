"""The WPForms kind: the entry's fields object and the Webhooks addon's mapped bodies."""

from __future__ import annotations

from leads.sources import kind_get
from tests.leads.sources.kindtest import fixture_record, lead_from

KIND = "wpforms"


def test_entry_fields_by_type() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "entry_fields.json"))
    assert lead.fields == {
        "email": "elodie.lefevre@cabinet-lefevre.fr",
        "email_domain": "cabinet-lefevre.fr",
        "first_name": "Élodie",
        "last_name": "Lefèvre",
        "phone": "+33478421690",
        "company": "Cabinet Lefèvre & Associés",
        "domain": "cabinet-lefevre.fr",
        "country": "FR",
        "city": "Lyon",
        "postal_code": "69002",
        "employees": 11,
        "website": "https://www.cabinet-lefevre.fr",
        "external_id": "318",
    }
    assert lead.custom["Which products interest you?"] == "Routing; Reporting"
    assert lead.custom["Message"] == "Nous souhaitons une démo la semaine prochaine."
    assert lead.custom["street"] == "12 Rue de la République"
    assert lead.custom["form_id"] == 42
    assert lead.flags == ()


def test_mapped_json_body() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "mapped_body.json"))
    assert lead.fields == {
        "email": "emma.lindqvist@nordkraft.se",
        "email_domain": "nordkraft.se",
        "first_name": "Emma",
        "last_name": "Lindqvist",
        "phone": "+46841021000",
        "company": "Nordkraft Energi AB",
        "domain": "nordkraft.se",
        "title": "Head of Partnerships",
        "country": "SE",
        "external_id": "519",
    }
    assert lead.custom["consent"] == "I agree to be contacted"
    assert lead.custom["form_name"] == "Partner enquiry"


def test_mapped_form_body() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "mapped_body.form"))
    assert lead.fields == {
        "email": "p.devries@havenbedrijf-noord.nl",
        "email_domain": "havenbedrijf-noord.nl",
        "first_name": "Pieter",
        "last_name": "de Vries",
        "phone": "+31207940600",
        "company": "Havenbedrijf Noord B.V.",
        "domain": "havenbedrijf-noord.nl",
        "country": "NL",
        "employees": 201,
        "external_id": "77",
    }
    assert lead.custom == {"Topics": "Routing; SLA alerts"}


def test_simple_name_and_second_email_field() -> None:
    fields = [
        {"id": 1, "type": "name", "name": "Name", "value": "Jan Novák"},
        {"id": 2, "type": "email", "name": "Email", "value": "jan@firma.cz"},
        {"id": 3, "type": "email", "name": "Manager email", "value": "boss@firma.cz"},
    ]
    flat = kind_get(KIND).decode({"fields": fields}, {})
    assert flat == {
        "full_name": "Jan Novák",
        "email": "jan@firma.cz",
        "Manager email": "boss@firma.cz",
    }
