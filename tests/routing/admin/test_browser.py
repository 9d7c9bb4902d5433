"""The rule editor in real headless Chromium: RevOps builds a rule with rows, then simulates."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from routing.editor.permissions import revops_group_sync
from routing.models import Rule, RuleSet
from routing.versions import ruleset_new_draft
from tests.routing.factories import make_rep, published_ruleset, team_with

SCREENSHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"


@pytest.mark.browser
@pytest.mark.slow
def test_revops_builds_a_rule_with_rows_and_simulates_it(
    live_server: Any, chromium: str, transactional_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect, sync_playwright

    # The ORM is used between browser steps, while Playwright's loop runs in this thread.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    user = User.objects.create_user("rita", password="pw-rita-123", is_staff=True)
    user.groups.add(revops_group_sync())
    team_with([make_rep(email="ana@x.example", name="Ana")], name="EMEA SDR")
    team_with([make_rep(email="cai@x.example", name="Cai")], name="Enterprise AE")
    live = published_ruleset(
        {"name": "Catch-all", "priority": 1000, "action": {"type": "team", "team": "EMEA SDR"}}
    )
    draft = ruleset_new_draft(ruleset=live)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{live_server.url}/admin/login/")
        page.fill("#id_username", "rita")
        page.fill("#id_password", "pw-rita-123")
        page.click("input[type=submit]")
        page.goto(f"{live_server.url}/admin/routing/rule/add/?ruleset={draft.pk}")
        page.fill("#id_name", "Big DACH")

        editor = page.locator(".condition-editor")
        editor.locator(".cond-add").first.click()
        editor.locator(".cond-add").first.click()
        rows = editor.locator(".cond-row:has(.cond-field)")
        expect(rows).to_have_count(2)
        rows.nth(0).locator(".cond-field").select_option("country")
        rows.nth(0).locator(".cond-op").select_option("in")
        rows.nth(0).locator(".cond-value").fill("DE, AT, CH")
        rows.nth(1).locator(".cond-field").select_option("employees")
        rows.nth(1).locator(".cond-op").select_option("gte")
        rows.nth(1).locator(".cond-value").fill("1000")
        page.select_option("#id_action_type", "team")
        page.select_option("#id_action_team", "Enterprise AE")
        expect(editor.locator(".cond-detached")).to_be_hidden()
        page.screenshot(path=str(SCREENSHOTS / "rule-editor.png"), full_page=True)
        page.click("input[name=_save]")

        expect(page.locator("#rules-group")).to_contain_text(
            "country in DE, AT, CH and employees ≥ 1000"
        )
        rule = Rule.objects.get(ruleset=draft, name="Big DACH")
        assert rule.when == {
            "all": [
                {"field": "country", "op": "in", "value": ["DE", "AT", "CH"]},
                {"field": "employees", "op": "gte", "value": 1000},
            ]
        }
        assert rule.priority < 1000  # added just before the catch-all, where it can decide
        expect(page.locator("#rules-group tbody tr").first).to_contain_text("Big DACH")
        page.locator("#rules-group tr:has-text('Catch-all') .rule-up").click()  # and back
        expect(page.locator("#rules-group tbody tr").first).to_contain_text("Catch-all")
        page.locator("#rules-group tr:has-text('Big DACH') .rule-up").click()
        expect(page.locator("#rules-group tbody tr").first).to_contain_text("Big DACH")
        assert list(draft.rules.order_by("priority").values_list("name", flat=True)) == [
            "Big DACH",
            "Catch-all",
        ]
        page.screenshot(path=str(SCREENSHOTS / "ruleset.png"), full_page=True)

        page.goto(f"{live_server.url}/admin/routing/ruleset/simulate/?draft={draft.version}")
        page.fill("#id_country", "DE")
        page.fill("#id_employees", "5000")
        page.fill("#id_email", "max@firma.de")
        page.click("input[name=_simulate]")
        columns = page.locator(".simulate-column")
        expect(columns).to_have_count(2)
        expect(columns.nth(0).locator(".outcome-team")).to_have_text("Enterprise AE")
        expect(columns.nth(1).locator(".outcome-team")).to_have_text("EMEA SDR")
        page.screenshot(path=str(SCREENSHOTS / "simulate.png"), full_page=True)
        browser.close()
    assert RuleSet.objects.get(pk=draft.pk).status == "draft"


@pytest.mark.browser
@pytest.mark.slow
def test_revops_replays_in_the_background_and_imports_a_csv_with_an_error(
    live_server: Any,
    chromium: str,
    transactional_db: Any,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    eager_tasks: None,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from leads.models import LeadStatus
    from routing.models import AdminJob, Territory
    from tests.leads.factories import LeadFactory
    from tests.routing.factories import AssignmentFactory

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    settings.REPLAY_SYNC_MAX_LEADS = 2  # so that 3 leads run as a background job
    user = User.objects.create_user("rita", password="pw-rita-123", is_staff=True)
    user.groups.add(revops_group_sync())
    ana = make_rep(email="ana@x.example", name="Ana")
    emea = team_with([ana], name="EMEA SDR")
    team_with([make_rep(email="cai@x.example", name="Cai")], name="Enterprise AE")
    live = published_ruleset(
        {"name": "Catch-all", "priority": 1000, "action": {"type": "team", "team": "EMEA SDR"}}
    )
    for i in range(3):
        lead = LeadFactory(
            status=LeadStatus.ASSIGNED, email=f"lead{i}@firma.de", processed_at=timezone.now()
        )
        AssignmentFactory(lead=lead, rep=ana, team=emea, team_name=emea.name)
    draft = ruleset_new_draft(ruleset=live)
    Rule.objects.filter(ruleset=draft).update(action={"type": "team", "team": "Enterprise AE"})
    bad_csv = tmp_path / "territories.csv"
    bad_csv.write_text(
        "territory,country,region,postal_prefix,team,rep\n"
        "DACH,DE,,,EMEA SDR,\n"
        "DACH,AT,,,,nobody@x.example\n"
    )

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{live_server.url}/admin/login/")
        page.fill("#id_username", "rita")
        page.fill("#id_password", "pw-rita-123")
        page.click("input[type=submit]")

        page.goto(f"{live_server.url}/admin/routing/ruleset/{draft.pk}/replay/")
        page.fill("input[name=n]", "3")
        page.click("input[name=run]")
        expect(page).to_have_url(re.compile(r"/admin/routing/adminjob/\d+/progress/$"))
        expect(page.locator("#replay-summary")).to_have_text("3 of 3 leads would change")
        expect(page.locator("#replay-rows")).to_contain_text("lead2@firma.de")
        expect(page.locator("#replay-rows")).to_contain_text("Cai <cai@x.example>")
        assert AdminJob.objects.get().status == "done"

        page.goto(f"{live_server.url}/admin/routing/territory/")
        page.click("text=Import CSV")
        page.set_input_files("input[type=file]", str(bad_csv))
        page.click("input[name=_import]")
        expect(page.locator("#import-errors")).to_have_text(
            re.compile(r"row 3, column rep: .*belongs to team EMEA SDR \(row 2\)")
        )
        browser.close()
    assert not Territory.objects.exists()
