"""Google Ads lead form webhook: the documented sample and edge cases, and the google_key check."""

from __future__ import annotations

from datetime import UTC, datetime

from leads.sources import kind_get
from leads.sources.base import Inbound
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = "google_ads"
NOW = datetime(2024, 9, 26, 12, 31, tzinfo=UTC)
FORM_KEY = "s3cr3t-form-key"
TEST_LEAD_ID = (
    "TeSter-123-ABCDEFGHIJKLMNOPQRSTUVWXYZ-abcdefghijklmnopqrstuvwxyz-0123456789-"
    "AaBbCcDdEeFfGgHhIiJjKkLl"
)


def test_documented_test_lead() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "lead_test.json"))
    assert lead.fields == {
        "email": "lukas.becker@rheinmetall-werkzeuge.de",
        "email_domain": "rheinmetall-werkzeuge.de",
        "first_name": "Lukas",
        "last_name": "Becker",
        "phone": "+49301234567",
        "domain": "rheinmetall-werkzeuge.de",
        "country": "DE",
        "city": "Köln",
        "postal_code": "50667",
        "external_id": TEST_LEAD_ID,
    }
    assert lead.custom == {
        "api_version": "1.0",
        "form_id": 123456789,
        "campaign_id": 12345678901,
        "is_test": True,
        "gcl_id": TEST_LEAD_ID,
        "adgroup_id": 20000000000,
        "creative_id": 30000000000,
    }
    # The form's key authenticates the request; it is no part of the lead.
    assert "google_key" not in lead.custom
    assert lead.flags == ()


def test_b2b_lead_prefers_the_work_contact_and_keeps_every_question() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "lead_b2b.json"))
    assert lead.fields == {
        "email": "e.dubois@lumiere-batiment.fr",
        "email_domain": "lumiere-batiment.fr",
        "first_name": "Émilie",
        "last_name": "Dubois-Lefèvre",
        "phone": "+33142685300",
        "company": "Lumière Bâtiment SA",
        "domain": "lumiere-batiment.fr",
        "title": "Responsable achats",
        "country": "FR",
        "region": "IDF",
        "city": "Paris",
        "postal_code": "75002",
        "employees": 51,
        "external_id": "Cj0KCQjw-5y1BhC-ARIsAAM1hQ1x8oQnV2kPq3L7uT9wYz",
    }
    assert lead.custom["Email"] == "emilie.dubois@gmail.com"
    assert lead.custom["Street Address"] == "12 rue de la Paix"
    assert lead.custom["When do you plan to buy?"] == "Within 3 months"
    assert lead.custom["lead_submit_time"] == "2024-09-26T12:30:00Z"
    assert lead.custom["asset_group_id"] == 6400000001
    assert lead.custom["is_test"] is False
    assert "google_key" not in lead.custom
    assert lead.flags == ()


def test_first_schema_with_column_names_only() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "lead_column_names_only.json"))
    assert lead.fields == {
        "email": "marco.rossi@officine-rossi.it",
        "email_domain": "officine-rossi.it",
        "first_name": "Marco",
        "last_name": "Rossi",
        "phone": "+390212345678",
        "domain": "officine-rossi.it",
        "postal_code": "20121",
        "external_id": "lead-0001-legacy-schema",
    }
    assert lead.custom["gcl_id"] == "EAIaIQobChMI-legacy"


def test_blank_and_odd_columns_are_skipped() -> None:
    record = {
        "lead_id": "x1",
        "user_column_data": [
            {"column_id": "EMAIL", "string_value": ""},
            {"column_id": "WORK_EMAIL", "string_value": "ops@beispiel-gmbh.de"},
            {"column_id": "PHONE_NUMBER"},
            "not a column",
            {"string_value": "no name or id"},
        ],
    }
    lead = lead_from(KIND, record)
    assert lead.fields == {
        "email": "ops@beispiel-gmbh.de",
        "email_domain": "beispiel-gmbh.de",
        "domain": "beispiel-gmbh.de",
        "external_id": "x1",
    }
    assert lead.custom == {}


def _post(body: bytes) -> Inbound:
    return Inbound(method="POST", body=body, content_type="application/json", headers={})


def test_the_form_key_in_the_body_passes() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    assert verify(_post(fixture_bytes(KIND, "lead_test.json")), FORM_KEY, NOW)


def test_a_wrong_or_missing_key_fails() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "lead_test.json")
    assert not verify(_post(body), "another-key", NOW)
    assert not verify(_post(body.replace(b'"google_key"', b'"other_key"')), FORM_KEY, NOW)
    assert not verify(_post(body), "", NOW)
    assert not verify(_post(b"not json"), FORM_KEY, NOW)
    assert not verify(_post(b'["s3cr3t-form-key"]'), FORM_KEY, NOW)
