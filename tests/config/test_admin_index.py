"""Issue 23, item 3: RevOps lands on /admin/ and finds the routing tools above the model lists."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

PASSWORD = "find-the-tools-first"


@pytest.fixture
def revops(django_user_model: Any, transactional_db: Any) -> Any:
    return django_user_model.objects.create_superuser("revops", "revops@example.com", PASSWORD)


@pytest.mark.browser
def test_admin_index_links_the_routing_tools_above_the_model_lists(
    live_server: Any, chromium: str, revops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    base = live_server.url
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"{base}/admin/login/")
            page.fill("#id_username", "revops")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(f"{base}/admin/")

            tools = page.locator("#routing-tools")
            expect(tools).to_be_visible()
            links = {
                "Simulate a lead": reverse("admin:routing_ruleset_simulate"),
                "Replay a draft": reverse("admin:routing_ruleset_changelist")
                + "?status__exact=draft",
                "Compare versions": reverse("admin:routing_ruleset_diff"),
                "Refused inbox": reverse("admin:leads_refusedpayload_changelist")
                + "?state__exact=open",
            }
            for text, href in links.items():
                link = tools.get_by_role("link", name=text)
                expect(link).to_have_attribute("href", href)

            # Above the model lists: the tools box comes first in the page's flow.
            tools_top = tools.bounding_box()
            first_app = page.locator("#content-main div[class^='app-']").first
            assert tools_top is not None
            first_app_box = first_app.bounding_box()
            assert first_app_box is not None
            assert tools_top["y"] < first_app_box["y"]

            # Each link opens its page (no 404, no 500): the tool is one click away.
            for text in links:
                page.goto(f"{base}/admin/")
                with page.expect_navigation():
                    page.locator("#routing-tools").get_by_role("link", name=text).click()
                assert page.locator("#content h1").count() == 1, text
                assert "Server Error" not in page.content(), text
                assert "Page not found" not in page.content(), text
        finally:
            browser.close()


@pytest.mark.django_db
def test_the_tools_box_is_not_shown_to_a_user_who_cannot_see_rulesets(
    client: Any, django_user_model: Any
) -> None:
    staff = django_user_model.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    client.force_login(staff)
    page = client.get("/admin/")
    assert page.status_code == 200
    assert b'id="routing-tools"' not in page.content
