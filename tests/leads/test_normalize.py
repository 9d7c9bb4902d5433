"""leads.normalize: pure functions, no database and no Django needed."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leads.normalize import (
    CANONICAL_FIELDS,
    FULL_NAME,
    NormalizedLead,
    _mapping_resolver,
    canonical_key,
    email_domain,
    is_a_lead,
    is_disposable_domain,
    is_free_email_domain,
    map_fields,
    normalize,
    normalize_country,
    normalize_domain,
    normalize_email,
    normalize_employees,
    normalize_number,
    normalize_phone,
    normalize_postal_code,
    normalize_region,
    normalize_text,
)

# --- aliases and mapping ----------------------------------------------------------------------


def test_canonical_fields_are_the_product_list_plus_the_input_only_fields():
    assert CANONICAL_FIELDS == (
        "email",
        "email_domain",
        "first_name",
        "last_name",
        "phone",
        "company",
        "domain",
        "title",
        "country",
        "region",
        "city",
        "postal_code",
        "employees",
        "annual_revenue",
        "industry",
        "lead_score",
        "utm_source",
        "utm_medium",
        "utm_campaign",
        "website",
        "external_id",
    )


@pytest.mark.parametrize("field", [*CANONICAL_FIELDS, FULL_NAME])
def test_every_canonical_name_maps_to_itself(field):
    assert canonical_key(field) == field
    assert canonical_key(field.upper()) == field


@pytest.mark.parametrize(
    ("raw_key", "expected"),
    [
        ("Email Address", "email"),
        ("work_email", "email"),
        ("e-mail", "email"),
        ("E-Mail", "email"),
        ("EMAIL", "email"),
        ("\ufeffEmail", "email"),  # a CSV header with a byte-order mark
        ("Company Name", "company"),
        ("organization", "company"),
        ("Organisation", "company"),
        ("zip", "postal_code"),
        ("zipcode", "postal_code"),
        ("Zip Code", "postal_code"),
        ("postcode", "postal_code"),
        ("Postal Code", "postal_code"),
        ("state", "region"),
        ("province", "region"),
        ("State/Province", "region"),
        ("Country/Region", "country"),
        ("country_code", "country"),
        ("company_size", "employees"),
        ("No. of Employees", "employees"),
        ("employee_count", "employees"),
        ("Number of Employees", "employees"),
        ("fname", "first_name"),
        ("given_name", "first_name"),
        ("First Name", "first_name"),
        ("firstName", "first_name"),
        ("lname", "last_name"),
        ("surname", "last_name"),
        ("family_name", "last_name"),
        ("Last Name", "last_name"),
        ("name", "full_name"),
        ("full_name", "full_name"),
        ("Full Name", "full_name"),
        ("phone_number", "phone"),
        ("Phone", "phone"),
        ("mobile", "phone"),
        ("tel", "phone"),
        ("job_title", "title"),
        ("Job Title", "title"),
        ("url", "website"),
        ("company_website", "website"),
        ("Website", "website"),
        ("score", "lead_score"),
        ("Lead Score", "lead_score"),
        ("utm source", "utm_source"),
        ("UTM-Medium", "utm_medium"),
        ("utm.campaign", "utm_campaign"),
        ("Annual Revenue", "annual_revenue"),
        ("revenue", "annual_revenue"),
        ("Industry", "industry"),
        ("city", "city"),
        ("Company Domain", "domain"),
        ("external id", "external_id"),
        ("favourite colour", None),
        ("utm_term", None),
        ("source", None),
        ("id", None),
        ("", None),
        ("!!!", None),
    ],
)
def test_canonical_key(raw_key, expected):
    assert canonical_key(raw_key) == expected


def test_map_fields_splits_canonical_and_custom_values_as_sent():
    raw = {"Email Address": " A@B.com ", "Company Name": "Acme", "shoe size": 44, "utm_term": None}
    assert map_fields(raw) == (
        {"email": " A@B.com ", "company": "Acme"},
        {"shoe size": 44, "utm_term": None},
    )


def test_field_map_wins_over_aliases_exact_then_loose():
    raw = {"Org": "Acme", "Name": "Product X", "Work Email": "a@b.com", "handle": "@jane"}
    field_map = {"Org": "company", "name": "custom", "handle": "Title"}
    canonical, custom = map_fields(raw, field_map)
    # "name" maps loosely to "Name"; a target that is no canonical field keeps it in custom.
    assert canonical == {"company": "Acme", "email": "a@b.com", "title": "@jane"}
    assert custom == {"Name": "Product X"}


@pytest.mark.parametrize("field_map", [None, {}, [], "x", {"a": 1}, {1: "email"}])
def test_odd_field_maps_are_ignored(field_map):
    assert map_fields({"email": "a@b.com"}, field_map) == ({"email": "a@b.com"}, {})


def test_first_occurrence_wins_and_the_loser_goes_to_custom():
    canonical, custom = map_fields({"Email": "a@b.com", "work_email": "c@d.com"})
    assert canonical == {"email": "a@b.com"}
    assert custom == {"work_email": "c@d.com"}


def test_a_blank_value_does_not_shadow_a_later_one():
    canonical, custom = map_fields({"email": "  ", "Work Email": "c@d.com"})
    assert canonical == {"email": "c@d.com"}
    assert custom == {"email": "  "}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"name": "Jane Doe"}, {"first_name": "Jane", "last_name": "Doe"}),
        (
            {"Full Name": "  Jean-Claude  Van Damme "},
            {"first_name": "Jean-Claude", "last_name": "Van Damme"},
        ),
        ({"name": "Doe, Jane"}, {"first_name": "Jane", "last_name": "Doe"}),
        ({"name": "Cher"}, {"first_name": "Cher"}),
        ({"name": "Jane Doe", "first_name": "J."}, {"first_name": "J.", "last_name": "Doe"}),
        ({"name": "Jane Doe", "last_name": "Roe"}, {"first_name": "Jane", "last_name": "Roe"}),
        (
            {"name": "Jane Doe", "first_name": "", "last_name": "Roe"},
            {"first_name": "Jane", "last_name": "Roe"},
        ),
    ],
)
def test_full_name_fills_missing_first_and_last_name(raw, expected):
    canonical, custom = map_fields(raw)
    assert canonical == expected
    assert custom == ({"first_name": ""} if raw.get("first_name") == "" else {})
    assert normalize(raw).fields == expected


def test_an_unused_full_name_is_kept_in_custom():
    canonical, custom = map_fields({"name": "Jane Doe", "fname": "J", "lname": "D"})
    assert canonical == {"first_name": "J", "last_name": "D"}
    assert custom == {"name": "Jane Doe"}


@pytest.mark.parametrize("raw", [None, [], "x", 5, {}])
def test_map_fields_of_a_non_object(raw):
    assert map_fields(raw) == ({}, {})


# --- is_a_lead --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("canonical", "expected"),
    [
        ({"email": "a@b.com"}, True),
        ({"email": "not an email"}, True),  # the kickoff is not the place to judge syntax
        ({"phone": "555"}, True),
        ({"company": "Acme", "first_name": "Jane"}, True),
        ({"company": "Acme", "last_name": "Doe"}, True),
        ({"company": "Acme"}, False),
        ({"first_name": "Jane", "last_name": "Doe"}, False),
        ({"email": "  ", "phone": None, "company": "Acme", "first_name": "\x00"}, False),
        ({"email": "", "phone": 4155552671}, True),
        ({}, False),
        ({"city": "Berlin", "title": "CEO"}, False),
    ],
)
def test_is_a_lead(canonical, expected):
    assert is_a_lead(canonical) is expected


def test_is_a_lead_on_a_mapped_payload():
    assert is_a_lead(map_fields({"Full Name": "Jane Doe", "Organization": "Acme"})[0])
    assert not is_a_lead(map_fields({"Full Name": "Jane Doe"})[0])


# --- single values ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (" Jane.Doe@ACME.com ", ("jane.doe@acme.com", True)),
        ("jane.doe @acme.com", ("jane.doe@acme.com", True)),
        ("a+tag@sub.example.co.uk", ("a+tag@sub.example.co.uk", True)),
        ("JANE@bücher.de", ("jane@bücher.de", True)),
        ("jane@acme", ("jane@acme", False)),
        ("not an email", ("notanemail", False)),
        ("jane@@acme.com", ("jane@@acme.com", False)),
        ("", (None, False)),
        ("   ", (None, False)),
        (None, (None, False)),
        (42, ("42", False)),
        ({"a": 1}, ('{"a":1}', False)),
    ],
)
def test_normalize_email(value, expected):
    assert normalize_email(value) == expected


@pytest.mark.parametrize(
    ("email", "expected"),
    [
        ("jane@acme.com", "acme.com"),
        ("jane@mail.acme.com", "mail.acme.com"),
        ("jane@bücher.de", "xn--bcher-kva.de"),
        ("jane@@acme.com", "acme.com"),
        ("jane@acme", None),
        ("jane", None),
        ("", None),
    ],
)
def test_email_domain(email, expected):
    assert email_domain(email) == expected


@pytest.mark.parametrize(
    ("domain", "free", "disposable"),
    [
        ("gmail.com", True, False),
        ("googlemail.com", True, False),
        ("yahoo.com", True, False),
        ("hotmail.com", True, False),
        ("outlook.com", True, False),
        ("gmx.de", True, False),
        ("mailinator.com", True, True),  # HubSpot's free-mail list includes it too
        ("guerrillamail.com", False, True),
        ("sharklasers.com", False, True),
        ("anything.mailinator.com", True, True),  # parents count
        ("acme.com", False, False),
        ("com", False, False),
        ("", False, False),
    ],
)
def test_free_and_disposable_domains(domain, free, disposable):
    assert is_free_email_domain(domain) is free
    assert is_disposable_domain(domain) is disposable


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("acme.com", "acme.com"),
        ("ACME.COM", "acme.com"),
        ("https://www.acme.com/about?x=1#top", "acme.com"),
        ("http://user:secret@www.acme.co.uk:8080/", "acme.co.uk"),
        ("www.acme.io", "acme.io"),
        ("www.www.acme.io", "acme.io"),
        ("www.com", "www.com"),
        ("//cdn.acme.io/x.js", "cdn.acme.io"),
        ("acme.com.", "acme.com"),
        ("bücher.de", "xn--bcher-kva.de"),
        ("https://Bücher.de/shop", "xn--bcher-kva.de"),
        ("xn--bcher-kva.de", "xn--bcher-kva.de"),
        ("acme.com inc", "acme.com"),
        ("n/a", None),
        ("localhost", None),
        ("http://10.0.0.1/", None),
        ("-acme-.com", None),
        ("acme..com", None),
        ("", None),
        (None, None),
        (42, None),
    ],
)
def test_normalize_domain(value, expected):
    assert normalize_domain(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Germany", "DE"),
        ("germany", "DE"),
        ("DEU", "DE"),
        ("de", "DE"),
        ("DE", "DE"),
        (" De ", "DE"),
        ("276", "DE"),
        (276, "DE"),
        ("United States", "US"),
        ("United States of America", "US"),
        ("USA", "US"),
        ("U.S.", "US"),
        ("u.s.a.", "US"),
        ("UK", "GB"),
        ("U.K.", "GB"),
        ("United Kingdom", "GB"),
        ("Great Britain", "GB"),
        ("England", "GB"),
        ("The Netherlands", "NL"),
        ("Holland", "NL"),
        ("South Korea", "KR"),
        ("Republic of Korea", "KR"),
        ("Russia", "RU"),
        ("Vietnam", "VN"),
        ("Türkiye", "TR"),
        ("Turkiye", "TR"),
        ("Turkey", "TR"),
        ("Czech Republic", "CZ"),
        ("Côte d'Ivoire", "CI"),
        ("Cote d\u2019Ivoire", "CI"),
        ("Ivory Coast", "CI"),
        ("Democratic Republic of the Congo", "CD"),
        ("Congo", "CG"),
        ("Vatican", "VA"),
        ("UAE", "AE"),
        ("Korea", None),  # North or South: ambiguous
        ("America", None),
        ("N/A", None),
        ("none", None),
        ("other", None),
        ("Narnia", None),
        ("Europe", None),
        ("", None),
        (None, None),
        (True, None),
    ],
)
def test_normalize_country(value, expected):
    assert normalize_country(value) == expected


@pytest.mark.parametrize(
    ("value", "country", "expected"),
    [
        ("California", "US", "CA"),
        ("california", "US", "CA"),
        ("ca", "US", "CA"),
        ("CA", "US", "CA"),
        ("US-CA", "US", "CA"),
        ("New York", "US", "NY"),
        ("California", "United States", "CA"),
        ("Bayern", "DE", "BY"),
        ("by", "DE", "BY"),
        ("Baden-Württemberg", "DE", "BW"),
        ("baden wurttemberg", "DE", "BW"),
        ("Thüringen", "DE", "TH"),
        ("Bavaria", "DE", "BY"),  # English names too (issue 16), not only pycountry's German one
        ("Ontario", "CA", "ON"),
        ("QC", "Canada", "QC"),
        ("England", "GB", "ENG"),
        ("Bristol", "GB", "BST"),
        ("Île-de-France", "FR", "IDF"),
        ("New South Wales", "AU", "NSW"),
        ("Maharashtra", "IN", "MH"),
        ("Narnia", "US", None),
        ("ZZ", "US", None),
        ("ny", None, "NY"),
        ("NSW", None, "NSW"),
        ("New York", None, None),
        ("ca", "Narnia", "CA"),
        ("", "US", None),
        (None, "US", None),
    ],
)
def test_normalize_region(value, country, expected):
    assert normalize_region(value, country) == expected


@pytest.mark.parametrize(
    ("value", "country", "expected"),
    [
        ("(415) 555-2671", "US", "+14155552671"),
        ("415.555.2671", "United States", "+14155552671"),
        ("+1 415 555 2671", None, "+14155552671"),
        ("+1 415 555 2671", "DE", "+14155552671"),
        ("tel:+1-415-555-2671", None, "+14155552671"),
        (4155552671, "US", "+14155552671"),
        (14155552671, "US", "+14155552671"),
        ("+14155552671", None, "+14155552671"),
        ("030 1234567", "DE", "+49301234567"),
        ("0049 30 1234567", None, "+49301234567"),
        ("020 7946 0958", "GB", "+442079460958"),
        ("+39 06 1234 5678", None, "+390612345678"),
        ("(415) 555-2671", None, None),  # no country, no +: cannot tell
        ("+1 555 123 4567", None, None),  # not a valid number
        ("call me", "US", None),
        ("", "US", None),
        (None, None, None),
        ("1" * 300, "US", None),
    ],
)
def test_normalize_phone(value, country, expected):
    assert normalize_phone(value, country) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("51-200", 51),
        ("1,000+", 1000),
        ("10k", 10000),
        ("1.5K", 1500),
        (250, 250),
        (250.0, 250),
        (51.7, 51),
        ("250", 250),
        ("1000-5000 employees", 1000),
        ("10 employees", 10),
        ("10,001+", 10001),
        ("0", 0),
        ("garbage", None),
        ("-5", None),
        (-5, None),
        (10**12, None),
        (True, None),
        (None, None),
        ([], None),
        (math.nan, None),
    ],
)
def test_normalize_employees(value, expected):
    result = normalize_employees(value)
    assert result == expected
    assert result is None or type(result) is int


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("$1.5M", 1_500_000),
        ("2,000,000", 2_000_000),
        ("85", 85),
        ("85.5", 85.5),
        (85, 85),
        (85.0, 85),
        (85.25, 85.25),
        ("€2.3bn", 2_300_000_000),
        ("1.5 million", 1_500_000),
        ("$1M-$10M", 1_000_000),
        ("1e6", 1_000_000),
        ("USD 250k", 250_000),
        ("-3", -3),
        ("nan", None),
        ("Infinity", None),
        (math.inf, None),
        (10**18, None),
        ("lots", None),
        ("", None),
        (True, None),
        (None, None),
        ({"a": 1}, None),
    ],
)
def test_normalize_number(value, expected):
    result = normalize_number(value)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("  Acme \t Inc\n", "Acme Inc"),
        ("Ac\x00me\x07", "Acme"),
        ("a\u00a0b", "a b"),
        ("\ufeffAcme", "Acme"),
        ("x" * 300, "x" * 255),
        (42, "42"),
        (4.0, "4"),
        (True, "true"),
        (["SaaS", "", "Fintech"], "SaaS; Fintech"),
        ({"a": 1}, '{"a": 1}'),
        ({}, None),
        ("   ", None),
        (None, None),
    ],
)
def test_normalize_text(value, expected):
    assert normalize_text(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (" sw1a  1aa ", "SW1A 1AA"),
        ("94105", "94105"),
        (94105, "94105"),
        ("10115\x00", "10115"),
        ("", None),
    ],
)
def test_normalize_postal_code(value, expected):
    assert normalize_postal_code(value) == expected


# --- the whole lead ---------------------------------------------------------------------------


def test_normalize_a_typical_form_post():
    raw = {
        "Email Address": " Jane.Doe@Acme.COM ",
        "Full Name": "Jane  Doe",
        "Phone": "(415) 555-2671",
        "Company Name": "Acme\x00 Inc",
        "Job Title": "VP  Sales",
        "Country": "USA",
        "State": "california",
        "Zip": " 94105 ",
        "No. of Employees": "51-200",
        "Annual Revenue": "$1.5M",
        "Website": "https://www.acme.com/about",
        "score": "85",
        "utm_source": "google",
        "favourite colour": "blue",
    }
    lead = normalize(raw)
    assert lead == NormalizedLead(
        fields={
            "email": "jane.doe@acme.com",
            "email_domain": "acme.com",
            "first_name": "Jane",
            "last_name": "Doe",
            "phone": "+14155552671",
            "company": "Acme Inc",
            "domain": "acme.com",
            "title": "VP Sales",
            "country": "US",
            "region": "CA",
            "postal_code": "94105",
            "employees": 51,
            "annual_revenue": 1_500_000,
            "lead_score": 85,
            "utm_source": "google",
            "website": "https://www.acme.com/about",
        },
        custom={"favourite colour": "blue"},
        flags=(),
    )
    assert normalize(lead.fields | lead.custom) == lead


def test_normalized_lead_is_frozen():
    lead = normalize({"email": "a@b.com"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        lead.flags = ()  # type: ignore[misc]


@pytest.mark.parametrize(
    ("raw", "domain", "flags"),
    [
        ({"email": "jane@acme.com"}, "acme.com", ()),
        ({"email": "jane@gmail.com"}, None, ("free_email",)),
        ({"email": "jane@gmail.com", "website": "acme.io"}, "acme.io", ("free_email",)),
        ({"email": "jane@guerrillamail.com"}, None, ("disposable_email",)),
        ({"email": "jane@mailinator.com"}, None, ("disposable_email", "free_email")),
        ({"email": "jane@acme.com", "website": "https://www.acme.io"}, "acme.io", ()),
        ({"email": "jane@acme.com", "domain": "acme.org", "url": "acme.io"}, "acme.org", ()),
        ({"email": "jane@acme.com", "website": "n/a"}, "acme.com", ()),
        ({"email": "jane@acme"}, None, ("invalid_email",)),
    ],
)
def test_company_domain_and_email_flags(raw, domain, flags):
    lead = normalize(raw)
    assert lead.fields.get("domain") == domain
    assert lead.flags == flags


def test_an_invalid_email_is_kept_and_flagged():
    lead = normalize({"email": " Not An Email "})
    assert lead.fields == {"email": "notanemail"}
    assert lead.flags == ("invalid_email",)


def test_a_valid_email_wins_over_an_earlier_invalid_one():
    lead = normalize({"email": "n/a", "Work Email": "jane@acme.com"})
    assert lead.fields["email"] == "jane@acme.com"
    assert lead.custom == {}  # "email" would shadow the field in fields | custom
    assert lead.flags == ()


@pytest.mark.parametrize(
    ("raw", "fields", "custom", "flags"),
    [
        (
            {"country": "Narnia", "state": "Cair Paravel"},
            {},
            {"country": "Narnia", "state": "Cair Paravel"},
            ("unknown_country", "unknown_region"),
        ),
        (
            {"country": "Narnia", "state": "ny"},
            {"region": "NY"},
            {"country": "Narnia"},
            ("unknown_country",),
        ),
        (
            {"country": "DE", "state": "Narnia"},
            {"country": "DE"},
            {"state": "Narnia"},
            ("unknown_region",),
        ),
        (
            {"phone": "call me", "country": "US"},
            {"country": "US"},
            {"phone": "call me"},
            ("invalid_phone",),
        ),
        (
            {"phone": "call me", "Mobile": "+1 415 555 2671"},
            {"phone": "+14155552671"},
            {},
            (),
        ),
        ({"employees": "lots", "revenue": "n/a"}, {}, {"employees": "lots", "revenue": "n/a"}, ()),
        ({"phone": "", "country": ""}, {}, {"phone": "", "country": ""}, ()),
    ],
)
def test_values_that_do_not_normalise(raw, fields, custom, flags):
    lead = normalize(raw)
    assert (lead.fields, lead.custom, lead.flags) == (fields, custom, flags)


def test_the_phone_uses_the_country_as_a_hint():
    assert (
        normalize({"phone": "030 1234567", "country": "Germany"}).fields["phone"] == "+49301234567"
    )


def test_the_source_field_map_applies():
    lead = normalize({"Org": "Acme", "Mail": "jane@acme.com"}, {"Org": "company", "mail": "email"})
    assert lead.fields == {
        "email": "jane@acme.com",
        "email_domain": "acme.com",
        "company": "Acme",
        "domain": "acme.com",
    }


def test_numbers_and_ids_keep_their_types():
    lead = normalize(
        {"employees": 250.0, "annual_revenue": 1234.567, "lead_score": "7.5", "external_id": 12345}
    )
    assert lead.fields == {
        "employees": 250,
        "annual_revenue": 1234.57,
        "lead_score": 7.5,
        "external_id": "12345",
    }


def test_the_module_does_not_import_django():
    code = "import sys, leads.normalize; sys.exit('django' in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- properties -------------------------------------------------------------------------------

_KEYS = (
    *CANONICAL_FIELDS,
    "name",
    "Full Name",
    "Email Address",
    "work_email",
    "Company Name",
    "fname",
    "surname",
    "Phone",
    "mobile",
    "zip",
    "State",
    "Country/Region",
    "No. of Employees",
    "url",
    "score",
    "utm source",
)
_REALISTIC = (
    "jane.doe@acme.com",
    "JANE@Gmail.com",
    "x@mailinator.com",
    "not an email",
    "Jane Doe",
    "Doe, Jane",
    "+1 415 555 2671",
    "(415) 555-2671",
    "030 1234567",
    "0049 30 1234567",
    "USA",
    "Germany",
    "de",
    "UK",
    "N/A",
    "California",
    "ca",
    "Bayern",
    "US-NY",
    "94105",
    "51-200",
    "1,000+",
    "10k",
    "$1.5M",
    "85",
    "https://www.acme.com/x",
    "www.www.acme.io",
    "bücher.de",
    "Acme\x00  Inc",
    "",
    " ",
    "\x00",
)
_json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
json_values = st.recursive(
    _json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=10,
)
raw_payloads = st.dictionaries(
    keys=st.sampled_from(_KEYS) | st.text(max_size=20),
    values=st.sampled_from(_REALISTIC) | json_values,
    max_size=12,
)
_property = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_property
@given(raw_payloads)
def test_normalize_never_raises_and_returns_canonical_fields(raw):
    lead = normalize(raw)
    assert set(lead.fields) <= set(CANONICAL_FIELDS)
    assert all(value is not None and value != "" for value in lead.fields.values())
    assert not set(lead.fields) & set(lead.custom)
    assert list(lead.flags) == sorted(set(lead.flags))
    for key, value in lead.custom.items():
        assert value is raw[key]
    for field in ("employees", "annual_revenue", "lead_score"):
        assert type(lead.fields.get(field, 0)) in (int, float)
    for field in ("country", "region", "phone", "postal_code", "email"):
        assert len(lead.fields.get(field, "")) <= {"email": 320, "postal_code": 32}.get(field, 16)


@_property
@given(raw_payloads)
def test_normalize_is_idempotent(raw):
    lead = normalize(raw)
    again = normalize(lead.fields | lead.custom)
    assert again.fields == lead.fields


@_property
@given(json_values, st.sampled_from([None, "US", "DE", "GB", "Narnia"]))
def test_single_value_normalisers_never_raise_and_are_fixed_points(value, country):
    for normaliser in (normalize_domain, normalize_country, normalize_employees, normalize_number):
        result = normaliser(value)
        assert result is None or normaliser(result) == result
    email, _ = normalize_email(value)
    assert email is None or normalize_email(email)[0] == email
    for normaliser2 in (normalize_region, normalize_phone):
        result = normaliser2(value, country)
        assert result is None or normaliser2(result, country) == result
    text = normalize_text(value)
    assert text is None or normalize_text(text) == text


@_property
@given(raw_payloads, st.sampled_from([None, {"Org": "company", "x": "email", "name": "nothing"}]))
def test_map_fields_never_loses_a_key(raw, field_map):
    canonical, custom = map_fields(raw, field_map)
    assert set(canonical) <= set(CANONICAL_FIELDS)
    for key, value in custom.items():
        assert value is raw[key]
    resolve = _mapping_resolver(field_map)
    mapped_keys = [key for key in raw if key not in custom]
    for key in mapped_keys:
        target = resolve(key)
        assert target in canonical or (
            target == FULL_NAME and canonical.keys() & {"first_name", "last_name"}
        )
    # at most one raw key feeds each canonical field (full_name feeds first and last)
    assert len(mapped_keys) <= len(canonical)


# A JSON object or array is no value for the kickoff's rule (issue 16: no junk from structure).
_BLANKS: tuple[Any, ...] = (None, "", "   ", "\x00", "\t\n", [], {}, ["x"], {"a": 1})
_NON_BLANKS: tuple[Any, ...] = ("x", "a@b.com", " Acme ", 0, 42, False)


@_property
@given(
    st.fixed_dictionaries(
        {},
        optional={
            field: st.sampled_from(_BLANKS + _NON_BLANKS)
            for field in ("email", "phone", "company", "first_name", "last_name", "city")
        },
    )
)
def test_is_a_lead_iff_the_kickoff_rule(canonical):
    def present(field):
        return field in canonical and canonical[field] not in _BLANKS

    expected = (
        present("email")
        or present("phone")
        or (present("company") and (present("first_name") or present("last_name")))
    )
    assert is_a_lead(canonical) is expected
