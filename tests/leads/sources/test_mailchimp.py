"""The Mailchimp kind: the documented audience webhook events (form posts) and the GET ping."""

from __future__ import annotations

from leads.sources import kind_get
from leads.sources.base import Inbound, Reply
from tests.leads.sources.kindtest import fixture_record, lead_from

KIND = "mailchimp"


def test_subscribe_docs_sample() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "subscribe_docs_sample.form"))
    assert lead.fields == {
        "email": "api@mailchimp.com",
        "email_domain": "mailchimp.com",
        "first_name": "Mailchimp",
        "last_name": "API",
        "domain": "mailchimp.com",
        "external_id": "8a25ff1d98:subscribe:2009-03-26 21:35:57",
    }
    assert lead.custom["interests"] == "Group1; Group2"
    assert lead.custom["mailchimp_member_id"] == "8a25ff1d98"
    assert lead.custom["mailchimp_list_id"] == "a6b5da1054"
    assert lead.custom["ip_signup"] == "10.20.10.30"
    assert lead.custom["mailchimp_event"] == "subscribe"
    assert lead.flags == ()


def test_subscribe_b2b_address_phone_groupings() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "subscribe_b2b.form"))
    assert lead.fields == {
        "email": "thomas.wagner@stahlbau-wagner.de",
        "email_domain": "stahlbau-wagner.de",
        "first_name": "Thomas",
        "last_name": "Wagner",
        "phone": "+49711987654",
        "company": "Stahlbau Wagner GmbH",
        "domain": "stahlbau-wagner.de",
        "country": "DE",
        "region": "BW",
        "city": "Stuttgart",
        "postal_code": "70565",
        "external_id": "3f9c2a71be:subscribe:2026-03-02 08:14:09",
    }
    assert lead.custom["street"] == "Industriestraße 7"
    assert lead.custom["interests: Themen"] == "Webinare; Produktneuheiten"
    assert lead.custom["mailchimp_web_id"] == "418822731"
    assert "BIRTHDAY" not in lead.custom  # blank
    assert lead.flags == ()


def test_profile_update_is_its_own_key() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "profile.form"))
    assert lead.fields == {
        "email": "thomas.wagner@stahlbau-wagner.de",
        "email_domain": "stahlbau-wagner.de",
        "first_name": "Thomas",
        "last_name": "Wagner",
        "phone": "+49711987654",
        "domain": "stahlbau-wagner.de",
        "country": "DE",
        "external_id": "3f9c2a71be:profile:2026-03-05 16:02:44",
    }
    subscribe = lead_from(KIND, fixture_record(KIND, "subscribe_b2b.form"))
    assert subscribe.fields["external_id"] != lead.fields["external_id"]
    assert lead.custom["mailchimp_event"] == "profile"


def test_unsubscribe() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "unsubscribe.form"))
    assert lead.fields == {
        "email": "api+unsub@mailchimp.com",
        "email_domain": "mailchimp.com",
        "first_name": "Mailchimp",
        "last_name": "API",
        "domain": "mailchimp.com",
        "external_id": "8a25ff1d98:unsubscribe:2009-03-26 21:40:57",
    }
    assert lead.custom["unsubscribe_action"] == "unsub"
    assert lead.custom["reason"] == "manual"
    assert lead.custom["mailchimp_campaign_id"] == "cb398d21d2"
    assert lead.custom["mailchimp_event"] == "unsubscribe"


def test_upemail_takes_the_new_address() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "upemail.form"))
    assert lead.fields == {
        "email": "api+new@mailchimp.com",
        "email_domain": "mailchimp.com",
        "domain": "mailchimp.com",
        "external_id": "51da8c3259:upemail:2009-03-26 22:15:09",
    }
    assert lead.custom["old_email"] == "api+old@mailchimp.com"
    assert lead.custom["mailchimp_member_id"] == "51da8c3259"


def test_cleaned_without_member_id() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "cleaned.form"))
    assert lead.fields == {
        "email": "api+cleaned@mailchimp.com",
        "email_domain": "mailchimp.com",
        "domain": "mailchimp.com",
        "external_id": "api+cleaned@mailchimp.com:cleaned:2009-03-26 22:01:00",
    }
    assert lead.custom["reason"] == "hard"
    assert lead.custom["mailchimp_event"] == "cleaned"


def test_nested_json_reads_the_same() -> None:
    nested = {
        "type": "subscribe",
        "fired_at": "2009-03-26 21:35:57",
        "data": {
            "id": "8a25ff1d98",
            "email": "api@mailchimp.com",
            "merges": {"FNAME": "Mailchimp", "LNAME": "API", "ADDRESS": {"country": "DE"}},
        },
    }
    lead = lead_from(KIND, nested)
    assert lead.fields["first_name"] == "Mailchimp"
    assert lead.fields["country"] == "DE"
    assert lead.fields["external_id"] == "8a25ff1d98:subscribe:2009-03-26 21:35:57"


def test_handshake_answers_the_validator_get() -> None:
    handshake = kind_get(KIND).handshake
    assert handshake is not None
    validator = Inbound("GET", b"", "", {"user-agent": "MailChimp.com WebHook Validator"})
    assert handshake(validator, "", {}) == Reply(200, b"")
    post = Inbound("POST", b"type=subscribe", "application/x-www-form-urlencoded", {})
    assert handshake(post, "", {}) is None
