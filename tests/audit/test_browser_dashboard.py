"""The dashboard's windows in real headless Chromium (issue 22, Tests: "Playwright for the
dashboard windows"): each window from the page's own links, its counts, its export links, and a
crafted window answered 400, in a browser zone that is not the server's."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from audit.permissions import sales_managers_group_sync
from tests.audit.test_browser_pages import _log_in
from tests.leads.factories import LeadFactory

# How long ago each lead came in, and which windows hold it.
AGES = (
    timedelta(minutes=20),
    timedelta(hours=3),
    timedelta(hours=20),
    timedelta(days=3),
    timedelta(days=20),
    timedelta(days=60),
)
WINDOWS = {  # key: (heading, leads received in it)
    "1h": ("1 hour", 1),
    "6h": ("6 hours", 2),
    "24h": ("24 hours", 3),
    "7d": ("7 days", 4),
    "30d": ("30 days", 5),
    "90d": ("90 days", 6),
}


@pytest.mark.browser
@pytest.mark.slow
def test_a_manager_walks_every_window_of_the_dashboard(
    live_server: Any, chromium: str, transactional_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    now = timezone.now()
    for n, age in enumerate(AGES):
        LeadFactory(email=f"w{n}@acme.example", received_at=now - age)
    User.objects.create_user("mia", password="pw-mia-123").groups.add(sales_managers_group_sync())
    base = live_server.url

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        context = browser.new_context(timezone_id="America/New_York")
        page = context.new_page()
        _log_in(page, base, "mia", "pw-mia-123")
        page.goto(f"{base}/dashboard/")
        expect(page.locator("html")).to_have_attribute("data-tz", "America/New_York")
        for key, (label, received) in WINDOWS.items():
            page.locator("#windows a", has_text=key).first.click()
            page.wait_for_url(f"**/dashboard/?*window={key}*")
            expect(page.locator("#windows a[aria-current=true]")).to_have_text(key)
            expect(page.locator("#rates h2")).to_have_text(f"Last {label}")
            expect(page.locator("#outcome-received")).to_have_text(str(received))
            chart = page.locator("#rates svg").first
            expect(chart).to_have_attribute(
                "aria-label",
                f"{chart.get_attribute('aria-label').split(':')[0]}: {received} in total",
            )
            for table in ("teams", "reps", "fairness"):
                href = page.locator(f"#export-{table}").get_attribute("href") or ""
                assert f"window={key}" in href, (table, href)
        for crafted in ("13d", "90d%00", "%27%3B--", "1" * 200):
            answer = page.goto(f"{base}/dashboard/?window={crafted}")
            assert answer is not None
            assert answer.status == 400, crafted
            body = json.loads(page.locator("body").inner_text())
            assert "window" in json.dumps(body)
        answer = page.goto(f"{base}/dashboard/?window=90d&bucket=1m&sort=-sla&page=999999")
        assert answer is not None
        assert answer.status == 200  # a bucket too fine is clamped, a page past the end too
        expect(page.locator("#rates h2")).to_have_text("Last 90 days")
        browser.close()
