"""Meta Lead Ads: the documented lead and leadgen webhook samples, signature and GET check."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime

from leads.sources import kind_get
from leads.sources.base import Inbound
from tests.leads.sources.kindtest import fixture_bytes, fixture_record, lead_from

KIND = "meta_lead_ads"
NOW = datetime(2024, 3, 5, 9, 45, tzinfo=UTC)
APP_SECRET = "6d2c0e9a1f3b4c5d8e7f6a5b4c3d2e1f"


def test_lead_sample() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "lead.json"))
    assert lead.fields == {
        "email": "katrin.vogel@nordlicht-logistik.de",
        "email_domain": "nordlicht-logistik.de",
        "first_name": "Katrin",
        "last_name": "Vogel",
        "domain": "nordlicht-logistik.de",
        "external_id": "555971704561545",
    }
    assert lead.custom["date_of_birth"] == "April 19, 1987"
    assert lead.custom["gender"] == "female"
    assert lead.custom["created_time"] == "2015-11-12T15:27:06+0000"
    assert lead.custom["is_tcpa_compliant"] is False
    assert lead.flags == ()


def test_b2b_lead_prefers_work_contact_and_keeps_every_answer() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "lead_b2b.json"))
    assert lead.fields == {
        "email": "j.muessig@brandt-spedition.de",
        "email_domain": "brandt-spedition.de",
        "first_name": "Jürgen",
        "last_name": "Müßig",
        "phone": "+49301234567",
        "company": "Brandt Spedition GmbH",
        "domain": "brandt-spedition.de",
        "title": "Leiter Disposition",
        "country": "DE",
        "region": "BE",
        "city": "Berlin",
        "postal_code": "10115",
        "external_id": "1083465502761234",
    }
    assert lead.custom["personal_email"] == "juergen.muessig@gmail.com"
    # A multi-choice answer is one "a; b" value; an unanswered question is left out.
    assert lead.custom["which_modules_interest_you?"] == "route_planning; telematics"
    assert lead.custom["how_many_trucks_do_you_dispatch_per_day?"] == "51-200"
    assert "anything_else?" not in lead.custom
    assert lead.custom["disclaimer marketing_opt_in"] == "1"
    assert lead.custom["campaign_name"] == "Q1 DACH demo requests"
    assert lead.custom["ad_id"] == "23851234567890123"
    assert lead.custom["form_id"] == "734509821234567"
    assert lead.custom["platform"] == "fb"
    assert lead.flags == ()


def test_flat_export() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "lead_flat_export.json"))
    assert lead.fields == {
        "email": "sophie.laurent@atelier-marchand.fr",
        "email_domain": "atelier-marchand.fr",
        "first_name": "Sophie",
        "last_name": "Laurent",
        "phone": "+33142868200",
        "company": "Atelier Marchand SAS",
        "domain": "atelier-marchand.fr",
        "title": "Directrice des achats",
        "country": "FR",
        "postal_code": "75008",
        "external_id": "2048730011223344",
    }
    assert lead.custom == {
        "created_time": "2024-04-18T13:02:55+0000",
        "form_id": "734509821234567",
        "form_name": "Demo request DACH",
        "campaign_name": "Q2 retargeting",
    }
    assert lead.flags == ()


def test_phone_under_a_hinted_key_and_a_missing_answer() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "lead_phone_only.json"))
    # "6552467291" has no country code and is no valid number anywhere: kept, flagged.
    assert lead.fields == {
        "first_name": "Tan",
        "last_name": "Wei Ling",
        "external_id": "243870422662760",
    }
    assert lead.custom == {"phone": "6552467291", "created_time": "2016-06-22T09:29:50+0000"}
    assert lead.flags == ("invalid_phone",)


def test_leadgen_webhook_carries_the_ids() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "webhook_leadgen.json"))
    assert lead.fields == {"external_id": "55459717045641545"}
    assert lead.custom == {
        "adgroup_id": 0,
        "ad_id": 0,
        "created_time": 1447342026,
        "leadgen_id": 55459717045641545,
        "page_id": 516540199134611,
        "form_id": 551111744595541,
        "meta_object": "page",
        "entry_id": "51044240199134611",
        "entry_time": 1447342027,
    }
    assert lead.flags == ()


def test_batched_webhook_reads_the_first_change_and_names_the_others() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "webhook_leadgen_batch.json"))
    assert lead.fields == {"external_id": "130528934038370"}
    assert lead.custom["leadgen_id"] == "130528934038370"
    assert lead.custom["page_id"] == "230076207144371"
    assert lead.custom["form_id"] == "129595594131704"
    assert lead.custom["leadgen_ids"] == "130528934038370; 130528934038371"


def test_bare_change_object_from_the_dashboard_test() -> None:
    record = {"field": "leadgen", "value": {"leadgen_id": "444444444", "page_id": "444444444"}}
    lead = lead_from(KIND, record)
    assert lead.fields == {"external_id": "444444444"}
    assert lead.custom == {"leadgen_id": "444444444", "page_id": "444444444"}


def test_graph_list_page_reads_its_first_lead() -> None:
    record = {"data": [fixture_record(KIND, "lead.json")], "paging": {"cursors": {}}}
    lead = lead_from(KIND, record)
    assert lead.fields["email"] == "katrin.vogel@nordlicht-logistik.de"
    assert lead.fields["external_id"] == "555971704561545"


# --- signature -----------------------------------------------------------------------------


def _signed(body: bytes, secret: str = APP_SECRET, header: str | None = None) -> Inbound:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {"x-hub-signature-256": header if header is not None else f"sha256={digest}"}
    return Inbound(method="POST", body=body, content_type="application/json", headers=headers)


def test_a_valid_signature_passes() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "webhook_leadgen.json")
    assert verify(_signed(body), APP_SECRET, NOW)
    assert kind_get(KIND).signature_header == "X-Hub-Signature-256"


def test_wrong_secret_tampered_body_and_missing_header_fail() -> None:
    verify = kind_get(KIND).verify
    assert verify is not None
    body = fixture_bytes(KIND, "webhook_leadgen.json")
    assert not verify(_signed(body, secret="another-app-secret"), APP_SECRET, NOW)
    tampered = _signed(body)
    tampered = Inbound(
        method="POST",
        body=body.replace(b"55459717045641545", b"55459717045641546"),
        content_type="application/json",
        headers=tampered.headers,
    )
    assert not verify(tampered, APP_SECRET, NOW)
    assert not verify(_signed(body, header=""), APP_SECRET, NOW)
    sha1 = hmac.new(APP_SECRET.encode(), body, hashlib.sha1).hexdigest()
    assert not verify(_signed(body, header=f"sha1={sha1}"), APP_SECRET, NOW)
    assert not verify(_signed(body), "", NOW)


# --- GET verification ----------------------------------------------------------------------


def _get(query: dict[str, str], method: str = "GET") -> Inbound:
    return Inbound(method=method, body=b"", content_type="", headers={}, query=query)


def test_verification_request_echoes_the_challenge() -> None:
    handshake = kind_get(KIND).handshake
    assert handshake is not None
    query = {
        "hub.mode": "subscribe",
        "hub.challenge": "1158201444",
        "hub.verify_token": "meatyhamhock",
    }
    reply = handshake(_get(query), APP_SECRET, {"verify_token": "meatyhamhock"})
    assert reply is not None
    assert (reply.status, reply.body) == (200, b"1158201444")
    assert reply.content_type.startswith("text/plain")


def test_wrong_or_unset_verify_token_is_refused() -> None:
    handshake = kind_get(KIND).handshake
    assert handshake is not None
    query = {"hub.mode": "subscribe", "hub.challenge": "1158201444", "hub.verify_token": "guess"}
    reply = handshake(_get(query), APP_SECRET, {"verify_token": "meatyhamhock"})
    assert reply is not None
    assert reply.status == 403
    reply = handshake(_get(query), APP_SECRET, {})
    assert reply is not None
    assert reply.status == 403


def test_other_requests_are_no_handshake() -> None:
    handshake = kind_get(KIND).handshake
    assert handshake is not None
    options = {"verify_token": "meatyhamhock"}
    assert handshake(_get({}), APP_SECRET, options) is None
    query = {"hub.mode": "subscribe", "hub.verify_token": "meatyhamhock", "hub.challenge": "1"}
    assert handshake(_get(query, method="POST"), APP_SECRET, options) is None
