"""The Contact Form 7 kind: CF7 field names, as JSON (CF7 to Webhook) and as a raw form post."""

from __future__ import annotations

from leads.sources import kind_get
from tests.leads.sources.kindtest import fixture_record, lead_from

KIND = "contact_form_7"


def test_default_form() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "default_form.json"))
    assert lead.fields == {
        "email": "k.nowak@mostostal-warszawa.pl",
        "email_domain": "mostostal-warszawa.pl",
        "first_name": "Katarzyna",
        "last_name": "Nowak",
        "domain": "mostostal-warszawa.pl",
    }
    assert lead.custom == {
        "your-subject": "Zapytanie ofertowe",
        "your-message": "Dzień dobry, prosimy o ofertę dla 12 użytkowników.",
    }
    assert lead.flags == ()


def test_generated_and_prefixed_names() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "b2b_form.json"))
    assert lead.fields == {
        "email": "florian.gruber@alpentech.at",
        "email_domain": "alpentech.at",
        "first_name": "Florian",
        "last_name": "Gruber",
        "phone": "+4315350600",
        "company": "Alpentech Solutions GmbH",
        "domain": "alpentech.at",
        "title": "Leiter Vertrieb",
        "country": "AT",
        "employees": 120,
        "website": "https://www.alpentech.at",
    }
    assert lead.custom["checkbox-interest"] == "Lead routing; Reporting"
    assert lead.custom["acceptance-gdpr"] == "1"
    assert lead.custom["file-brief"].endswith("/brief.pdf")
    assert lead.flags == ()


def test_raw_post_with_cf7_hidden_fields() -> None:
    lead = lead_from(KIND, fixture_record(KIND, "raw_post.form"))
    assert lead.fields == {
        "email": "t.yamada@sakura-seiki.co.jp",
        "email_domain": "sakura-seiki.co.jp",
        "first_name": "山田",
        "last_name": "太郎",
        "phone": "+81332114567",
        "company": "桜精機株式会社",
        "domain": "sakura-seiki.co.jp",
        "country": "JP",
    }
    assert lead.custom["checkbox-789"] == "デモ; 見積もり"
    assert lead.custom["_wpcf7"] == "123"
    assert "g-recaptcha-response" not in lead.custom
    assert lead.flags == ()


def test_name_rules() -> None:
    flat = kind_get(KIND).decode(
        {
            "email-731": "a@b.de",
            "email-732": "c@d.de",
            "tel-office": "+49 30 1234567",
            "text-101": "free text",
            "your-company-name": "Acme",
            "menu-55": ["x"],
        },
        {},
    )
    assert flat == {
        "email": "a@b.de",
        "phone": "+49 30 1234567",
        "company": "Acme",
        "email-732": "c@d.de",
        "text-101": "free text",
        "menu-55": "x",
    }
