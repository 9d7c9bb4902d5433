"""``routing_import FILE`` without ``--publish``: the file becomes a draft of the whole
configuration (nothing live changes), which is then tested, diffed and published like any
draft; ``--publish`` keeps writing the tables after the saved test cases pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from routing.configuration import configuration_import
from routing.drafts.models import ConfigDraft
from routing.drafts.services import config_draft_publish, draft_check
from routing.models import Rep, RuleSet, Team, Territory
from routing.rules_io import rules_export
from routing.timeoff.models import RepAbsence
from routing.versions import TestCasesFailing
from tests.routing.test_configuration import document, text

pytestmark = pytest.mark.django_db


def _live() -> str:
    return json.dumps(rules_export(), sort_keys=True)


def _write(tmp_path: Path, data: Any) -> str:
    path = tmp_path / "routing.json"
    path.write_text(text(data))
    return str(path)


def test_an_import_without_publish_makes_a_draft_and_changes_nothing_live(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bug: ``routing_import FILE`` (without --publish), which the docs call a draft,
    wrote the live tables at once (only the ruleset was a draft), with no test-case gate."""
    configuration_import(data=document(), publish=True)
    before, rulesets = _live(), RuleSet.objects.count()
    changed = document()
    changed["teams"][0]["sla_minutes"] = 15
    changed["territories"][0]["countries"] = ["DE", "AT", "CH", "LI"]
    call_command("routing_import", _write(tmp_path, changed))
    assert _live() == before
    assert RuleSet.objects.count() == rulesets
    assert Team.objects.get(name="EMEA SDR").sla_minutes == 60
    draft = ConfigDraft.objects.get()
    assert draft.status == "open"
    out = capsys.readouterr().out
    assert f"into configuration draft {draft.pk}: 2 changes" in out
    assert "Nothing live changed." in out
    assert f"/admin/routing/configdraft/{draft.pk}/change/" in out
    assert f"/api/v1/config/drafts/{draft.pk}/" in out
    assert 'Team "EMEA SDR"' in out
    assert 'Territory "DACH"' in out
    # The draft is the published configuration as the import would leave it.
    assert draft.document["teams"][0]["sla_minutes"] == 15
    assert draft.document["territories"][0]["countries"] == ["DE", "AT", "CH", "LI"]
    assert not draft_check(draft=draft, leads=0).failing
    config_draft_publish(draft_id=draft.pk, actor="test")
    assert Team.objects.get(name="EMEA SDR").sla_minutes == 15
    # The same file again: nothing left to change, no draft.
    call_command("routing_import", _write(tmp_path, changed))
    assert "changes nothing in the published configuration: no draft made" in (
        capsys.readouterr().out
    )
    assert ConfigDraft.objects.count() == 1


def test_a_drafts_publish_runs_the_saved_test_cases(tmp_path: Path) -> None:
    configuration_import(data=document(), publish=True)
    moved = document()
    moved["territories"][0]["team"] = "Inbound SDR"  # "German lead to EMEA" fails
    call_command("routing_import", _write(tmp_path, moved))
    draft = ConfigDraft.objects.get()
    assert [r.case.name for r in draft_check(draft=draft, leads=0).failing] == [
        "German lead to EMEA"
    ]
    with pytest.raises(TestCasesFailing):
        config_draft_publish(draft_id=draft.pk, actor="test")
    assert Territory.objects.get(name="DACH").team.name == "EMEA SDR"  # type: ignore[union-attr]


def test_an_import_with_prune_into_a_draft_leaves_out_what_the_file_no_longer_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    published = document()
    published["reps"].append({"email": "dee@example.com", "name": "Dee"})
    configuration_import(data=published, publish=True)
    smaller = document()  # without Dee
    smaller["territories"] = [t for t in smaller["territories"] if t["name"] != "DACH"]
    smaller["test_cases"] = smaller["test_cases"][1:]  # the case that needs DACH
    call_command("routing_import", _write(tmp_path, smaller), "--prune")
    assert Territory.objects.filter(name="DACH").exists()  # live: untouched
    draft = ConfigDraft.objects.get()
    assert "DACH" not in [t["name"] for t in draft.document["territories"]]
    # A draft never deletes a rep: kept, and said so.
    assert "dee@example.com" in [r["email"] for r in draft.document["reps"]]
    err = capsys.readouterr().err
    assert "reps: dee@example.com: not in the file, but a draft never deletes a rep" in err
    config_draft_publish(draft_id=draft.pk, actor="test")
    assert not Territory.objects.filter(name="DACH").exists()
    assert Rep.objects.filter(email="dee@example.com").exists()


def test_an_import_into_a_draft_leaves_out_live_state_and_tokens_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configuration_import(data=document(), publish=True)
    data = document()
    soon = timezone.now() + timezone.timedelta(days=3)
    data["reps"][1]["out_of_office_until"] = soon.isoformat()
    data["reps"][1]["absences"] = [
        {"from": (soon + timezone.timedelta(days=5)).isoformat(), "to": "2100-01-01T00:00:00Z"}
    ]
    data["sources"][0]["token"] = "a-token-long-enough-for-a-source"
    data["teams"][0]["sla_minutes"] = 30
    call_command("routing_import", _write(tmp_path, data))
    err = capsys.readouterr().err
    assert "reps[1].out_of_office_until: a rep's live state, not part of a draft" in err
    assert "reps[1].absences: a rep's live state, not part of a draft" in err
    assert "sources[0].token: a secret is not kept in a draft" in err
    ben = Rep.objects.get(email="ben@example.com")
    assert ben.out_of_office_until is None
    assert not RepAbsence.objects.exists()
    draft = ConfigDraft.objects.get()
    assert "out_of_office_until" not in draft.document["reps"][1]
    config_draft_publish(draft_id=draft.pk, actor="test")  # a valid draft


def test_an_import_without_publish_refuses_with_paths_and_before_anything_is_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(CommandError, match="No configuration is published yet") as caught:
        call_command("routing_import", _write(tmp_path, document()))
    assert "routing_import --publish" in str(caught.value)
    assert (RuleSet.objects.count(), Rep.objects.count(), ConfigDraft.objects.count()) == (0, 0, 0)
    configuration_import(data=document(), publish=True)
    bad = document()
    bad["teams"][0]["strategy"] = "random"
    with pytest.raises(CommandError, match="1 error in"):
        call_command("routing_import", _write(tmp_path, bad))
    assert 'teams[0].strategy: must be one of "round_robin"' in capsys.readouterr().err
    assert not ConfigDraft.objects.exists()
