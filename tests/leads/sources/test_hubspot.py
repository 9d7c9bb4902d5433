"""The HubSpot kind: workflow webhooks (v1 and v3 contact shapes), form submissions, and the v3
request signature."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from leads.sources import kind_get
from leads.sources.base import Inbound
from tests.leads.sources.kindtest import fixture_record, lead_from

KIND = "hubspot"


def test_workflow_contact_v1() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "workflow_contact_v1.json"))
    assert lead.fields == {
        "email": "j.mueller@bergmann-maschinenbau.de",
        "email_domain": "bergmann-maschinenbau.de",
        "first_name": "Jürgen",
        "last_name": "Müller",
        "phone": "+498921804711",
        "company": "Bergmann Maschinenbau GmbH",
        "domain": "bergmann-maschinenbau.de",
        "title": "Leiter Einkauf",
        "country": "DE",
        "region": "BY",
        "city": "München",
        "postal_code": "80331",
        "employees": 501,
        "annual_revenue": 181900000,
        "industry": "Industrial Machinery",
        "lead_score": 35,
        "website": "http://www.bergmann-maschinenbau.de",
        "external_id": "3234574:1484026626243",
    }
    # Every other property by its HubSpot name, as a scalar (not its versions).
    assert lead.custom["lead_source"] == "Messe Hannover"
    assert lead.custom["lifecyclestage"] == "marketingqualifiedlead"
    assert lead.custom["associatedcompanyid"] == "184896670"
    assert lead.custom["portal-id"] == 62515
    assert lead.custom["vid"] == 3234574
    assert isinstance(lead.custom["identity-profiles"], list)
    assert "properties" not in lead.custom
    assert lead.flags == ()


def test_workflow_contact_v3_plain_values_and_mobile_phone() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "workflow_contact_v3.json"))
    assert lead.fields == {
        "email": "laura.martinez@ibericalogistica.es",
        "email_domain": "ibericalogistica.es",
        "first_name": "Laura",
        "last_name": "Martínez García",
        "phone": "+34612345678",  # mobilephone, as phone is null
        "company": "Ibérica Logística S.L.",
        "domain": "ibericalogistica.es",
        "title": "Directora de Operaciones",
        "country": "ES",
        "region": "MD",
        "city": "Madrid",
        "employees": 201,
        "external_id": "512:2026-02-11T09:20:05.118Z",
    }
    assert lead.custom["interested_in"] == "Routing;API access"
    assert lead.custom["hs_persona"] == "persona_1"
    assert lead.custom["hs_object_id"] == "512"
    assert lead.custom["archived"] is False
    assert lead.flags == ()


def test_workflow_contact_email_only_in_identity_profiles() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "workflow_contact_identity_only.json"))
    assert lead.fields == {
        "email": "taylor.chen@harbourfreight-partners.co.uk",
        "email_domain": "harbourfreight-partners.co.uk",
        "first_name": "Taylor",
        "last_name": "Chen",
        "domain": "harbourfreight-partners.co.uk",
        "external_id": "2751:1593001672723",
    }
    assert lead.custom["profile-url"] == "https://app.hubspot.com/contacts/6907359/contact/2751"
    assert lead.flags == ()


def test_form_submission_v3_company_fields_and_checkboxes() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "form_submission_v3.json"))
    assert lead.fields == {
        "email": "sophie.dubois@atelier-lumiere.fr",
        "email_domain": "atelier-lumiere.fr",
        "first_name": "Sophie",
        "last_name": "Dubois",
        "phone": "+33142685300",
        "company": "Atelier Lumière SAS",  # the form's company (0-2) name field
        "domain": "atelier-lumiere.fr",
        "title": "Responsable marketing",
        "country": "FR",
        "employees": 85,
    }
    assert lead.custom["products_of_interest"] == "Routing; Reporting"
    assert lead.custom["how_did_you_hear"] == "Webinar"
    assert lead.custom["company_phone"] == "+33 1 42 68 53 53"  # not the person's phone
    assert lead.custom["hutk"] == "2d8d9f8b3e6c4c1aa7d9e0b5f3a2c1d0"
    assert lead.custom["pageUri"] == "https://www.example.com/demo"
    assert lead.custom["submittedAt"] == "1767864214000"
    assert lead.custom["legalConsentOptions"]["consent"]["consentToProcess"] is True
    assert lead.flags == ()


def test_form_submissions_api_result_with_conversion_id() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "form_submissions_api.json"))
    assert lead.fields == {
        "email": "henrik.sorensen@nordvind.dk",
        "email_domain": "nordvind.dk",
        "first_name": "Henrik",
        "last_name": "Sørensen",
        "company": "Nordvind ApS",
        "domain": "nordvind.dk",
        "country": "DK",
        "external_id": "0bd9a1b4-6c8e-4b1f-8f1e-3c2d5a7b9e10",
    }
    assert lead.custom["message"] == "Please call me back"
    assert lead.custom["pageUrl"] == "https://www.example.com/contact"
    assert lead.flags == ()


def test_a_customised_workflow_body_uses_hubspot_names() -> None:
    lead = lead_from(
        KIND,
        {"email": "a.kowalska@wisla-tech.pl", "firstname": "Agnieszka", "jobtitle": "CFO"},
    )
    assert lead.fields["first_name"] == "Agnieszka"
    assert lead.fields["title"] == "CFO"


def test_a_company_based_workflow_reads_name_as_the_company() -> None:
    lead = lead_from(
        KIND,
        {
            "companyId": 184896670,
            "properties": {
                "name": {"value": "Bergmann Maschinenbau GmbH"},
                "phone": {"value": "+49 89 2180 4700"},
                "numberofemployees": {"value": "750"},
            },
        },
    )
    assert lead.fields["company"] == "Bergmann Maschinenbau GmbH"
    assert lead.fields["phone"] == "+498921804700"
    assert lead.fields["employees"] == 750
    assert lead.fields["external_id"] == "184896670"


# --- the v3 signature --------------------------------------------------------------------------

SECRET = "yyyyyyyy-yyyy-yyyy-yyyy-yyyyyyyyyyyy"  # the client secret of HubSpot's doc examples
BODY = b'{"vid":3234574,"properties":{"email":{"value":"j.mueller@bergmann-maschinenbau.de"}}}'
URI = "https://leads.example.com/api/v1/intake/hubspot-workflow/?token=abc"
TIMESTAMP = "1767864214000"
NOW = datetime.fromtimestamp(int(TIMESTAMP) / 1000, tz=UTC) + timedelta(seconds=30)
# base64(HMAC-SHA256(secret, "POST" + URI + BODY + TIMESTAMP)), computed once by hand.
SIGNATURE = "HR5Wn+dS68iDce6Pe5k+S3rjQjiEMmh8fJl9LMCsZj8="


def inbound(
    *,
    body: bytes = BODY,
    url: str = URI,
    signature: str | None = SIGNATURE,
    timestamp: str | None = TIMESTAMP,
    method: str = "POST",
) -> Inbound:
    headers = {"content-type": "application/json"}
    if signature is not None:
        headers["x-hubspot-signature-v3"] = signature
    if timestamp is not None:
        headers["x-hubspot-request-timestamp"] = timestamp
    return Inbound(
        method=method, body=body, content_type="application/json", headers=headers, url=url
    )


def verify(request: Inbound, secret: str = SECRET, now: datetime = NOW) -> bool:
    check = kind_get(KIND).verify
    assert check is not None
    return check(request, secret, now)


def test_the_signature_is_hubspots_documented_algorithm() -> None:
    message = b"POST" + URI.encode() + BODY + TIMESTAMP.encode()
    digest = hmac.new(SECRET.encode(), message, hashlib.sha256).digest()
    assert base64.b64encode(digest).decode() == SIGNATURE
    assert kind_get(KIND).signature_header == "X-HubSpot-Signature-v3"


def test_a_valid_signature_passes() -> None:
    assert verify(inbound())


def test_a_uri_with_encoded_characters_is_checked_decoded_too() -> None:
    # HubSpot signs the URI with %3A, %2F, %40... decoded; our request URI may keep them.
    encoded = URI.replace("?token=abc", "?token=a%3Ab")
    plain = URI.replace("?token=abc", "?token=a:b")
    message = b"POST" + plain.encode() + BODY + TIMESTAMP.encode()
    signature = base64.b64encode(hmac.new(SECRET.encode(), message, hashlib.sha256).digest())
    assert verify(inbound(url=encoded, signature=signature.decode()))


def test_a_wrong_secret_fails() -> None:
    assert not verify(inbound(), secret="zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz")


def test_a_tampered_body_fails() -> None:
    assert not verify(inbound(body=BODY.replace(b"mueller", b"mueler")))


def test_another_url_or_method_fails() -> None:
    assert not verify(inbound(url=URI.replace("token=abc", "token=abd")))
    assert not verify(inbound(method="PUT"))


def test_a_stale_or_future_timestamp_fails() -> None:
    assert not verify(inbound(), now=NOW + timedelta(minutes=5))
    assert not verify(inbound(), now=NOW - timedelta(minutes=6))


def test_missing_headers_fail() -> None:
    assert not verify(inbound(signature=None))
    assert not verify(inbound(timestamp=None))
    assert not verify(inbound(timestamp="yesterday"))
    assert not verify(inbound(), secret="")


@given(
    st.dictionaries(
        st.text(max_size=12),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda children: (
                st.lists(children, max_size=4)
                | st.dictionaries(st.text(max_size=12), children, max_size=4)
            ),
            max_leaves=20,
        ),
        max_size=6,
    )
)
def test_decode_never_raises(record: dict) -> None:
    for key in ("properties", "fields", "identity-profiles"):
        assert isinstance(kind_get(KIND).decode({**record, key: record.get(key, record)}, {}), dict)
    assert isinstance(kind_get(KIND).decode(record, {}), dict)
