"""Single sign-on in real headless Chromium, through the stand-in OpenID Connect provider."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.utils import timezone
from pytest_httpserver import HTTPServer

from audit.sso import discovery_cache_key
from tests.audit.test_browser_rep import SCREENSHOTS
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, RepFactory
from tests.support.oidc_provider import CLIENT_ID, CLIENT_SECRET, OidcProvider


@pytest.fixture
def provider_server() -> Iterator[HTTPServer]:
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    try:
        yield server
    finally:
        server.clear()
        server.stop()


@pytest.mark.browser
@pytest.mark.slow
def test_a_rep_signs_in_with_the_provider_and_sees_their_leads(
    live_server: Any,
    chromium: str,
    transactional_db: Any,
    provider_server: HTTPServer,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    base = live_server.url
    provider = OidcProvider(provider_server, redirect_uris=[base + "/accounts/sso/callback/"])
    settings.SSO_ENABLED = True
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_OP_ISSUER = provider.issuer
    settings.OIDC_PROVIDER_NAME = "Standin ID"
    cache.delete(discovery_cache_key(provider.issuer))
    ana = RepFactory(name="Ana", email="ana@example.com")
    AssignmentFactory(
        rep=ana,
        lead=LeadFactory(email="max@acme.example", first_name="Max"),
        sla_due_at=timezone.now() + timedelta(minutes=20),
    )
    provider.person("ana@example.com")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(base + "/me/")
        expect(page.locator("#sso-login")).to_have_text("Sign in with Standin ID")
        expect(page.locator("#id_password")).to_be_visible()
        page.screenshot(path=str(SCREENSHOTS / "login-sso.png"), full_page=True)
        page.click("#sso-login")
        page.wait_for_url(base + "/me/")
        expect(page.locator("h1")).to_have_text("My leads")
        expect(page.locator("#waiting-table tbody tr")).to_contain_text("max@acme.example")

        # A stranger at the provider is refused with a page of its own.
        provider.person("stranger@example.com")
        other = browser.new_context().new_page()
        other.goto(base + "/accounts/login/")
        other.click("#sso-login")
        expect(other.locator("#sso-refused")).to_have_text("Not signed in")
        expect(other.locator("#sso-reason")).to_contain_text("stranger@example.com has no")
        browser.close()

    ana.refresh_from_db()
    assert ana.user is not None
    assert ana.user.username == "ana@example.com"
