"""GoTo Webinar: attendee / registrant exports (title block, Excel-DE re-save) and the
registrant webhook and API record."""

from __future__ import annotations

from typing import Any

from leads.parsing import Limits, parse_csv
from leads.sources import kind_get
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = kind_get("gotowebinar")


def rows(name: str) -> list[dict[str, Any]]:
    return parse_csv(fixture_bytes("gotowebinar", name), max_records=100, limits=Limits())


def test_the_kind_is_registered_as_a_batch_kind() -> None:
    assert KIND.name == "gotowebinar"
    assert KIND.batch is True
    assert KIND.verify is None  # the signing scheme is not documented in what we hold


def test_attendee_report() -> None:
    leads = [lead_from("gotowebinar", r) for r in rows("attendee_report.csv")]
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
        },
        {
            "email": "p.lefevre@atelier-numerique.fr",
            "email_domain": "atelier-numerique.fr",
            "first_name": "Pierre",
            "last_name": "Lefèvre",
            "phone": "+33142685300",
            "company": "Atelier Numérique SAS",
            "domain": "atelier-numerique.fr",
            "title": "CTO",
            "country": "FR",
        },
    ]
    assert leads[0].custom == {
        "Attended": "Yes",
        "Interest Rating": "85",
        "Registration Date": "03/03/2025 04:20 PM CET",
        "Join Time": "03/13/2025 04:01 PM CET",
        "Leave Time": "03/13/2025 05:00 PM CET",
        "Time in Session": "59 minutes",
        "Unsubscribed": "No",
        "Source": "LinkedIn",
    }
    # A no-show: the blank attendance cells are left out, nothing invented.
    assert leads[1].custom == {
        "Attended": "No",
        "Registration Date": "03/05/2025 09:02 AM CET",
        "Unsubscribed": "No",
        "Source": "Newsletter",
    }
    assert all(lead.flags == () for lead in leads)


def test_registrant_export_saved_by_german_excel() -> None:
    """Semicolons, Windows-1252, a German country name and a custom question column."""
    raw = fixture_bytes("gotowebinar", "registrants_export_de.csv")
    assert b";" in raw
    assert "Groß".encode("cp1252") in raw
    leads = [lead_from("gotowebinar", r) for r in rows("registrants_export_de.csv")]
    assert [lead.fields for lead in leads] == [
        {
            "email": "j.gross@maschinenbau-gross.de",
            "email_domain": "maschinenbau-gross.de",
            "first_name": "Jürgen",
            "last_name": "Groß",
            "phone": "+498912345678",
            "company": "Maschinenbau Groß GmbH & Co. KG",
            "domain": "maschinenbau-gross.de",
            "title": "Geschäftsführer",
            "country": "DE",
            "region": "BY",
            "postal_code": "80331",
            "external_id": "8325357307900339983",
        },
        {
            "email": "zoe.baer@brauerei-baer.de",
            "email_domain": "brauerei-baer.de",
            "first_name": "Zoë",
            "last_name": "Ähnlich-Bär",
            "company": "Brauerei Bär AG",
            "domain": "brauerei-baer.de",
            "title": "Einkauf",
            "country": "DE",
            "postal_code": "10115",
            "external_id": "8325357307900339984",
        },
    ]
    assert leads[0].custom == {
        "Registration Date": "03.03.2025 10:05",
        "Welches CRM nutzen Sie?": "SAP",
    }
    # GoTo's "N/A" for a skipped question is no phone.
    assert "phone" not in leads[1].fields
    assert "Phone" not in leads[1].custom


def test_registrant_added_webhook() -> None:
    lead = lead_from("gotowebinar", fixture_record("gotowebinar", "registrant_added.json"))
    assert lead.fields == {
        "email": "jana.mueller@kontor-logistik.de",
        "email_domain": "kontor-logistik.de",
        "first_name": "Jana",
        "last_name": "Müller",
        "domain": "kontor-logistik.de",
        "external_id": "8325357307900339981",
    }
    assert lead.custom["eventName"] == "registrant.added"
    assert lead.custom["webinarKey"] == 5620084814059709442
    assert lead.custom["webinarTitle"] == "Pipeline Automation for RevOps"
    assert lead.custom["source"] == "LinkedIn"
    assert lead.flags == ()


def test_detailed_registrant_with_custom_answers() -> None:
    lead = lead_from("gotowebinar", fixture_record("gotowebinar", "registrant_detailed.json"))
    assert lead.fields == {
        "email": "p.lefevre@atelier-numerique.fr",
        "email_domain": "atelier-numerique.fr",
        "first_name": "Pierre",
        "last_name": "Lefèvre",
        "phone": "+33142685300",
        "company": "Atelier Numérique SAS",
        "domain": "atelier-numerique.fr",
        "title": "CTO",
        "country": "FR",
        "city": "Paris",
        "postal_code": "75002",
        "employees": 51,
        "industry": "Software",
        "external_id": "8325357307900339982",
    }
    assert lead.custom["Which CRM do you use?"] == "Pipedrive"
    assert lead.custom["Topics of interest"] == "Routing; Enrichment"
    assert lead.custom["questionsAndComments"] == "Do you integrate with Pipedrive?"
    assert lead.custom["unsubscribed"] is False
    assert "state" not in lead.custom  # blank: nothing to keep
    assert lead.flags == ()


def test_odd_values_never_break_the_decoder() -> None:
    flat = KIND.decode({"registrantKey": None, "responses": "x", "firstName": ["A", "B"]}, {})
    assert flat == {"first_name": "A; B"}
