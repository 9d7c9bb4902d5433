"""The rep's own page and the one-click link in real headless Chromium."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.core import mail
from django.utils import timezone

from audit.models import Event, EventType
from routing.models import Assignment
from routing.rep_access import rep_invite
from routing.timeoff.models import RepAbsence
from routing.touch_links import touch_link_url
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, RepFactory

SCREENSHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"


@pytest.mark.browser
@pytest.mark.slow
def test_an_invited_rep_sets_a_password_sees_their_leads_touches_one_and_plans_time_off(
    live_server: Any, chromium: str, transactional_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    ana = RepFactory(name="Ana", email="ana@example.com", timezone="Europe/Berlin")
    ben = RepFactory(name="Ben", email="ben@example.com")
    now = timezone.now()
    first = AssignmentFactory(
        rep=ana,
        lead=LeadFactory(email="max@acme.example", first_name="Max", company="Acme"),
        sla_due_at=now + timedelta(minutes=25),
    )
    late = AssignmentFactory(
        rep=ana,
        lead=LeadFactory(email="eve@globex.example", first_name="Eve"),
        sla_due_at=now - timedelta(minutes=5),
    )
    AssignmentFactory(rep=ben, lead=LeadFactory(email="bens@initech.example"))
    link = rep_invite(rep_id=ana.pk, actor="user:revops")
    path = urlsplit(link).path
    assert len(mail.outbox) == 1
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    base = live_server.url

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(base + path)
        page.fill("#id_new_password1", "a-Long-pass-4-ana")
        page.fill("#id_new_password2", "a-Long-pass-4-ana")
        page.click("#set-password-form button[type=submit]")
        expect(page.locator("#set-password-done")).to_be_visible()
        page.click("#set-password-done a")
        page.fill("#id_username", "ana@example.com")
        page.fill("#id_password", "a-Long-pass-4-ana")
        page.click("button[type=submit]")
        expect(page.locator("h1")).to_have_text("My leads")
        rows = page.locator("#waiting-table tbody tr")
        expect(rows).to_have_count(2)
        # Soonest SLA first: the overdue one; the script counts down.
        expect(rows.nth(0)).to_contain_text("eve@globex.example")
        expect(rows.nth(0).locator(".countdown")).to_contain_text("overdue by")
        expect(rows.nth(1).locator(".countdown")).to_contain_text("due in")
        expect(page.locator("body")).not_to_contain_text("initech")
        page.screenshot(path=str(SCREENSHOTS / "rep-page.png"), full_page=True)

        rows.nth(1).locator("button.touch").click()
        expect(page.locator(".message.success")).to_have_text("First touch recorded.")
        expect(page.locator("#waiting-table tbody tr")).to_have_count(1)
        expect(page.locator("#touched-table tbody tr")).to_contain_text("Max")
        assert Assignment.objects.get(pk=first.pk).touched_at is not None

        year = now.year + 1
        page.fill("#id_starts_at", f"{year}-07-06T09:00")
        page.fill("#id_ends_at", f"{year}-07-10T18:00")
        page.fill("#id_note", "Sailing")
        page.click("#absence-form button[type=submit]")
        expect(page.locator("#absences-table")).to_contain_text("Sailing")
        assert RepAbsence.objects.filter(rep=ana, note="Sailing").count() == 1

        # The one-click link of the other lead, opened with no login (a fresh context).
        one_click = touch_link_url(assignment_id=late.pk, rep_id=ana.pk)
        anonymous = browser.new_context().new_page()
        anonymous.goto(base + one_click)
        expect(anonymous.locator("h1")).to_have_text("Eve")
        anonymous.click("#touch-confirm")
        expect(anonymous.locator("#touch-state")).to_contain_text("First touch recorded")
        anonymous.screenshot(path=str(SCREENSHOTS / "one-click.png"), full_page=True)
        anonymous.goto(base + one_click)
        expect(anonymous.locator("#touch-state")).to_contain_text("already used")
        browser.close()

    touch = Event.objects.get(lead=late.lead, type=EventType.TOUCHED)
    assert touch.actor == "rep:ana@example.com (one-click link)"
