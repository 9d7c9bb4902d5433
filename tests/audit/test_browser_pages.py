"""The manager pages in real headless Chromium: log in, filter, open a lead, reassign, export."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from audit.models import Event, EventType
from audit.permissions import sales_managers_group_sync
from leads.models import Lead, LeadStatus
from routing.decisions import clear_live_config_cache
from routing.models import Assignment
from routing.rules_io import rules_import
from routing.services import lead_process
from tests.leads.factories import LeadFactory
from tests.routing.test_pipeline import RULES

SCREENSHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"


def _log_in(page: Any, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")


@pytest.mark.browser
@pytest.mark.slow
def test_a_sales_manager_filters_opens_reassigns_and_exports(
    live_server: Any, chromium: str, transactional_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    lead = LeadFactory(
        raw_payload={"email": "max@acme.com", "first_name": "Max", "company": "Acme"}
    )
    other = LeadFactory(raw_payload={"email": "eve@globex.com"})
    for each in (lead, other):
        lead_process(lead_id=each.id)
    lead.refresh_from_db()
    assert lead.status == LeadStatus.ASSIGNED
    User.objects.create_user("mia", password="pw-mia-123").groups.add(sales_managers_group_sync())
    User.objects.create_user("olga", password="pw-olga-123")  # no permission
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    base = live_server.url

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        context = browser.new_context(
            viewport={"width": 1300, "height": 900}, accept_downloads=True
        )
        page = context.new_page()
        _log_in(page, base, "mia", "pw-mia-123")
        expect(page.locator("h1")).to_have_text("Assignment history")

        page.fill("#id_q", "acme")
        page.click("#history-filters button[type=submit]")
        rows = page.locator("#history-table tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("max@acme.com")
        expect(rows.first).to_contain_text("Everyone")
        page.screenshot(path=str(SCREENSHOTS / "history.png"), full_page=True)

        rows.first.locator("a.lead-link").click()
        decision = page.locator("#decision .decision li").first
        expect(decision).to_contain_text("Matched rule 'Everyone' (v1)")
        expect(decision).to_contain_text("assigned to Ana")
        expect(page.locator("#owner-name")).to_have_text("Ana")
        page.screenshot(path=str(SCREENSHOTS / "lead.png"), full_page=True)

        page.select_option("#reassign-form select[name=rep]", "ben@example.com")
        page.fill("#reassign-form input[name=reason]", "Ana is at the offsite")
        page.click("#reassign-form button[type=submit]")
        expect(page.locator(".message.success")).to_have_text("Reassigned to Ben.")
        expect(page.locator("#owner-name")).to_have_text("Ben")
        expect(page.locator("#decision .decision li").last).to_contain_text(
            "Reassigned by hand by mia from Ana to Ben: Ana is at the offsite"
        )
        event = Event.objects.get(lead=lead, type=EventType.REASSIGNED)
        assert (event.actor, event.data["reason"]) == ("user:mia", "Ana is at the offsite")
        assert Assignment.objects.get(lead=lead, active=True).rep.email == "ben@example.com"

        page.goto(f"{base}/history/?q=acme")
        with page.expect_download() as download_info:
            page.click("#export")
        download = download_info.value
        assert download.suggested_filename.startswith("lead-history-")
        exported = list(csv.reader(io.StringIO(Path(download.path()).read_text())))
        assert [row[0] for row in exported[1:]] == [str(lead.pk)]
        assert exported[1][exported[0].index("owner")] == "Ben"

        page.set_viewport_size({"width": 390, "height": 844})
        page.goto(f"{base}/history/")
        page.screenshot(path=str(SCREENSHOTS / "history-phone.png"), full_page=True)
        page.goto(f"{base}/dashboard/")
        expect(page.locator("#tile-backlog .value")).to_have_text("0")
        page.screenshot(path=str(SCREENSHOTS / "dashboard-phone.png"), full_page=True)
        page.set_viewport_size({"width": 1300, "height": 900})
        page.reload()
        page.screenshot(path=str(SCREENSHOTS / "dashboard.png"), full_page=True)
        context.close()

        stranger = browser.new_context().new_page()
        _log_in(stranger, base, "olga", "pw-olga-123")
        response = stranger.goto(f"{base}/history/")
        assert response is not None
        assert response.status == 403
        response = stranger.goto(f"{base}/history/{lead.pk}/")
        assert response is not None
        assert response.status == 403
        stranger.screenshot(path=str(SCREENSHOTS / "forbidden.png"))
        browser.close()
    clear_live_config_cache()


@pytest.mark.browser
@pytest.mark.slow
def test_pages_show_times_in_the_browsers_zone_until_the_user_picks_one(
    live_server: Any, chromium: str, transactional_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The browser says Asia/Tokyo (tz.js sets the cookie, one reload); the user then picks
    America/New_York on their settings page, which wins over the browser's."""
    from datetime import UTC, datetime

    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    lead = LeadFactory(raw_payload={"email": "max@acme.com"})
    lead_process(lead_id=lead.id)
    Lead.objects.filter(pk=lead.pk).update(received_at=datetime(2026, 1, 15, 20, 0, tzinfo=UTC))
    User.objects.create_user("mia", password="pw-mia-123").groups.add(sales_managers_group_sync())
    base = live_server.url

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        context = browser.new_context(timezone_id="Asia/Tokyo")
        page = context.new_page()
        _log_in(page, base, "mia", "pw-mia-123")
        expect(page.locator("a.zone")).to_have_text("Times in Asia/Tokyo")
        page.goto(f"{base}/history/{lead.pk}/")
        expect(page.locator("main")).to_contain_text("2026-01-16 05:00:00 JST")
        page.click("a.zone")
        expect(page.locator("#id_time_zone option:checked")).to_have_text(
            "My browser's (Asia/Tokyo)"
        )
        page.select_option("#id_time_zone", "America/New_York")
        page.click("main button[type=submit]")
        expect(page.locator(".message")).to_contain_text("America/New_York")
        page.goto(f"{base}/history/{lead.pk}/")
        expect(page.locator("main")).to_contain_text("2026-01-15 15:00:00 EST")
        expect(page.locator("a.zone")).to_have_text("Times in America/New_York")
        browser.close()
