"""The whole configuration as one document: test cases in the file, export -> import -> export
byte-identical, --publish running the test cases (--force audited), --prune and its refusals,
serialised imports (PostgreSQL), and routing_check deciding from the file without writing."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from audit.models import Event, EventType
from leads.models import LeadStatus
from routing.configuration import (
    ConfigurationBusy,
    configuration_check,
    configuration_import,
)
from routing.models import (
    Account,
    ConfigVersion,
    Rep,
    RoutingTestCase,
    RuleSet,
    RuleSetStatus,
    Team,
    Territory,
)
from routing.rules_io import PruneRefused, RulesFileErrors, rules_export, rules_import
from routing.versions import TestCasesFailing
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory
from tests.routing.test_rules_io import example, row_counts

pytestmark = pytest.mark.django_db

CASES: list[dict[str, Any]] = [
    {
        "name": "German lead to EMEA",
        "lead": {"email": "max@firma.de", "country": "DE"},
        "source": "webinar",
        "expected_status": "assigned",
        "expected_rep": None,
        "expected_team": "EMEA SDR",
    },
    {
        "name": "Competitor excluded",
        "lead": {"email": "spy@rival.io"},
        "source": None,
        "expected_status": "excluded",
        "expected_rep": None,
        "expected_team": None,
    },
    {
        "name": "Acme to its owner",
        "lead": {"email": "jo@acme.com", "country": "US"},
        "source": None,
        "expected_status": "assigned",
        "expected_rep": "bob@example.com",
        "expected_team": None,
    },
]


def document(**changes: Any) -> dict[str, Any]:
    data = example()
    data["test_cases"] = json.loads(json.dumps(CASES))
    data.update(changes)
    return data


def text(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# --- Round trip --------------------------------------------------------------------------------


def test_the_file_holds_the_test_cases_and_export_import_export_is_byte_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configuration_import(data=document(), publish=True)
    assert RoutingTestCase.objects.count() == 3
    case = RoutingTestCase.objects.get(name="Acme to its owner")
    assert case.expected_rep is not None
    assert case.expected_rep.email == "bob@example.com"
    call_command("routing_export", "--output", str(tmp_path / "a.yaml"))
    first = (tmp_path / "a.yaml").read_bytes()
    assert b"test_cases:" in first
    # Into the same database, and into an empty one: the same bytes come out.
    call_command("routing_import", str(tmp_path / "a.yaml"), "--publish", "--prune")
    call_command("routing_export", "--output", str(tmp_path / "b.yaml"))
    assert (tmp_path / "b.yaml").read_bytes() == first
    exported = rules_export()
    RoutingTestCase.objects.all().delete()
    Territory.objects.all().delete()
    Account.objects.all().delete()
    configuration_import(data=exported, publish=True)
    assert text(rules_export()) == text(exported)
    capsys.readouterr()


def test_the_export_holds_no_live_state_so_importing_it_back_keeps_who_is_away(
    tmp_path: Path,
) -> None:
    """Reps' active and out of office are facts about people, not design: the exported file
    leaves them out, so an export imported later (from git, after a rep went away) resets
    nobody, and export -> import -> export stays identical."""
    configuration_import(data=document(), publish=True)
    call_command("routing_export", "--output", str(tmp_path / "a.yaml"))
    first = (tmp_path / "a.yaml").read_bytes()
    assert b"out_of_office_until" not in first
    assert b"active:" not in first.split(b"ruleset:")[0]  # the reps' (rules keep theirs)
    until = timezone.now() + timezone.timedelta(days=2)
    Rep.objects.filter(email="ana@example.com").update(out_of_office_until=until)
    Rep.objects.filter(email="ben@example.com").update(active=False)
    # (--force: with both EMEA reps away its saved test case rightly fails.)
    call_command("routing_import", str(tmp_path / "a.yaml"), "--publish", "--prune", "--force")
    assert Rep.objects.get(email="ana@example.com").out_of_office_until == until
    assert not Rep.objects.get(email="ben@example.com").active
    call_command("routing_export", "--output", str(tmp_path / "b.yaml"))
    assert (tmp_path / "b.yaml").read_bytes() == first
    # A file that sets them on purpose still does (and re-routes, as documented).
    data = rules_export()
    data["reps"][1]["active"] = True  # ben, by e-mail order
    configuration_import(data=data)
    assert Rep.objects.get(email="ben@example.com").active


def test_a_test_case_with_an_unknown_reference_is_an_error_with_its_path() -> None:
    data = document()
    data["test_cases"][0]["expected_team"] = "Nobody"
    data["test_cases"][1]["expected_team"] = "EMEA SDR"  # excluded: no owner expected
    data["test_cases"][2]["source"] = "nowhere"
    before = row_counts()
    with pytest.raises(RulesFileErrors) as caught:
        configuration_import(data=data, publish=True)
    errors = [str(e) for e in caught.value.errors]
    assert 'test_cases[0].expected_team: unknown team "Nobody"' in errors
    assert "test_cases[1].expected_team: only an assigned lead has one (it is excluded)" in errors
    assert 'test_cases[2].source: unknown source "nowhere"' in errors
    assert row_counts() == before


# --- --publish runs the test cases -------------------------------------------------------------


def _failing() -> dict[str, Any]:
    data = document()
    data["test_cases"][0]["expected_team"] = "Inbound SDR"  # DE goes to EMEA SDR
    return data


def test_publish_refuses_when_a_test_case_fails_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bug: routing_import --publish skipped the saved test cases the admin enforces."""
    path = tmp_path / "routing.json"
    path.write_text(text(_failing()))
    with pytest.raises(CommandError, match=r"1 saved test case.*Not published; nothing written"):
        call_command("routing_import", str(path), "--publish")
    assert 'test_cases: "German lead to EMEA" fails: team is EMEA SDR' in capsys.readouterr().err
    assert (RuleSet.objects.count(), Rep.objects.count(), RoutingTestCase.objects.count()) == (
        0,
        0,
        0,
    )
    assert not Event.objects.filter(type=EventType.CONFIG_IMPORTED).exists()


def test_publish_runs_saved_cases_against_changed_tables_even_with_the_same_rules() -> None:
    configuration_import(data=document(), publish=True)
    moved = document()
    moved["territories"][0]["team"] = "Inbound SDR"  # DACH to another team; rules unchanged
    with pytest.raises(TestCasesFailing):
        configuration_import(data=moved, publish=True)
    assert Territory.objects.get(name="DACH").team.name == "EMEA SDR"  # type: ignore[union-attr]


def test_a_forced_publish_is_audited_with_its_failing_cases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "routing.json"
    path.write_text(text(_failing()))
    call_command("routing_import", str(path), "--publish", "--force")
    out = capsys.readouterr().out
    assert "Published with 1 failing test case(s) (--force): German lead to EMEA" in out
    assert RuleSet.objects.get().status == RuleSetStatus.PUBLISHED
    published = Event.objects.get(type=EventType.RULES_PUBLISHED)
    assert published.data["failing_test_cases"] == ["German lead to EMEA"]
    imported = Event.objects.get(type=EventType.CONFIG_IMPORTED)
    assert imported.data["forced"] is True
    assert imported.data["failing_test_cases"] == ["German lead to EMEA"]
    assert imported.data["counts"]["reps"]["created"] == 4
    with pytest.raises(CommandError, match="--force only applies to --publish"):
        call_command("routing_import", str(path), "--force")


# --- --prune -----------------------------------------------------------------------------------


def test_prune_deletes_what_the_file_no_longer_names() -> None:
    configuration_import(data=document(), publish=True)
    smaller = document()
    smaller["territories"] = smaller["territories"][:1]
    smaller["accounts"] = []
    smaller["test_cases"] = [c for c in smaller["test_cases"] if c["name"] != "Acme to its owner"]
    configuration_import(data=smaller, publish=True)  # without --prune: nothing deleted
    assert Territory.objects.count() == 3
    result = configuration_import(data=smaller, publish=True, prune=True)
    assert sorted(Territory.objects.values_list("name", flat=True)) == ["DACH"]
    assert not Account.objects.exists()
    assert RoutingTestCase.objects.count() == 2
    assert result.counts["territories"]["deleted"] == 2
    assert result.counts["accounts"]["deleted"] == 1


def test_prune_leaves_a_section_the_file_does_not_have() -> None:
    configuration_import(data=document(), publish=True)
    data = document()
    del data["accounts"]
    configuration_import(data=data, publish=True, prune=True)
    assert Account.objects.count() == 1


def test_prune_refuses_a_rep_with_open_leads_and_applies_nothing() -> None:
    configuration_import(data=document(), publish=True)
    cai = Rep.objects.get(email="cai@example.com")
    AssignmentFactory(rep=cai)
    data = document()
    data["reps"] = [r for r in data["reps"] if r["email"] != "cai@example.com"]
    data["teams"][3]["members"] = []
    data["territories"][2]["rep"] = "ana@example.com"
    data["reps"][0]["name"] = "Ana Renamed"
    before = row_counts()
    with pytest.raises(PruneRefused) as caught:
        configuration_import(data=data, publish=True, prune=True)
    source = cai.assignments.get().lead.source.slug  # the factory's lead came from a source
    assert sorted(str(e) for e in caught.value.errors) == [
        'reps: "cai@example.com" is not in the file but owns 1 open lead(s): reassign them first',
        f'sources: "{source}" is not in the file but leads came from it: keep it in the file',
    ]
    assert row_counts() == before
    assert Rep.objects.get(email="ana@example.com").name == "Ana"  # nothing half-applied
    assert Territory.objects.get(name="Bay Area").rep == cai


def test_prune_refuses_a_team_the_live_rules_still_target_unless_they_are_published() -> None:
    configuration_import(data=document(), publish=True)
    data = document()
    data["teams"] = [t for t in data["teams"] if t["name"] != "Enterprise AE"]
    rules = data["ruleset"]["rules"]
    rules[3]["action"] = {"type": "team", "team": "Inbound SDR"}
    with pytest.raises(PruneRefused, match="a live rule sends leads to it"):
        configuration_import(data=data, prune=True)  # the published rules still name it
    assert Team.objects.filter(name="Enterprise AE").exists()
    configuration_import(data=data, prune=True, publish=True)
    assert not Team.objects.filter(name="Enterprise AE").exists()


def test_under_prune_references_must_point_into_the_file() -> None:
    configuration_import(data=document(), publish=True)
    data = document()
    data["reps"] = [r for r in data["reps"] if r["email"] != "cai@example.com"]
    with pytest.raises(RulesFileErrors) as caught:
        configuration_import(data=data, prune=True)
    errors = [str(e) for e in caught.value.errors]
    assert 'teams[3].members[0].rep: unknown rep "cai@example.com"' in errors
    assert 'territories[2].rep: unknown rep "cai@example.com"' in errors
    configuration_import(data=data)  # without --prune the stored rep still counts


# --- Serialised imports (PostgreSQL) -----------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_import_while_another_holds_the_lock_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    import psycopg

    settings_dict = connection.settings_dict
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with (
            psycopg.connect(
                host=settings_dict["HOST"] or "127.0.0.1",
                port=settings_dict["PORT"] or 5432,
                user=settings_dict["USER"],
                password=settings_dict["PASSWORD"] or None,
                dbname=settings_dict["NAME"],
            ) as other,
            other.transaction(),
        ):
            other.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ["routing:publish"]
            )
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with pytest.raises(ConfigurationBusy, match="in progress; nothing was written"):
            configuration_import(data=document(), publish=True)
        path = tmp_path / "routing.json"
        path.write_text(text(document()))
        with pytest.raises(CommandError, match="Another import or publish"):
            call_command("routing_import", str(path), "--publish")
        assert not RuleSet.objects.exists()
    finally:
        release.set()
        holder.join(10)
    configuration_import(data=document(), publish=True)
    assert RuleSet.objects.get().status == RuleSetStatus.PUBLISHED


# --- routing_check -----------------------------------------------------------------------------


def _german_leads(n: int) -> None:
    for i in range(n):
        LeadFactory(
            email=f"p{i}@firma{i}.de",
            email_domain=f"firma{i}.de",
            country="DE",
            status=LeadStatus.ASSIGNED,
            processed_at=timezone.now(),
        )


def _nothing_written() -> tuple[dict[str, int], int, int]:
    return (
        row_counts(),
        ConfigVersion.objects.values_list("version", flat=True).first() or 0,
        Event.objects.count(),
    )


def test_check_of_the_exported_configuration_passes_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configuration_import(data=document(), publish=True)
    _german_leads(4)
    path = tmp_path / "routing.yaml"
    call_command("routing_export", "--output", str(path))
    before = _nothing_written()
    call_command("routing_check", str(path))
    out = capsys.readouterr().out
    assert "Test cases: 3 of 3 passed" in out
    assert "over the last 4 processed leads: 0 would change" in out
    assert _nothing_written() == before


def test_check_decides_from_the_file_and_lists_the_changed_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configuration_import(data=document(), publish=True)
    _german_leads(3)
    moved = document()
    moved["territories"][0]["team"] = "US West AE"  # "what if DACH went to Cai's team?"
    moved["test_cases"][0]["expected_team"] = "US West AE"
    moved["test_cases"][2]["expected_rep"] = "ana@example.com"  # fails: Acme is Bob's
    moved["accounts"].append({"domain": "firma0.de", "name": "Firma", "owner": "ana@example.com"})
    path = tmp_path / "routing.json"
    path.write_text(text(moved))
    before = _nothing_written()
    with pytest.raises(CommandError, match=r"1 test case.*fail against"):
        call_command("routing_check", str(path))
    out = capsys.readouterr().out
    assert "Test cases: 2 of 3 passed" in out
    assert '✗ "Acme to its owner": owner is Bob <bob@example.com>' in out
    assert "over the last 3 processed leads: 3 would change" in out
    assert "Cai <cai@example.com> (US West AE)" in out
    assert "Ana <ana@example.com>" in out  # firma0.de: the file's new account, owned by Ana
    assert _nothing_written() == before
    assert Territory.objects.get(name="DACH").team.name == "EMEA SDR"  # type: ignore[union-attr]

    report = configuration_check(data=moved, leads=0)
    assert report.considered == 0
    assert [r.case.name for r in report.failing] == ["Acme to its owner"]


def test_check_and_publish_agree_on_the_test_cases() -> None:
    """routing_check predicts routing_import --publish: the same cases fail both ways."""
    configuration_import(data=document(), publish=True)
    moved = document()
    moved["territories"][0]["team"] = "Inbound SDR"
    moved["reps"].append({"email": "dee@example.com", "name": "Dee", "max_open": 1})
    moved["teams"][2]["members"] = [{"rep": "dee@example.com"}]
    report = configuration_check(data=moved)
    predicted = sorted(r.case.name for r in report.failing)
    with pytest.raises(TestCasesFailing) as caught:
        configuration_import(data=moved, publish=True)
    assert predicted == sorted(r.case.name for r in caught.value.results if not r.passed)
    assert predicted == ["German lead to EMEA"]


def test_check_reports_file_errors_with_their_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = document()
    data["territories"][0]["team"] = "Nobody"
    path = tmp_path / "routing.json"
    path.write_text(text(data))
    with pytest.raises(CommandError, match="1 error in"):
        call_command("routing_check", str(path))
    assert 'territories[0].team: unknown team "Nobody"' in capsys.readouterr().err


def test_rules_import_keeps_working_for_existing_callers() -> None:
    result = rules_import(document(), publish=True)
    assert result.ruleset.status == RuleSetStatus.PUBLISHED
    assert RoutingTestCase.objects.count() == 3
