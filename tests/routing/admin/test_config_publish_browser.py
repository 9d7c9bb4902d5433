"""Publishing a draft of the whole configuration from the admin, in real headless Chromium: the
action queues a background job and opens its progress page, which refreshes itself while the
job waits or runs and ends on the version published, a link to it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from routing.admin_jobs import admin_job_run
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigSnapshot
from routing.drafts.services import config_draft_create, config_draft_patch
from routing.editor.permissions import revops_group_sync
from routing.models import AdminJob, ValueList
from routing.rules_io import rules_import
from tests.routing.test_pipeline import RULES


@pytest.mark.browser
@pytest.mark.slow
def test_publish_in_the_admin_shows_the_jobs_progress_and_ends_on_the_new_version(
    live_server: Any, chromium: str, transactional_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect, sync_playwright

    # The ORM is used between browser steps, while Playwright's loop runs in this thread.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    user = User.objects.create_user("rita", password="pw-rita-123", is_staff=True)
    user.groups.add(revops_group_sync())
    draft = config_draft_create(actor="user:rita")
    config_draft_patch(
        draft_id=draft.pk,
        changes={"value_lists": {"competitors": {"values": ["a.io"]}}},
        actor="user:rita",
    )

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{live_server.url}/admin/login/")
        page.fill("#id_username", "rita")
        page.fill("#id_password", "pw-rita-123")
        page.click("input[type=submit]")
        page.goto(f"{live_server.url}/admin/routing/configdraft/")
        page.check(f"input[name=_selected_action][value='{draft.pk}']")
        page.select_option("select[name=action]", "publish")
        page.click("button[name=index]")

        # The progress page, while the job waits for a worker.
        expect(page.locator("#job-status")).to_contain_text("Queued")
        job = AdminJob.objects.get()
        assert page.url.endswith(f"/admin/routing/adminjob/{job.pk}/progress/")
        assert ValueList.objects.get().values == ["rival.io"]  # nothing published yet

        admin_job_run(job_id=job.pk)  # what the worker's maintenance.admin_job does
        # The page refreshes itself and ends on the version published.
        expect(page.locator("#config-published")).to_contain_text(
            "Published as configuration version 2: 1 row(s) changed.", timeout=15_000
        )
        expect(page.locator("#config-published")).to_contain_text(
            'Value list "competitors": values rival.io → a.io'
        )
        expect(page.locator("#job-status")).to_contain_text("Done at")
        page.click("#published-version")
        expect(page.locator("#content")).to_contain_text("configuration v2")
        browser.close()
    assert ConfigSnapshot.objects.count() == 2
    assert ValueList.objects.get().values == ["a.io"]
    clear_live_config_cache()
