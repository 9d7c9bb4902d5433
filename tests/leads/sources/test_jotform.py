"""The Jotform kind: the webhook's form fields with ``rawRequest``, labels from ``pretty``,
name / phone / address answers by their parts."""

from __future__ import annotations

from leads.sources import flatten, record_is_lead
from tests.leads.sources.kindtest import fixture_record, lead_from

KIND = "jotform"


def test_captured_webhook_body() -> None:
    record = fixture_record(KIND, "tutor_appointment.form")
    lead = lead_from(KIND, record)
    assert lead.fields == {
        "first_name": "Niloth",
        "last_name": "P",
        "external_id": "6084250982513018472",
    }
    # Labels from ``pretty``; uploads as their stored links; empty answers dropped.
    assert lead.custom["Type of Tutoring"] == "Online Tutoring"
    assert lead.custom["Prior Tutoring?"] == "No"
    assert lead.custom["Reports"] == (
        "https://www.jotform.com/uploads/UserNiloth/243231271343446/6111139644845227685/"
        "Report%20Card.pdf"
    )
    assert "description" not in lead.custom
    assert "date" not in lead.custom
    assert lead.custom["jotform_form_title"] == "Tutor Appointment Form"
    assert lead.custom["ip_address"] == "27.51.18.17"
    assert lead.flags == ()
    # A name without an e-mail, a phone or a company is no lead.
    assert not record_is_lead(flatten(record, kind=KIND), None)


def test_b2b_contact_form() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "contact_b2b.form"))
    assert lead.fields == {
        "email": "felix.brandt@nordlicht-software.de",
        "email_domain": "nordlicht-software.de",
        "first_name": "Felix",
        "last_name": "Brandt",
        "phone": "+49401234560",
        "company": "Nordlicht Software GmbH",
        "domain": "nordlicht-software.de",
        "title": "VP Marketing",
        "country": "DE",
        "region": "HH",
        "city": "Hamburg",
        "postal_code": "22767",
        "employees": 201,
        "external_id": "6215987654321098765",
    }
    assert lead.custom["street"] == "Große Elbstraße 145"
    assert lead.custom["street 2"] == "3. OG"
    assert lead.custom["Which products interest you?"] == "Lead routing; Round robin"
    assert lead.custom["Message"] == "Please call me after 2 pm."
    assert lead.flags == ()


def test_area_code_phone_and_labels_the_names_do_not_say() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "area_phone_fr.form"))
    assert lead.fields == {
        "email": "f.lefevre@atelier-rhone.fr",
        "email_domain": "atelier-rhone.fr",
        "first_name": "François",
        "last_name": "Lefèvre",
        "phone": "+33472103030",
        "company": "Atelier Rhône SAS",
        "domain": "atelier-rhone.fr",
        "country": "FR",
        "external_id": "6226123456789012345",
    }
    # ``q7_datePreferee`` matched to its label; a ":" and ", " inside a value kept whole.
    assert lead.custom["Date préférée"] == "2026-05-12"
    assert lead.custom["Votre message"] == "Objet: devis, 3 sites"
    assert lead.flags == ()


def test_someone_elses_name_is_not_the_lead() -> None:
    record = fixture_record(KIND, "contact_b2b.form")
    record["rawRequest"] = record["rawRequest"].replace(
        '"q4_email"', '"q2_referrersName":{"first":"Ida","last":"Roth"},"q4_email"'
    )
    record["pretty"] = "Referrer's name:Ida Roth, " + record["pretty"]
    lead = lead_from(KIND, record)
    assert (lead.fields["first_name"], lead.fields["last_name"]) == ("Felix", "Brandt")
    assert lead.custom["Referrer's name (first)"] == "Ida"
