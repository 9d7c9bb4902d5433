"""Changing a draft from the admin: a territories or accounts CSV imported into it (row-precise
errors, the draft unchanged on any), its document edited as YAML (errors with their paths,
nothing saved on any); then, in real Chromium, the whole walk: begin a draft, upload a CSV with
a bad row, fix it, read the diff in words, publish."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from routing.admin_jobs import admin_job_run
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigDraft, ConfigSnapshot
from routing.drafts.services import config_draft_create
from routing.editor.permissions import revops_group_sync
from routing.models import AdminJob, AdminJobKind, Territory
from routing.rules_io import rules_import
from tests.routing.test_pipeline import RULES

HEADER = "territory,country,region,postal_prefix,team,rep\n"
BAD = HEADER + "Bavaria,DE,BY,,EMEA SDR,\nAustria,AT,,,No Such Team,\n"
GOOD = HEADER + "Bavaria,DE,BY,,EMEA SDR,\nAustria,AT,,,EMEA SDR,\n"


@pytest.fixture
def rita() -> Any:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    user = User.objects.create_user("rita", password="pw-rita-123", is_staff=True)
    user.groups.add(revops_group_sync())
    client = Client()
    client.force_login(user)
    yield client
    clear_live_config_cache()


def _upload(client: Client, draft: ConfigDraft, content: str) -> Any:
    return client.post(
        reverse("admin:routing_configdraft_import", args=[draft.pk]),
        {"table": "territories", "file": SimpleUploadedFile("t.csv", content.encode())},
        follow=True,
    )


@pytest.mark.django_db
def test_a_csv_with_a_bad_row_leaves_the_draft_unchanged_and_says_which_row(rita: Any) -> None:
    draft = config_draft_create(actor="user:rita")
    before = ConfigDraft.objects.get(pk=draft.pk).document
    page = unescape(_upload(rita, draft, BAD).content.decode())
    assert "the draft is unchanged" in page
    assert re.search(r"row 3, column team: [^<]*No Such Team", page), page[-3000:]
    assert ConfigDraft.objects.get(pk=draft.pk).document == before

    page = unescape(_upload(rita, draft, GOOD).content.decode())
    assert "Imported 2 row(s) into draft" in page
    names = {t["name"] for t in ConfigDraft.objects.get(pk=draft.pk).document["territories"]}
    assert {"Bavaria", "Austria"} <= names
    assert 'Territory "Bavaria" added' in page  # the change page's diff, in words
    assert not Territory.objects.exists()  # nothing live until published


@pytest.mark.django_db
def test_the_document_is_edited_as_yaml_and_refused_with_paths(rita: Any) -> None:
    draft = config_draft_create(actor="user:rita")
    url = reverse("admin:routing_configdraft_edit", args=[draft.pk])
    shown = unescape(rita.get(url).content.decode())
    assert "name: EMEA SDR" in shown
    text = re.search(r"<textarea[^>]*>(.*?)</textarea>", shown, re.S).group(1)  # type: ignore[union-attr]
    broken = text.replace("strategy: round_robin", "strategy: coin_toss")
    page = unescape(rita.post(url, {"document": broken}).content.decode())
    assert "Not saved" in page
    assert re.search(r"teams\[0\]\.strategy: [^<]*", page), page[-3000:]
    assert ConfigDraft.objects.get(pk=draft.pk).document == draft.document
    assert "not valid YAML" in unescape(
        rita.post(url, {"document": "teams: [unclosed"}).content.decode()
    )

    fixed = text.replace("strategy: round_robin", "strategy: weighted")
    response = rita.post(url, {"document": fixed}, follow=True)
    assert "saved" in unescape(response.content.decode())
    assert ConfigDraft.objects.get(pk=draft.pk).document["teams"][0]["strategy"] == "weighted"


@pytest.mark.browser
@pytest.mark.slow
def test_a_draft_from_the_admin_csv_bad_row_fixed_diff_in_words_published(
    live_server: Any,
    chromium: str,
    transactional_db: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    user = User.objects.create_user("rita", password="pw-rita-123", is_staff=True)
    user.groups.add(revops_group_sync())
    bad, good = tmp_path / "bad.csv", tmp_path / "good.csv"
    bad.write_text(BAD)
    good.write_text(GOOD)
    base = live_server.url

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/admin/login/")
        page.fill("#id_username", "rita")
        page.fill("#id_password", "pw-rita-123")
        page.click("input[type=submit]")

        page.goto(f"{base}/admin/routing/configdraft/add/")
        page.fill("#id_note", "Bavaria and Austria")
        page.click("input[name=_save]")
        draft = ConfigDraft.objects.get()
        before = draft.document
        page.goto(f"{base}/admin/routing/configdraft/{draft.pk}/change/")
        page.click("#draft-import")
        page.select_option("#id_table", "territories")
        page.set_input_files("input[type=file]", str(bad))
        page.click("input[name=_import]")
        expect(page.locator("#import-errors")).to_contain_text(
            re.compile(r"row 3, column team: .*No Such Team")
        )
        assert ConfigDraft.objects.get().document == before

        page.set_input_files("input[type=file]", str(good))
        page.click("input[name=_import]")
        expect(page.locator(".messagelist")).to_contain_text("Imported 2 row(s)")
        words = page.locator(".field-changes_in_words")
        expect(words).to_contain_text(
            'Territory "Bavaria" added: countries DE; postal prefixes none; regions BY; '
            "team EMEA SDR"
        )
        expect(words).to_contain_text('Territory "Austria" added: countries AT')
        assert not Territory.objects.exists()

        page.goto(f"{base}/admin/routing/configdraft/")
        page.check(f"input[name=_selected_action][value='{draft.pk}']")
        page.select_option("select[name=action]", "publish")
        page.click("button[name=index]")
        # A publish is a background job: its progress page, then the worker runs it.
        expect(page.locator("#job-status")).to_contain_text("Queued")
        admin_job_run(job_id=AdminJob.objects.get(kind=AdminJobKind.CONFIG_PUBLISH).pk)
        expect(page.locator("#config-published")).to_contain_text(
            "Published as configuration version 2", timeout=15_000
        )
        browser.close()
    assert set(Territory.objects.values_list("name", flat=True)) == {"Bavaria", "Austria"}
    assert ConfigSnapshot.objects.filter(number=2).exists()
    clear_live_config_cache()
