"""Issue 16 in real headless Chromium: try a payload on a source, and empty the refused inbox.

RevOps, only through the admin: open a source, try a nested payload with another kind (nothing
saved), and pick a payload the source received; then fix a source's field map and re-accept what
it refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from leads.models import Lead, RefusedPayload, RefusedState, Source
from tests.leads.conftest import Published, auth
from tests.leads.factories import SourceFactory

VIEWPORT = {"width": 1280, "height": 1000}
PASSWORD = "try-it-before-you-trust-it"

# A HubSpot v1 contact as a contact-based workflow posts it: every value below the top level.
HUBSPOT = {
    "vid": 3234574,
    "portal-id": 62515,
    "properties": {
        "email": {"value": "jana.novak@acme.de"},
        "firstname": {"value": "Jana"},
        "lastname": {"value": "Novák"},
        "company": {"value": "Acme GmbH"},
        "country": {"value": "Germany"},
    },
}
# No key the aliases know, anywhere: the kickoff refuses it until the field map names a path.
UNMAPPED = {"submission": {"answers": {"Buzon": "ana@acme.es", "Nacion": "Spain"}}}


def _browser(p: Any, chromium: str) -> Any:
    return p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])


def _log_in(page: Any, base: str) -> None:
    page.goto(f"{base}/admin/login/")
    page.fill("#id_username", "revops")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")


@pytest.fixture
def revops(django_user_model: Any, transactional_db: Any) -> Any:
    return django_user_model.objects.create_superuser("revops", "revops@example.com", PASSWORD)


def _refused_by_the_intake(source: Source, payload: dict[str, Any]) -> RefusedPayload:
    """The payload posted to the source's intake URL, refused as not a lead into the inbox."""
    response = Client().post(
        f"/api/v1/intake/{source.slug}/",
        json.dumps(payload),
        content_type="application/json",
        **auth(source.slug),
    )
    assert response.status_code == 422, response.content
    return RefusedPayload.objects.get(source=source, state=RefusedState.OPEN)


@pytest.mark.browser
def test_try_a_nested_payload_with_another_kind_before_saving(
    live_server: Any,
    chromium: str,
    revops: Any,
    published: Published,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    source = SourceFactory(slug="landing-pages", name="Landing pages", kind="generic")
    refused = _refused_by_the_intake(source, UNMAPPED)
    base = live_server.url

    with sync_playwright() as p:
        browser = _browser(p, chromium)
        page = browser.new_page(viewport=VIEWPORT)
        _log_in(page, base)
        page.goto(f"{base}/admin/leads/source/{source.pk}/change/")
        page.click("#try-payload-link")
        expect(page.locator("h1")).to_contain_text("Try a payload")
        expect(page.locator("#id_kind")).to_have_value("generic")

        page.fill("#id_payload", json.dumps(HUBSPOT, indent=2))
        page.select_option("#id_kind", "hubspot")
        page.click("#try-submit")
        expect(page.locator("#try-verdict")).to_contain_text("Accepted")
        lead = page.locator("#try-lead")
        expect(lead).to_contain_text('"email": "jana.novak@acme.de"')
        expect(lead).to_contain_text('"country": "DE"')
        expect(page.locator("#try-custom")).to_contain_text("portal-id")
        expect(page.locator("#try-changed")).to_contain_text("kind")
        page.screenshot(path=str(tmp_path / "source_try.png"), full_page=True)

        # A payload the source received (refused): not a lead until the map names its path.
        page.select_option("#id_sample", f"refused:{refused.pk}")
        page.click("#load-sample")
        expect(page.locator("#try-verdict")).to_contain_text("not_a_lead")
        page.fill("#id_field_map", json.dumps({"submission.answers.Buzon": "email"}))
        page.click("#try-submit")
        expect(page.locator("#try-verdict")).to_contain_text("Accepted")
        expect(page.locator("#try-lead")).to_contain_text("ana@acme.es")

        # Bad input is an error on the form, not an error page.
        page.fill("#id_payload", '{"email": ')
        page.click("#try-submit")
        expect(page.locator(".errorlist")).to_contain_text("not valid JSON")
        browser.close()

    source.refresh_from_db()
    assert (source.kind, source.field_map) == ("generic", {})  # nothing was saved
    assert not Lead.objects.filter(source=source).exists()


@pytest.mark.browser
def test_fix_the_field_map_then_reaccept_the_refused_payload(
    live_server: Any,
    chromium: str,
    revops: Any,
    published: Published,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    source = SourceFactory(slug="es-webform", name="Spanish web form")
    refused = _refused_by_the_intake(source, UNMAPPED)
    base = live_server.url

    with sync_playwright() as p:
        browser = _browser(p, chromium)
        page = browser.new_page(viewport=VIEWPORT)
        _log_in(page, base)
        page.goto(f"{base}/admin/leads/refusedpayload/")
        row = page.locator("#result_list tbody tr", has_text="not_a_lead")
        expect(row).to_have_count(1)

        # Re-accepting before the fix keeps it in the inbox, with the reason.
        row.locator("input.action-select").check()
        page.select_option("select[name=action]", "reaccept")
        page.click("button[name=index]")
        expect(page.locator(".messagelist")).to_contain_text("not_a_lead")

        page.goto(f"{base}/admin/leads/source/{source.pk}/change/")
        page.fill("#id_field_map", json.dumps({"submission.answers.Buzon": "email"}))
        page.click("input[name=_save]")
        expect(page.locator(".messagelist")).to_contain_text("was changed successfully")

        page.goto(f"{base}/admin/leads/refusedpayload/")
        page.locator("#result_list tbody tr input.action-select").first.check()
        page.select_option("select[name=action]", "reaccept")
        page.click("button[name=index]")
        expect(page.locator(".messagelist")).to_contain_text("1 payload(s) re-accepted as leads.")
        browser.close()

    refused.refresh_from_db()
    assert refused.state == RefusedState.ACCEPTED
    lead = Lead.objects.get(source=source)
    assert refused.lead_id == lead.pk
    assert lead.raw_payload == UNMAPPED
    assert published == [str(lead.pk)]


@pytest.mark.browser
def test_a_meta_leadgen_notification_is_accepted_to_be_fetched_or_says_what_to_set(
    live_server: Any, chromium: str, revops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.leads.meta_fetch.conftest import notification

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    token = "EAAG-page-token-" + "b" * 40
    source = SourceFactory(
        slug="meta-ads",
        name="Meta Lead Ads",
        kind="meta_lead_ads",
        kind_options={"verify_token": "vt", "page_access_token": token},
    )
    base = live_server.url

    with sync_playwright() as p:
        browser = _browser(p, chromium)
        page = browser.new_page(viewport=VIEWPORT)
        _log_in(page, base)
        page.goto(f"{base}/admin/leads/source/{source.pk}/try/")
        expect(page.locator("#id_kind")).to_have_value("meta_lead_ads")
        assert token not in page.content()  # the saved token is shown masked
        page.fill("#id_payload", json.dumps(notification("1300000000000042", "1300000000000043")))
        page.click("#try-submit")
        verdict = page.locator("#try-verdict")
        expect(verdict).to_contain_text("Accepted")
        expect(verdict).to_contain_text("2 leads")
        expect(verdict).to_contain_text("fetched from the Graph API")
        expect(page.locator("#try-lead")).to_contain_text("1300000000000042")
        assert token not in page.content()

        # Without the token (removed in the form, not saved): refused, saying what to set.
        page.fill("#id_kind_options", json.dumps({"verify_token": "vt"}))
        page.click("#try-submit")
        expect(verdict).to_contain_text("not_a_lead")
        expect(verdict).to_contain_text("page_access_token")
        browser.close()

    source.refresh_from_db()
    assert source.kind_options["page_access_token"] == token  # nothing was saved
