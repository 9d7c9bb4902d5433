"""Issue 16 "How it will be checked", second half: the vendors' payloads posted to *generic*
sources whose field maps name paths (as RevOps would write them for a tool without a kind):
accepted, the person's e-mail, name, company, country (ISO) and phone (E.164) recovered by the
paths, the rest kept in custom; never a 5xx. The field maps are saved through the admin's own
validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.sites import site
from django.test import RequestFactory

from leads.models import Lead, Source
from leads.services import lead_apply_normalization
from tests.leads.conftest import auth
from tests.leads.factories import SourceFactory
from tests.leads.sources.kindtest import SOURCES_DIR

pytestmark = pytest.mark.django_db

_TYPES = {".json": "application/json", ".form": "application/x-www-form-urlencoded"}

# (kind folder, fixture, field map with paths, what the lead must read)
CASES: list[tuple[str, str, dict[str, str], dict[str, Any]]] = [
    (
        "hubspot",
        "workflow_contact_v1.json",
        {
            "properties.email.value": "email",
            "properties.firstname.value": "first_name",
            "properties.lastname.value": "last_name",
            "properties.company.value": "company",
            "properties.country.value": "country",
            "properties.phone.value": "phone",
        },
        {
            "email": "j.mueller@bergmann-maschinenbau.de",
            "first_name": "Jürgen",
            "last_name": "Müller",
            "company": "Bergmann Maschinenbau GmbH",
            "country": "DE",
            "phone": "+498921804711",
        },
    ),
    (
        "typeform",
        "b2b_lead.json",
        {
            "form_response.answers[field.ref=work_email].email": "email",
            "form_response.answers[field.ref=first_name].text": "first_name",
            "form_response.answers[field.ref=phone].phone_number": "phone",
            "form_response.answers[field.id=kL7mN9pQ1rS3].text": "company",
            "form_response.answers[field.id=kL1mN3pQ5rS7].text": "country",
        },
        {
            "email": "jonas.becker@kranwerk-logistik.de",
            "first_name": "Jonas",
            "company": "Kranwerk Logistik GmbH",
            "country": "DE",
            "phone": "+49301234567",
        },
    ),
    (
        "google_ads",
        "lead_b2b.json",
        {
            "user_column_data[column_id=WORK_EMAIL].string_value": "email",
            "user_column_data[column_id=FIRST_NAME].string_value": "first_name",
            "user_column_data[column_id=LAST_NAME].string_value": "last_name",
            "user_column_data[column_id=COMPANY_NAME].string_value": "company",
            "user_column_data[column_id=WORK_PHONE].string_value": "phone",
            "user_column_data[column_id=COUNTRY].string_value": "country",
        },
        {
            "email": "e.dubois@lumiere-batiment.fr",
            "first_name": "Émilie",
            "last_name": "Dubois-Lefèvre",
            "company": "Lumière Bâtiment SA",
            "country": "FR",
            "phone": "+33142685300",
        },
    ),
    (
        "tally",
        "lead_generation.json",
        {
            "data.fields[label=Email Address].value": "email",
            "data.fields[label=Full Name].value": "name",
            "data.fields[label=Phone Number].value": "phone",
        },
        {
            "email": "lukas.hartmann@elbwerk-it.de",
            "first_name": "Lukas",
            "last_name": "Hartmann",
            "phone": "+49403344556",
        },
    ),
    (
        "calendly",
        "invitee_created.json",
        {
            "payload.email": "email",
            "payload.name": "name",
            "payload.questions_and_answers[question=Company].answer": "company",
            "payload.questions_and_answers[question=Phone number].answer": "phone",
            "payload.questions_and_answers[question=Country].answer": "country",
        },
        {
            "email": "maximilian.hartmann@vektor-automation.de",
            "last_name": "Hartmann",
            "company": "Vektor Automation GmbH",
            "country": "DE",
            "phone": "+49711987654",
        },
    ),
    (
        "segment",
        "identify_b2b.json",
        {
            "traits.email": "email",
            "traits.firstName": "first_name",
            "traits.lastName": "last_name",
            "traits.company.name": "company",
            "traits.phone": "phone",
            "traits.address.country": "country",
        },
        {
            "email": "k.vogel@brennwerk-energie.de",
            "company": "Brennwerk Energie GmbH",
            "country": "DE",
            "phone": "+498920195500",
        },
    ),
    (
        "intercom",
        "contact_lead_created.json",
        {
            "data.item.email": "email",
            "data.item.name": "name",
            "data.item.phone": "phone",
            "data.item.location.country": "country",
        },
        {
            "email": "jana.schroeder@nordwind-logistik.de",
            "first_name": "Jana",
            "country": "DE",
            "phone": "+49301234567",
        },
    ),
    (
        "meta_lead_ads",
        "lead_b2b.json",
        {
            "field_data[name=work_email].values.0": "email",
            "field_data[name=first_name].values.0": "first_name",
            "field_data[name=last_name].values.0": "last_name",
            "field_data[name=company_name].values.0": "company",
            "field_data[name=work_phone_number].values.0": "phone",
            "field_data[name=country].values.0": "country",
        },
        {
            "email": "j.muessig@brandt-spedition.de",
            "last_name": "Müßig",
            "company": "Brandt Spedition GmbH",
            "country": "DE",
            "phone": "+49301234567",
        },
    ),
    (
        "linkedin",
        "form_response.json",
        {
            "formResponse.answers[questionId=3].answerDetails.textQuestionAnswer.answer": "email",
            "formResponse.answers[questionId=1].answerDetails.textQuestionAnswer.answer": (
                "first_name"
            ),
            "formResponse.answers[questionId=4].answerDetails.textQuestionAnswer.answer": (
                "company"
            ),
        },
        {
            "email": "anna.schroeder@kraftwerk-systems.de",
            "first_name": "Anna",
            "company": "Kraftwerk Systems AG",
        },
    ),
    (
        "unbounce",
        "lead_b2b.form",
        {
            "data.json.email.0": "email",
            "data.json.first_name.0": "first_name",
            "data.json.company_name.0": "company",
            "data.json.phone_number.0": "phone",
            "data.json.country.0": "country",
        },
        {
            "email": "m.schaefer@weserbahn-logistik.de",
            "first_name": "Miriam",
            "company": "Weserbahn Logistik GmbH",
            "country": "DE",
            "phone": "+494219876543",
        },
    ),
    (
        "jotform",
        "contact_b2b.form",
        {
            "rawRequest.q4_email": "email",
            "rawRequest.q3_name.first": "first_name",
            "rawRequest.q3_name.last": "last_name",
            "rawRequest.q5_phoneNumber.full": "phone",
        },
        {
            "email": "felix.brandt@nordlicht-software.de",
            "first_name": "Felix",
            "last_name": "Brandt",
            "phone": "+49401234560",
        },
    ),
    (
        "mailchimp",
        "subscribe_b2b.form",
        {
            "data[merges][EMAIL]": "email",
            "data[merges][FNAME]": "first_name",
            "data[merges][LNAME]": "last_name",
            "data[merges][COMPANY]": "company",
            "data[merges][PHONE]": "phone",
        },
        {
            "email": "thomas.wagner@stahlbau-wagner.de",
            "first_name": "Thomas",
            "last_name": "Wagner",
            "company": "Stahlbau Wagner GmbH",
            "phone": "+49711987654",
        },
    ),
]


def _saved_through_the_admin(source: Source, field_map: dict[str, str]) -> None:
    """The field map as RevOps saves it: the source admin's form validates every path."""
    admin = site._registry[Source]
    request = RequestFactory().get("/")
    form_class = admin.get_form(request, source, change=True)
    initial = admin.get_changeform_initial_data(request)
    form = form_class(instance=source, initial=initial)
    data = {name: form[name].value() for name in form.fields}
    data = {k: ("" if v is None else v) for k, v in data.items()}

    data["field_map"] = json.dumps(field_map)
    bound = form_class(data=data, instance=source)
    assert bound.is_valid(), bound.errors
    bound.save()


@pytest.mark.parametrize(
    ("kind", "fixture", "field_map", "expected"),
    CASES,
    ids=[f"{kind}/{fixture}" for kind, fixture, _, _ in CASES],
)
def test_a_generic_source_with_paths_reads_the_vendors_payload(
    client, published, kind: str, fixture: str, field_map: dict[str, str], expected: dict
):
    slug = f"g-{kind}".replace("_", "-")
    source = SourceFactory(slug=slug, kind="generic")
    _saved_through_the_admin(source, field_map)
    source.refresh_from_db()
    assert source.field_map == field_map
    path: Path = SOURCES_DIR / kind / "fixtures" / fixture
    response = client.post(
        f"/api/v1/intake/{slug}/",
        data=path.read_bytes(),
        content_type=_TYPES[path.suffix],
        **auth(slug),
    )
    assert response.status_code == 202, response.content
    lead = Lead.objects.select_related("source").get(source=source)
    lead_apply_normalization(lead=lead)
    got = {name: getattr(lead, name) for name in expected}
    assert got == expected
    assert lead.custom  # what no path names is kept
    assert "decoder_failed" not in lead.flags
    # The paths read the person, not the look below the top level (which, for half of these
    # payloads, finds the same values with no field map at all: without this the test passed
    # with every path resolving to nothing).
    assert "found_below_top_level" not in lead.flags
