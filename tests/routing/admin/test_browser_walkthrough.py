"""The RevOps walkthrough of docs/revops.md and the manager pages, in real headless Chromium.

Both start from the demo company (``seed_demo``) with a few hundred demo leads that really went
through intake and routing: a steady trickle over the last half hour and a webinar spike a few
minutes ago, with the clock set to each moment so that every timestamp (and audit event) is where
the dashboard expects it. Then RevOps, only through the admin, start a draft, add a rule with two
conditions, meet a bad regular expression, move the rule up, compare, simulate, replay, run the
saved test cases, publish and roll back; a sales manager looks at the dashboard, the history and
a lead.

The screenshots go to ``var/screenshots/``; with ``UPDATE_DOCS_SCREENSHOTS=1`` to ``docs/img/``,
where the documentation embeds them.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.utils import timezone

from audit.models import Event, EventType
from leads.models import Lead, LeadStatus, Source
from leads.parsing import IntakeError
from routing.demo.traffic import LeadMaker
from routing.models import Rule, RuleSet, RuleSetStatus

VIEWPORT = {"width": 1280, "height": 900}
NEW_RULE = "DACH to Enterprise AE"


def _screenshots() -> Path:
    base = Path(django_settings.BASE_DIR)
    folder = (
        base / "docs" / "img"
        if os.environ.get("UPDATE_DOCS_SCREENSHOTS") == "1"
        else base / "var" / "screenshots"
    )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class _Clock:
    """``timezone.now`` replaced by a clock the test sets, so that services stamp that moment."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


@dataclass
class Traffic:
    passwords: dict[str, str]
    leads: int  # accepted and routed
    spike: int  # of which in the spike


def _demo_with_traffic(
    monkeypatch: pytest.MonkeyPatch, settings: Any, tmp_path: Path, *, trickle: int, spike: int
) -> Traffic:
    """The demo company, seeded 40 minutes ago, and demo leads received and routed since.

    ``trickle`` leads arrive evenly from 30 to 2 minutes ago, ``spike`` leads within one minute
    from 9 minutes ago (a webinar's attendee list). One worker routes about 1.5 leads a second,
    so during the spike a backlog builds up and time to assign grows, as it would.
    """
    settings.VAR_DIR = tmp_path
    now = timezone.now()
    rng = random.Random(7)  # demo timing, not a secret
    first = now - timedelta(minutes=30)
    arrivals = [first + timedelta(minutes=28) * i / trickle for i in range(trickle)]
    spike_start = now - timedelta(minutes=9)
    arrivals += [spike_start + timedelta(seconds=rng.uniform(0, 60)) for _ in range(spike)]
    arrivals.sort()
    with monkeypatch.context() as patch:
        clock = _Clock(now - timedelta(minutes=40))
        patch.setattr(timezone, "now", clock)
        # The test routes each lead itself, at its moment: no message to a broker.
        patch.setattr(
            "leads.services.leads_enqueue_after_commit", lambda ids, lane=None, high=None: None
        )
        call_command("seed_demo", stdout=open(os.devnull, "w"))  # noqa: SIM115
        state = json.loads((tmp_path / "demo.json").read_text())
        sources = {source.slug: source for source in Source.objects.all()}
        maker = LeadMaker(seed=11)
        worker_free = arrivals[0]
        accepted = in_spike = 0
        due: list[tuple[datetime, Any]] = []
        for arrival in arrivals:
            # Route every lead whose turn came before this arrival.
            while due and due[0][0] <= arrival:
                clock.at, lead_id = due.pop(0)
                _route(lead_id)
            made = maker.make()
            clock.at = arrival
            try:
                lead_id = _ingest(sources[made.source], made.payload)
            except IntakeError:
                continue  # the demo's "rejected" leads: intake refuses them
            accepted += 1
            in_spike += arrival >= spike_start
            worker_free = max(worker_free, arrival) + timedelta(seconds=rng.uniform(0.4, 0.9))
            due.append((worker_free, lead_id))
        for at, lead_id in due:
            clock.at = at
            _route(lead_id)
    return Traffic(passwords=state["passwords"], leads=accepted, spike=in_spike)


def _ingest(source: Source, payload: dict[str, Any]) -> Any:
    from leads.services import lead_ingest

    return lead_ingest(source=source, record=payload).lead_id


def _route(lead_id: Any) -> None:
    from routing.services import lead_process

    lead_process(lead_id=lead_id)


def _browser(p: Any, chromium: str) -> Any:
    return p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])


@pytest.mark.browser
@pytest.mark.slow
def test_revops_walkthrough_from_the_admin_alone(
    live_server: Any,
    chromium: str,
    transactional_db: Any,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from routing.versions import ruleset_replay

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    traffic = _demo_with_traffic(monkeypatch, settings, tmp_path, trickle=60, spike=160)
    assert traffic.leads > 200
    assert not Lead.objects.filter(status__in=(LeadStatus.RECEIVED, LeadStatus.FAILED)).exists()
    live = RuleSet.objects.get(status=RuleSetStatus.PUBLISHED)
    shots = _screenshots()
    base = live_server.url

    with sync_playwright() as p:
        browser = _browser(p, chromium)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(f"{base}/admin/login/")
        page.fill("#id_username", "revops")
        page.fill("#id_password", traffic.passwords["revops"])
        page.click("input[type=submit]")

        # 1. A new draft from the published version.
        page.goto(f"{base}/admin/routing/ruleset/")
        page.click("#toggle-nav-sidebar")  # more room for the pages (the admin remembers it)
        page.click("#new-draft-from-published")
        expect(page.locator(".messagelist")).to_contain_text("Draft version")
        draft = RuleSet.objects.get(status=RuleSetStatus.DRAFT)
        assert draft.version == live.version + 1
        assert draft.rules.count() == live.rules.count()

        # 2. A rule with two conditions, built with the rows.
        page.click("#add-rule")
        page.fill("#id_name", NEW_RULE)
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
        rows.nth(1).locator(".cond-value").fill("30")
        page.select_option("#id_action_type", "team")
        page.select_option("#id_action_team", "Enterprise AE")
        page.screenshot(path=str(shots / "rule-editor.png"), full_page=True)

        # 3. A third condition with a bad regular expression: refused, said on its row.
        editor.locator(".cond-add").first.click()
        expect(rows).to_have_count(3)
        rows.nth(2).locator(".cond-field").select_option("company")
        rows.nth(2).locator(".cond-op").select_option("matches")
        rows.nth(2).locator(".cond-value").fill("([a-z")
        page.click("input[name=_save]")
        expect(page.locator(".errornote").first).to_be_visible()
        rows = page.locator(".condition-editor .cond-row:has(.cond-field)")
        expect(rows).to_have_count(3)
        expect(rows.nth(2).locator(".cond-error")).to_contain_text("bad regular expression")
        expect(rows.nth(0).locator(".cond-error")).to_have_count(0)
        assert not Rule.objects.filter(ruleset=draft, name=NEW_RULE).exists()
        page.screenshot(path=str(shots / "rule-editor-error.png"), full_page=True)
        rows.nth(2).locator(".cond-remove").click()
        expect(rows).to_have_count(2)
        page.click("input[name=_save]")

        # 4. The ruleset in words; the new rule moved up to run before the territories.
        group = page.locator("#rules-group")
        expect(group).to_contain_text("country in DE, AT, CH and employees ≥ 30")
        rule = Rule.objects.get(ruleset=draft, name=NEW_RULE)
        assert rule.when == {
            "all": [
                {"field": "country", "op": "in", "value": ["DE", "AT", "CH"]},
                {"field": "employees", "op": "gte", "value": 30},
            ]
        }
        assert rule.action == {"type": "team", "team": "Enterprise AE"}
        for _ in range(2):  # added before Catch-all; past By territory and Free-mail to Inbound
            group.locator(f"tr:has-text('{NEW_RULE}') .rule-up").click()
            page.wait_for_load_state()
        names = list(draft.rules.order_by("priority").values_list("name", flat=True))
        assert names[-4:] == [NEW_RULE, "Free-mail to Inbound", "By territory", "Catch-all"]
        expect(group.locator("tbody tr").nth(len(names) - 4)).to_contain_text(NEW_RULE)
        page.screenshot(path=str(shots / "ruleset.png"), full_page=True)

        # 5. What changed against the published version.
        page.click("text=Compare")
        expect(page.locator(".diff-added")).to_contain_text(NEW_RULE)
        expect(page.locator(".diff-reordered")).to_have_count(0)
        page.screenshot(path=str(shots / "diff.png"), full_page=True)
        page.go_back()

        # 6. Simulate: a 250-person Munich company, draft and published side by side.
        page.click("#content-main .object-tools >> text=Simulate")
        page.fill("#id_email", "jonas.weber@alpenbau.de")
        page.fill("#id_company", "Alpenbau")
        page.fill("#id_country", "DE")
        page.fill("#id_postal_code", "80331")
        page.fill("#id_employees", "250")
        page.click("input[name=_simulate]")
        columns = page.locator(".simulate-column")
        expect(columns).to_have_count(2)
        expect(columns.nth(0).locator("h2")).to_contain_text(f"v{draft.version}")
        expect(columns.nth(0).locator(".outcome-team")).to_have_text("Enterprise AE")
        expect(columns.nth(0).locator(".outcome-rule")).to_have_text(NEW_RULE)
        expect(columns.nth(1).locator(".outcome-team")).to_have_text("SDR EMEA")
        expect(columns.nth(1).locator(".outcome-rule")).to_have_text("By territory")
        page.screenshot(path=str(shots / "simulate.png"), full_page=True)
        page.go_back()
        page.go_back()

        # 7. Replay the routed leads with the draft: the changed leads and per-rep counts.
        expected = ruleset_replay(ruleset=draft, limit=500)
        routed = Lead.objects.filter(status__in=("assigned", "excluded", "unassigned"))
        assert expected.considered == routed.count()  # duplicates are not replayed
        assert 0 < expected.changed < expected.considered
        page.click("#content-main .object-tools >> text=Replay")
        page.click("input[name=run]")
        expect(page.locator("#replay-summary")).to_have_text(
            f"{expected.changed} of {expected.considered} leads would change"
        )
        changed_rows = page.locator("#replay-rows tbody tr")
        expect(changed_rows).to_have_count(expected.changed)
        expect(changed_rows.first).to_contain_text("Enterprise AE")
        per_rep = page.locator("#replay-per-rep tbody tr")
        expect(per_rep.first).to_contain_text(expected.per_rep[0][0])
        expect(per_rep.first).to_contain_text(expected.per_rep[0][3])
        # The summary, the per-rep table and the first changed leads (the list is long).
        page.screenshot(
            path=str(shots / "replay.png"),
            full_page=True,
            clip={"x": 0, "y": 0, "width": VIEWPORT["width"], "height": 1500},
        )
        page.go_back()
        page.go_back()

        # 8. The saved test cases: the German 40-person case now goes to Enterprise AE.
        page.click("#content-main .object-tools >> text=Run tests")
        expect(page.locator("#tests-summary")).to_have_text("1 of 9 failing")
        expect(page.locator("#test-results .case-fail")).to_contain_text(
            "German lead goes to SDR EMEA"
        )
        page.screenshot(path=str(shots / "tests.png"), full_page=True)
        page.go_back()

        # 9. Publish with a note; the failing case needs the tick.
        page.click("#publish-link")
        expect(page.locator(".diff-added")).to_contain_text(NEW_RULE)
        page.fill("#id_note", "DACH companies with 30+ employees go to Enterprise AE.")
        page.screenshot(path=str(shots / "publish.png"), full_page=True)
        page.click("input[name=_publish]")
        expect(page.locator("#publish-error")).to_contain_text("Tick the box")
        assert RuleSet.objects.get(pk=draft.pk).status == RuleSetStatus.DRAFT
        page.fill("#id_note", "DACH companies with 30+ employees go to Enterprise AE.")
        page.check("#id_confirm_failing")
        page.click("input[name=_publish]")
        expect(page.locator(".messagelist")).to_contain_text(f"Version {draft.version} is live")
        draft.refresh_from_db()
        assert draft.status == RuleSetStatus.PUBLISHED
        assert draft.published_by is not None
        assert draft.published_by.username == "revops"
        assert RuleSet.objects.get(pk=live.pk).status == RuleSetStatus.ARCHIVED
        published = Event.objects.get(type=EventType.RULES_PUBLISHED, ruleset_version=draft.version)
        assert published.actor == "user:revops"
        assert published.data["replaced_version"] == live.version

        # 10. Roll back to the version before, from the version list.
        page.goto(f"{base}/admin/routing/ruleset/")
        page.click(f"#result_list a:text-is('{live.version}')")
        page.click("#rollback-link")
        expect(page.locator(".diff-removed")).to_contain_text(NEW_RULE)
        page.fill("#id_note", "Enterprise AE are at their caps: back to the territories.")
        page.click("input[name=_rollback]")
        expect(page.locator(".messagelist")).to_contain_text(
            f"Version {live.version} is live again, as version {draft.version + 1}."
        )
        page.goto(f"{base}/admin/routing/ruleset/")
        statuses = page.locator("#result_list tbody tr")
        expect(statuses.first).to_contain_text("Published")
        expect(statuses.first).to_contain_text("back to the territories")
        expect(statuses.nth(1)).to_contain_text("DACH companies with 30+ employees")
        page.screenshot(path=str(shots / "versions.png"), full_page=True)
        browser.close()

    current = RuleSet.objects.get(status=RuleSetStatus.PUBLISHED)
    assert current.version == draft.version + 1
    assert list(current.rules.order_by("priority").values_list("name", "when", "action")) == list(
        live.rules.order_by("priority").values_list("name", "when", "action")
    )
    assert RuleSet.objects.get(pk=draft.pk).status == RuleSetStatus.ARCHIVED
    rolled_back = Event.objects.get(type=EventType.RULES_PUBLISHED, ruleset_version=current.version)
    assert rolled_back.actor == "user:revops"


@pytest.mark.browser
@pytest.mark.slow
def test_a_manager_sees_the_spike_on_the_dashboard_history_and_a_lead(
    live_server: Any,
    chromium: str,
    transactional_db: Any,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    traffic = _demo_with_traffic(monkeypatch, settings, tmp_path, trickle=60, spike=160)
    shots = _screenshots()
    base = live_server.url
    assert Lead.objects.filter(status=LeadStatus.ASSIGNED).count() > 150

    with sync_playwright() as p:
        browser = _browser(p, chromium)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(f"{base}/accounts/login/")
        page.fill("#id_username", "manager")
        page.fill("#id_password", traffic.passwords["manager"])
        page.click("button[type=submit]")
        expect(page.locator("h1")).to_have_text("Assignment history")

        page.goto(f"{base}/dashboard/?hours=1")
        expect(page.locator("#tile-backlog .value")).to_have_text("0")
        page.screenshot(path=str(shots / "dashboard.png"), full_page=True)

        page.goto(f"{base}/history/")
        rows = page.locator("#history-table tbody tr")
        expect(rows).to_have_count(50)
        page.screenshot(path=str(shots / "history.png"))

        page.select_option("#id_team", label="SDR EMEA")
        page.click("#history-filters button[type=submit]")
        expect(rows.first).to_contain_text("SDR EMEA")
        rows.first.locator("a.lead-link").click()
        expect(page.locator("#owner-name")).to_be_visible()
        expect(page.locator("#decision .decision li").first).to_contain_text("Matched rule")
        assert re.search(r"/history/[0-9a-f-]+/$", page.url)
        page.screenshot(path=str(shots / "lead.png"), full_page=True)
        browser.close()
