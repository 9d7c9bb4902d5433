"""A draft's own admin pages beside edit and import: its check (the saved test cases against its
whole configuration, pass or fail with the trace; recent leads replayed against it, each changed
lead in words; many leads as a background job with progress) and its rebase on the published
configuration (conflicts row by row, nothing half-applied). Permission-gated like the other
draft pages."""

from __future__ import annotations

from datetime import timedelta
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from leads.models import LeadStatus
from routing.admin_jobs import admin_job_run, admin_job_start_draft_replay
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigDraft
from routing.drafts.services import (
    config_draft_create,
    config_draft_patch,
    config_draft_publish,
)
from routing.editor.permissions import revops_group_sync
from routing.models import AdminJob, AdminJobKind, Rep, Team
from routing.rules_io import rules_import
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory

pytestmark = pytest.mark.django_db

CONFIG: dict[str, Any] = {
    "reps": [
        {"email": "ana@example.com", "name": "Ana", "timezone": "Europe/Berlin"},
        {"email": "bo@example.com", "name": "Bo", "timezone": "Europe/Berlin"},
    ],
    "teams": [
        {"name": "EMEA SDR", "strategy": "round_robin", "members": [{"rep": "ana@example.com"}]},
        {"name": "DACH AE", "strategy": "round_robin", "members": [{"rep": "bo@example.com"}]},
    ],
    "territories": [{"name": "Bavaria", "countries": ["DE"], "team": "EMEA SDR"}],
    "value_lists": [],
    "ruleset": {
        "name": "Inbound",
        "rules": [{"name": "By territory", "priority": 10, "action": {"type": "territory"}}],
    },
    "test_cases": [
        {
            "name": "A German lead goes to EMEA SDR",
            "lead": {"email": "x@firma.de", "country": "DE"},
            "expected_status": "assigned",
            "expected_team": "EMEA SDR",
        }
    ],
}
MOVE_BAVARIA = {"territories": {"Bavaria": {"countries": ["DE"], "team": "DACH AE"}}}


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def rita() -> Any:
    clear_live_config_cache()
    rules_import(CONFIG, publish=True)
    user = User.objects.create_user("rita", password="pw", is_staff=True)
    user.groups.add(revops_group_sync())
    yield _client(user)
    clear_live_config_cache()


def processed_leads(count: int) -> None:
    """``count`` German leads Ana owns, processed a second apart (the newest last)."""
    ana, team = Rep.objects.get(email="ana@example.com"), Team.objects.get(name="EMEA SDR")
    for i in range(count):
        lead = LeadFactory(
            status=LeadStatus.ASSIGNED,
            country="DE",
            email=f"lead{i}@firma.de",
            processed_at=timezone.now() - timedelta(seconds=count - i),
        )
        AssignmentFactory(lead=lead, rep=ana, team=team, team_name=team.name)


def _moved(actor: str = "user:rita") -> ConfigDraft:
    draft = config_draft_create(actor=actor)
    config_draft_patch(draft_id=draft.pk, changes=MOVE_BAVARIA, actor=actor)
    return draft


def _text(response: Any) -> str:
    return unescape(response.content.decode())


def test_the_test_cases_run_against_the_draft_with_pass_or_fail_and_the_trace(rita: Any) -> None:
    draft = _moved()
    url = reverse("admin:routing_configdraft_check", args=[draft.pk])
    page = rita.get(url)
    assert page.status_code == 200
    assert 'id="run-tests"' in page.content.decode()
    ran = _text(rita.post(url, {"tests": "Run the test cases", "n": "10"}))
    assert "1 of 1 test cases failing" in ran
    assert "team is DACH AE, expected EMEA SDR" in ran
    assert "Bavaria" in ran  # the trace, in words
    assert 'id="replay-summary"' not in ran  # test cases only
    change = _text(rita.get(reverse("admin:routing_configdraft_change", args=[draft.pk])))
    assert 'id="draft-check"' in change
    assert 'id="draft-rebase"' in change


def test_a_small_replay_lists_each_changed_lead_in_words(rita: Any) -> None:
    processed_leads(3)
    draft = _moved()
    ran = _text(
        rita.post(
            reverse("admin:routing_configdraft_check", args=[draft.pk]),
            {"replay": "Replay", "n": "3"},
        )
    )
    assert "3 of 3 leads would change" in ran
    assert (
        'lead lead2@firma.de: Ana → Bo because Territory "Bavaria": team EMEA SDR → DACH AE' in ran
    )
    assert AdminJob.objects.count() == 0  # ran on the page


def test_a_large_replay_runs_as_a_background_job_and_shows_the_words_when_done(
    rita: Any, settings: Any, django_capture_on_commit_callbacks: Any, eager_tasks: Any
) -> None:
    settings.REPLAY_SYNC_MAX_LEADS = 2
    processed_leads(4)
    draft = _moved()
    with django_capture_on_commit_callbacks(execute=False) as queued:
        started = rita.post(
            reverse("admin:routing_configdraft_check", args=[draft.pk]),
            {"replay": "Replay", "n": "4"},
        )
    job = AdminJob.objects.get()
    assert started.status_code == 302
    assert started["Location"] == reverse("admin:routing_adminjob_progress", args=[job.pk])
    assert (job.kind, job.params) == (AdminJobKind.DRAFT_REPLAY, {"draft_id": draft.pk, "limit": 4})
    assert "Queued" in _text(rita.get(started["Location"]))
    (enqueue,) = queued
    enqueue()  # after the commit: maintenance.admin_job, run here (eager)
    job.refresh_from_db()
    assert (job.status, job.progress_done, job.progress_total) == ("done", 4, 4)
    done = _text(rita.get(started["Location"]))
    assert "4 of 4 leads would change" in done
    assert 'lead lead0@firma.de: Ana → Bo because Territory "Bavaria"' in done
    assert "1 of 1 test cases failing" in done
    listed = _text(rita.get(reverse("admin:routing_configdraft_check", args=[draft.pk])))
    assert f"#{job.pk}</a>: 4 leads, done" in listed


def test_a_rebase_lists_each_conflicting_row_in_words_and_writes_nothing(rita: Any) -> None:
    mine = _moved()
    theirs = config_draft_create(actor="user:sam")
    config_draft_patch(
        draft_id=theirs.pk,
        changes={"territories": {"Bavaria": {"countries": ["DE", "AT"], "team": "EMEA SDR"}}},
        actor="user:sam",
    )
    config_draft_publish(draft_id=theirs.pk, actor="user:sam")
    before = ConfigDraft.objects.get(pk=mine.pk)
    url = reverse("admin:routing_configdraft_rebase", args=[mine.pk])
    shown = _text(rita.get(url))
    assert 'Territory "Bavaria": countries DE → DE, AT' in shown  # published since
    refused = _text(rita.post(url, {"_rebase": "Rebase the draft"}))
    assert "Not rebased: the draft is unchanged." in refused
    assert (
        'Territory "Bavaria" was changed both in the draft (team EMEA SDR → DACH AE) and in the '
        "published configuration (countries DE → DE, AT)" in refused
    )
    after = ConfigDraft.objects.get(pk=mine.pk)
    assert (after.document, after.base_digest, after.base_number) == (
        before.document,
        before.base_digest,
        before.base_number,
    )


def test_a_rebase_without_conflict_applies_the_drafts_rows_on_the_published_ones(
    rita: Any,
) -> None:
    mine = _moved()
    theirs = config_draft_create(actor="user:sam")
    config_draft_patch(
        draft_id=theirs.pk,
        changes={"value_lists": {"competitors": {"values": ["rival.io"]}}},
        actor="user:sam",
    )
    config_draft_publish(draft_id=theirs.pk, actor="user:sam")
    url = reverse("admin:routing_configdraft_rebase", args=[mine.pk])
    done = rita.post(url, {"_rebase": "Rebase the draft"}, follow=True)
    assert "rebased: it now begins from configuration version 2" in _text(done)
    rebased = ConfigDraft.objects.get(pk=mine.pk)
    assert rebased.document["value_lists"] == [{"name": "competitors", "values": ["rival.io"]}]
    assert rebased.document["territories"][0]["team"] == "DACH AE"
    assert 'id="not-stale"' in rita.get(url).content.decode()


def test_checking_and_rebasing_need_the_permission_to_change_drafts(rita: Any) -> None:
    draft = _moved()
    viewer = User.objects.create_user("vic", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_configdraft"))
    client = _client(viewer)
    for name in ("routing_configdraft_check", "routing_configdraft_rebase"):
        url = reverse(f"admin:{name}", args=[draft.pk])
        assert client.get(url).status_code == 403
        assert client.post(url, {"replay": "Replay", "n": "1", "_rebase": "x"}).status_code == 403
    assert AdminJob.objects.count() == 0
    job = admin_job_start_draft_replay(draft=draft, limit=600)
    progress = reverse("admin:routing_adminjob_progress", args=[job.pk])
    assert client.get(progress).status_code == 403
    assert rita.get(progress).status_code == 200


@pytest.mark.browser
@pytest.mark.slow
def test_a_draft_is_checked_replayed_and_rebased_in_the_browser(
    live_server: Any,
    chromium: str,
    transactional_db: Any,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    settings.REPLAY_SYNC_MAX_LEADS = 3
    clear_live_config_cache()
    rules_import(CONFIG, publish=True)
    user = User.objects.create_user("rita", password="pw-rita-123", is_staff=True)
    user.groups.add(revops_group_sync())
    processed_leads(5)
    draft = _moved()
    base = live_server.url

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/admin/login/")
        page.fill("#id_username", "rita")
        page.fill("#id_password", "pw-rita-123")
        page.click("input[type=submit]")

        page.goto(f"{base}/admin/routing/configdraft/{draft.pk}/change/")
        page.click("#draft-check")
        page.click("#run-tests")
        expect(page.locator("#tests-summary")).to_have_text("1 of 1 test cases failing")
        failing = page.locator("#test-results tr.case-fail")
        expect(failing).to_contain_text("team is DACH AE, expected EMEA SDR")
        expect(failing.locator(".trace")).to_contain_text("Bavaria")

        page.fill("#replay-n", "3")
        page.click("#run-replay")
        expect(page.locator("#replay-summary")).to_have_text("3 of 3 leads would change")
        expect(page.locator("#replay-words")).to_contain_text(
            'lead lead4@firma.de: Ana → Bo because Territory "Bavaria": team EMEA SDR → DACH AE'
        )

        page.fill("#replay-n", "5")
        page.click("#run-replay")
        expect(page.locator("#job-status")).to_have_attribute("data-status", "queued")
        job = AdminJob.objects.get(kind=AdminJobKind.DRAFT_REPLAY)
        admin_job_run(job_id=job.pk)  # the worker's part
        page.reload()
        expect(page.locator("#job-status")).to_have_attribute("data-status", "done")
        expect(page.locator("#replay-summary")).to_have_text("5 of 5 leads would change")
        expect(page.locator("#replay-words li")).to_have_count(5)

        theirs = config_draft_create(actor="user:sam")
        config_draft_patch(
            draft_id=theirs.pk,
            changes={"territories": {"Bavaria": {"countries": ["DE", "AT"], "team": "EMEA SDR"}}},
            actor="user:sam",
        )
        config_draft_publish(draft_id=theirs.pk, actor="user:sam")
        before = ConfigDraft.objects.get(pk=draft.pk).document
        page.goto(f"{base}/admin/routing/configdraft/{draft.pk}/change/")
        page.click("#draft-rebase")
        expect(page.locator("#published-since")).to_contain_text(
            'Territory "Bavaria": countries DE → DE, AT'
        )
        page.click("#rebase")
        expect(page.locator("#rebase-refused")).to_be_visible()
        expect(page.locator("#rebase-conflicts li")).to_have_text(
            [
                'Territory "Bavaria" was changed both in the draft (team EMEA SDR → DACH AE) '
                "and in the published configuration (countries DE → DE, AT)"
            ]
        )
        browser.close()
    assert ConfigDraft.objects.get(pk=draft.pk).document == before
    clear_live_config_cache()
