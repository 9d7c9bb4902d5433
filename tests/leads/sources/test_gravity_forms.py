"""The Gravity Forms kind: entries by field id (with and without the ``fields`` option) and by
label."""

from __future__ import annotations

import pytest

from leads.sources import kind_get
from tests.leads.sources.kindtest import fixture_record, lead_from

KIND = "gravity_forms"
FIELDS = {"4": "company", "8": "employees", "6": "Interests", "7": "Products", "9": "Start"}


def test_rest_api_sample_entry() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "entry_rest_api_sample.json"))
    assert lead.fields == {"first_name": "Jane", "last_name": "Doe", "external_id": "2"}
    # Checkbox field 4 (choices 1 and 3 ticked) is one answer, not an address.
    assert lead.custom["4"] == "Bagel; Danish"
    assert lead.custom["3"] == "Tea"
    assert lead.custom["form_id"] == "1"
    assert lead.custom["source_url"] == "https://wordpress.test/?gf_page=preview&id=1"
    assert not any(key.startswith(("1.", "2.", "4.")) for key in lead.custom)
    assert lead.flags == ()


def test_b2b_entry_without_options() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "entry_b2b.json"))
    assert lead.fields == {
        "email": "j.weiss@hafenlogistik-nord.de",
        "email_domain": "hafenlogistik-nord.de",
        "first_name": "Jürgen",
        "last_name": "Weiß",
        "phone": "+494030987710",
        "domain": "hafenlogistik-nord.de",
        "country": "DE",
        "region": "HH",
        "city": "Hamburg",
        "postal_code": "20457",
        "external_id": "1187",
    }
    assert lead.custom["4"] == "Hafenlogistik Nord GmbH"  # a text field: only the option names it
    assert lead.custom["6"] == "CRM; Marketing automation"
    assert lead.custom["7"] == "Demo; Pricing"  # a Multi Select's JSON array
    assert lead.custom["9"] == "2026-04-15"  # a date is no phone
    assert lead.custom["street"] == "Am Sandtorkai 50"
    assert lead.flags == ()


def test_b2b_entry_with_fields_option() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "entry_b2b.json"), {"fields": FIELDS})
    assert lead.fields == {
        "email": "j.weiss@hafenlogistik-nord.de",
        "email_domain": "hafenlogistik-nord.de",
        "first_name": "Jürgen",
        "last_name": "Weiß",
        "phone": "+494030987710",
        "company": "Hafenlogistik Nord GmbH",
        "domain": "hafenlogistik-nord.de",
        "country": "DE",
        "region": "HH",
        "city": "Hamburg",
        "postal_code": "20457",
        "employees": 250,
        "external_id": "1187",
    }
    assert lead.custom["Interests"] == "CRM; Marketing automation"
    assert lead.custom["Products"] == "Demo; Pricing"
    assert lead.custom["Start"] == "2026-04-15"


def test_fields_option_as_json_text_and_for_inputs() -> None:
    options = {"fields": '{"1.3": "first_name", "1.6": "last_name", "1": "full_name"}'}
    record = {"id": "9", "1.3": "Ana", "1.6": "Ruiz", "2": "ana@example.es", "5": "Acme"}
    flat = kind_get(KIND).decode(record, options)
    assert flat == {
        "first_name": "Ana",
        "last_name": "Ruiz",
        "email": "ana@example.es",
        "5": "Acme",
        "external_id": "9",
    }
    bad = kind_get(KIND).decode(record, {"fields": "{not json"})
    assert bad["first_name"] == "Ana"  # the Name inputs are still recognised


def test_label_keyed_entry() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "entry_labels.json"))
    assert lead.fields == {
        "email": "ana.garcia@distribuciones-iberia.es",
        "email_domain": "distribuciones-iberia.es",
        "first_name": "Ana",
        "last_name": "García Ruiz",
        "phone": "+34911234567",
        "company": "Distribuciones Iberia S.L.",
        "domain": "distribuciones-iberia.es",
        "country": "ES",
        "city": "Madrid",
        "postal_code": "28013",
        "external_id": "4410",
    }
    assert lead.custom["How did you hear about us?"] == "LinkedIn"
    assert "Number of sales reps" not in lead.custom  # blank


def test_option_is_declared() -> None:
    assert "fields" in kind_get(KIND).options


def test_a_second_fields_country_beside_a_name_field_is_the_address_country() -> None:
    """Review of issue 16, S3: an Address field sent with only its country (.6) is no last name."""
    lead = lead_from(KIND, {"1.3": "Ana", "1.6": "Müller", "2": "ana@acme.de", "5.6": "Germany"})
    assert lead.fields["last_name"] == "Müller"
    assert lead.fields["country"] == "DE"
    assert not any(key.startswith("last_name") for key in lead.custom)


def test_an_address_state_and_country_beside_a_name_field() -> None:
    lead = lead_from(KIND, {"1.3": "Ana", "1.6": "Müller", "5.4": "Bayern", "5.6": "Deutschland"})
    assert (lead.fields["last_name"], lead.fields["country"]) == ("Müller", "DE")
    assert lead.fields["region"] == "BY"


@pytest.mark.parametrize("last_name", ["Jordan", "Georgia", "Chad"])
def test_a_last_name_that_is_also_a_country_stays_the_last_name(last_name: str) -> None:
    lead = lead_from(KIND, {"1.3": "Michael", "1.6": last_name, "2": "m@acme.com", "5.6": "US"})
    assert (lead.fields["first_name"], lead.fields["last_name"]) == ("Michael", last_name)
    assert lead.fields["country"] == "US"
    # and with the address field first in the entry
    lead = lead_from(KIND, {"5.6": "Germany", "1.3": "Michael", "1.6": last_name})
    assert (lead.fields["last_name"], lead.fields["country"]) == (last_name, "DE")


def test_a_lone_last_name_input_without_another_name_field_is_still_the_last_name() -> None:
    lead = lead_from(KIND, {"1.6": "Jordan", "2": "m@acme.com"})
    assert lead.fields["last_name"] == "Jordan"
    assert "country" not in lead.fields
