"""Drafts of the whole routing configuration (routing.drafts): created from the published
configuration, changed by natural key, checked with paths, tested and diffed in words, published
as one numbered version all or nothing, rolled back; each lead records the version."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.models import Event, EventType
from leads.models import LeadStatus
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigDraft, ConfigDraftStatus, ConfigSnapshot
from routing.drafts.services import (
    DraftRefused,
    DraftStale,
    config_draft_create,
    config_draft_discard,
    config_draft_patch,
    config_draft_publish,
    config_draft_replace,
    config_rollback,
    draft_check,
    draft_diff,
    draft_errors,
)
from routing.drafts.snapshots import configuration_document
from routing.models import Assignment, Rep, RuleSet, RuleSetStatus, Team, Territory
from routing.rules_io import RulesFileErrors, rules_import
from routing.services import lead_process
from routing.versions import TestCasesFailing
from tests.leads.factories import LeadFactory
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

CASE = {
    "name": "A lead goes to EMEA SDR",
    "lead": {"email": "someone@acme.com"},
    "expected_status": "assigned",
    "expected_team": "EMEA SDR",
}


@pytest.fixture
def published() -> Any:
    clear_live_config_cache()
    rules_import({**RULES, "test_cases": [CASE]}, publish=True)
    yield
    clear_live_config_cache()


def _table_state() -> dict[str, Any]:
    return {
        "teams": sorted(Team.objects.values_list("name", "strategy")),
        "territories": sorted(Territory.objects.values_list("name", flat=True)),
        "rulesets": sorted(RuleSet.objects.values_list("version", "status")),
        "snapshots": ConfigSnapshot.objects.count(),
    }


def test_a_draft_begins_as_the_published_configuration_and_the_first_is_a_baseline(published):
    draft = config_draft_create(actor="user:rita", note="Bavaria to Ana")
    assert draft.document == configuration_document()
    assert "active" not in draft.document["reps"][0]  # live state stays live
    assert draft.document["test_cases"][0]["name"] == CASE["name"]
    baseline = ConfigSnapshot.objects.get()
    assert (baseline.number, baseline.kind, draft.base_number) == (1, "baseline", 1)
    assert draft_diff(draft=draft).changes == []
    assert Event.objects.filter(type=EventType.CONFIG_CHANGED, actor="user:rita").exists()


def test_nothing_published_is_refused():
    with pytest.raises(DraftRefused) as caught:
        config_draft_create(actor="user:rita")
    assert caught.value.code == "nothing_published"


def test_a_patch_by_natural_key_is_diffed_in_words_and_published_as_one_version(published):
    draft = config_draft_create(actor="user:rita")
    config_draft_patch(
        draft_id=draft.pk,
        changes={
            "teams": {
                "EMEA SDR": {"strategy": "weighted", "members": [{"rep": "ana@example.com"}]},
                "DACH AE": {"members": [{"rep": "ben@example.com", "weight": 2}]},
            },
            "territories": {"Bavaria": {"countries": ["DE"], "regions": ["BY"], "team": "DACH AE"}},
            "rules": {
                "Bavaria first": {
                    "priority": 5,
                    "when": {"all": [{"field": "region", "op": "eq", "value": "BY"}]},
                    "action": {"type": "team", "team": "DACH AE"},
                }
            },
        },
        actor="user:rita",
    )
    words = [change.words for change in draft_diff(draft=ConfigDraft.objects.get()).changes]
    assert (
        'Team "EMEA SDR": members ana@example.com weight 1, ben@example.com weight 1 → '
        "ana@example.com weight 1; strategy round_robin → weighted"
    ) in words
    assert any(w.startswith('Team "DACH AE" added') for w in words)
    assert any(
        w.startswith('Territory "Bavaria" added: countries DE; regions BY; team DACH AE')
        for w in words
    )
    assert any(w.startswith('Rule "Bavaria first" added') and "team DACH AE" in w for w in words)
    assert Team.objects.filter(name="DACH AE").count() == 0  # nothing live yet

    result = config_draft_publish(draft_id=draft.pk, actor="user:rita")
    assert result.snapshot.number == 2
    assert result.snapshot.kind == "draft"
    assert Team.objects.get(name="EMEA SDR").strategy == "weighted"
    assert Territory.objects.filter(name="Bavaria").exists()
    live = RuleSet.objects.get(status=RuleSetStatus.PUBLISHED)
    assert live.version == result.snapshot.ruleset_version
    assert result.snapshot.document == configuration_document()
    assert ConfigDraft.objects.get().status == ConfigDraftStatus.PUBLISHED
    published_events = Event.objects.filter(type=EventType.CONFIG_CHANGED, data__action="published")
    assert published_events.get().data["changed"] == len(result.changes) >= 4

    lead = LeadFactory(raw_payload={"email": "x@acme.com", "country": "DE", "region": "BY"})
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert (assignment.team_name, assignment.rep_name) == ("DACH AE", "Ben")
    assert assignment.ruleset_version == result.snapshot.ruleset_version  # the version decided


def test_a_table_only_change_still_gets_its_own_ruleset_version(published):
    before = RuleSet.objects.get(status=RuleSetStatus.PUBLISHED).version
    draft = config_draft_create(actor="user:rita")
    config_draft_patch(
        draft_id=draft.pk, changes={"value_lists": {"competitors": {"values": ["x.io"]}}}, actor="t"
    )
    snapshot = config_draft_publish(draft_id=draft.pk, actor="user:rita").snapshot
    assert snapshot.ruleset_version > before
    assert RuleSet.objects.get(status=RuleSetStatus.PUBLISHED).version == snapshot.ruleset_version


def test_an_invalid_change_is_refused_with_its_path_and_nothing_written(published):
    draft = config_draft_create(actor="user:rita")
    before = copy.deepcopy(draft.document)
    with pytest.raises(RulesFileErrors) as caught:
        config_draft_patch(
            draft_id=draft.pk,
            changes={"territories": {"Bavaria": {"countries": ["DE"], "team": "Nobody"}}},
            actor="t",
        )
    paths = [error.path for error in caught.value.errors]
    assert paths == ["territories[name=Bavaria].team"]
    with pytest.raises(RulesFileErrors) as caught:
        config_draft_patch(
            draft_id=draft.pk,
            changes={"reps": {"ana@example.com": {"name": "Ana", "active": False}}},
            actor="t",
        )
    assert [error.path for error in caught.value.errors] == ["reps[email=ana@example.com].active"]
    with pytest.raises(RulesFileErrors) as caught:
        config_draft_replace(draft_id=draft.pk, document={"ruleset": before["ruleset"]}, actor="t")
    assert "teams" in [error.path for error in caught.value.errors]
    assert ConfigDraft.objects.get().document == before


def test_a_failing_test_case_refuses_the_publish_whole_unless_forced(published):
    draft = config_draft_create(actor="user:rita")
    config_draft_patch(
        draft_id=draft.pk,
        changes={
            "teams": {"Other": {"members": [{"rep": "ben@example.com"}]}},
            "rules": {"Everyone": {"priority": 20, "action": {"type": "team", "team": "Other"}}},
        },
        actor="t",
    )
    state = _table_state()
    check = draft_check(draft=ConfigDraft.objects.get(), leads=0)
    assert [r.case.name for r in check.failing] == [CASE["name"]]
    with pytest.raises(TestCasesFailing):
        config_draft_publish(draft_id=draft.pk, actor="user:rita")
    assert _table_state() == state  # all or nothing
    assert ConfigDraft.objects.get().status == ConfigDraftStatus.OPEN
    result = config_draft_publish(draft_id=draft.pk, actor="user:rita", force=True)
    assert result.failing == (CASE["name"],)
    assert result.snapshot.failing_test_cases == [CASE["name"]]


def test_a_stale_draft_is_refused_with_what_changed(published):
    first = config_draft_create(actor="user:rita")
    second = config_draft_create(actor="user:sam")
    config_draft_patch(
        draft_id=first.pk, changes={"value_lists": {"competitors": {"values": ["a.io"]}}}, actor="t"
    )
    config_draft_publish(draft_id=first.pk, actor="user:rita")
    with pytest.raises(DraftStale) as caught:
        config_draft_publish(draft_id=second.pk, actor="user:sam")
    assert 'Value list "competitors": values rival.io → a.io' in caught.value.message
    assert draft_diff(draft=ConfigDraft.objects.get(pk=second.pk)).stale
    # A live edit in the admin makes it stale too.
    third = config_draft_create(actor="user:sam")
    Team.objects.filter(name="EMEA SDR").update(strategy="least_loaded")
    with pytest.raises(DraftStale):
        config_draft_publish(draft_id=third.pk, actor="user:sam")


def test_a_closed_draft_cannot_change(published):
    draft = config_draft_create(actor="user:rita")
    config_draft_discard(draft_id=draft.pk, actor="user:rita")
    with pytest.raises(DraftRefused) as caught:
        config_draft_publish(draft_id=draft.pk, actor="user:rita")
    assert caught.value.code == "draft_closed"


def test_rollback_publishes_an_earlier_version_again_as_a_new_one(published):
    draft = config_draft_create(actor="user:rita")
    config_draft_patch(
        draft_id=draft.pk,
        changes={
            "teams": {"DACH AE": {"members": [{"rep": "ben@example.com"}]}},
            "territories": {"DACH": {"countries": ["DE", "AT", "CH"], "team": "DACH AE"}},
        },
        actor="t",
    )
    config_draft_publish(draft_id=draft.pk, actor="user:rita")
    assert Territory.objects.filter(name="DACH").exists()
    result = config_rollback(number=1, actor="user:rita")
    assert (result.snapshot.number, result.snapshot.rolled_back_to) == (3, 1)
    assert not Territory.objects.filter(name="DACH").exists()  # pruned: version 1 had none
    assert not Team.objects.filter(name="DACH AE").exists()
    assert result.snapshot.digest == ConfigSnapshot.objects.get(number=1).digest
    assert any(change.words == 'Territory "DACH" removed' for change in result.changes)
    with pytest.raises(DraftRefused) as caught:
        config_rollback(number=99, actor="user:rita")
    assert caught.value.status == 404


def test_reps_are_not_pruned_and_their_live_state_survives(published):
    Rep.objects.filter(email="ben@example.com").update(active=False)
    draft = config_draft_create(actor="user:rita")
    config_draft_patch(
        draft_id=draft.pk,
        changes={"reps": {"cai@example.com": {"name": "Cai", "timezone": "Europe/Paris"}}},
        actor="t",
    )
    config_draft_publish(draft_id=draft.pk, actor="user:rita")
    assert Rep.objects.get(email="cai@example.com").timezone == "Europe/Paris"
    assert Rep.objects.get(email="ben@example.com").active is False
    config_rollback(number=1, actor="user:rita")
    assert Rep.objects.filter(email="cai@example.com").exists()  # reps come and go by roster


def test_a_routing_import_publish_is_a_version_when_it_changes_something(published, tmp_path):
    config_draft_create(actor="user:rita")
    assert ConfigSnapshot.objects.count() == 1
    from routing.configuration import configuration_import

    document = copy.deepcopy(RULES)
    document["value_lists"] = [{"name": "competitors", "values": ["b.io"]}]
    configuration_import(data=document, publish=True)
    latest = ConfigSnapshot.objects.order_by("-number").first()
    assert latest is not None
    assert (latest.number, latest.kind) == (2, "import")
    configuration_import(data=document, publish=True)
    assert ConfigSnapshot.objects.count() == 2
    assert draft_errors(draft=ConfigDraft.objects.get()) == []


def test_a_stale_draft_is_rebased_row_by_row_and_refused_where_both_changed_a_row(published):
    from routing.drafts.services import config_draft_rebase

    first = config_draft_create(actor="user:rita")
    second = config_draft_create(actor="user:sam")
    clash = config_draft_create(actor="user:lee")
    config_draft_patch(
        draft_id=first.pk, changes={"value_lists": {"competitors": {"values": ["a.io"]}}}, actor="t"
    )
    config_draft_patch(
        draft_id=second.pk,
        changes={"teams": {"DACH AE": {"members": [{"rep": "ben@example.com"}]}}},
        actor="t",
    )
    config_draft_patch(
        draft_id=clash.pk, changes={"value_lists": {"competitors": {"values": ["c.io"]}}}, actor="t"
    )
    config_draft_publish(draft_id=first.pk, actor="user:rita")

    rebased = config_draft_rebase(draft_id=second.pk, actor="user:sam")
    assert rebased.base_number == 2
    assert rebased.document["value_lists"] == [{"name": "competitors", "values": ["a.io"]}]
    assert [t["name"] for t in rebased.document["teams"]] == ["EMEA SDR", "DACH AE"]
    assert not draft_diff(draft=rebased).stale
    config_draft_publish(draft_id=second.pk, actor="user:sam")  # no longer stale
    assert ConfigSnapshot.objects.get(number=3).document["value_lists"][0]["values"] == ["a.io"]

    before = ConfigDraft.objects.get(pk=clash.pk).document
    with pytest.raises(DraftRefused) as caught:
        config_draft_rebase(draft_id=clash.pk, actor="user:lee")
    assert caught.value.code == "rebase_conflict"
    assert 'Value list "competitors" was changed both' in caught.value.message
    assert ConfigDraft.objects.get(pk=clash.pk).document == before


def _members(team: str) -> list[str]:
    return list(
        Team.objects.get(name=team)
        .memberships.order_by("position", "id")
        .values_list("rep__email", flat=True)
    )


def test_a_rollback_never_brings_back_a_rep_deleted_since(published):
    """Re-created by e-mail, a rep who left would come back as a new, active row (their live
    state is not in a version) and be given leads: the rollback leaves them out, and says so."""
    config_draft_create(actor="user:rita")  # version 1: Ana and Ben in EMEA SDR
    draft = config_draft_create(actor="user:rita")
    config_draft_patch(
        draft_id=draft.pk,
        changes={"teams": {"EMEA SDR": {"members": [{"rep": "ana@example.com"}]}}},
        actor="t",
    )
    config_draft_publish(draft_id=draft.pk, actor="user:rita")
    Rep.objects.filter(email="ben@example.com").delete()  # Ben left
    result = config_rollback(number=1, actor="user:rita")
    assert list(Rep.objects.values_list("email", flat=True)) == ["ana@example.com"]
    assert _members("EMEA SDR") == ["ana@example.com"]
    assert "ben@example.com" in result.snapshot.note
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    clear_live_config_cache()
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assert Assignment.objects.get(lead=lead).rep.email == "ana@example.com"


def test_a_rollback_finds_a_rep_renamed_since_by_id_and_makes_no_second_row(published):
    from routing.config_api.roster import rep_update

    config_draft_create(actor="user:rita")  # version 1
    ben = Rep.objects.get(email="ben@example.com")
    Rep.objects.filter(pk=ben.pk).update(active=False)  # live state: kept by the rollback
    rep_update(rep_id=ben.pk, values={"email": "benjamin@example.com"}, actor="token:hr")
    assert ConfigSnapshot.objects.count() == 2  # the rename is a version
    config_rollback(number=1, actor="user:rita")
    assert sorted(Rep.objects.values_list("pk", "email", "active")) == sorted(
        [
            (Rep.objects.get(email="ana@example.com").pk, "ana@example.com", True),
            (ben.pk, "ben@example.com", False),  # the same row, its e-mail restored
        ]
    )
    assert _members("EMEA SDR") == ["ana@example.com", "ben@example.com"]
    assert (
        ConfigSnapshot.objects.get(number=3).digest == ConfigSnapshot.objects.get(number=1).digest
    )


def test_a_patchs_errors_name_the_row_by_its_key_not_its_position(published):
    """The bug: a PATCH addresses rows by key, but its errors named list positions
    ("teams[3].strategy"), which the client never sent."""
    draft = config_draft_create(actor="user:rita")
    rule = draft.document["ruleset"]["rules"][-1]
    with pytest.raises(RulesFileErrors) as caught:
        config_draft_patch(
            draft_id=draft.pk,
            changes={
                "teams": {"Late shift": {"strategy": "random"}},
                "rules": {rule["name"]: {**rule, "priority": "first"}},
                "accounts": {"acme.io": {"owner": "nobody@example.com"}},
            },
            actor="t",
        )
    assert sorted(error.path for error in caught.value.errors) == [
        "accounts[domain=acme.io].owner",
        f"ruleset.rules[name={rule['name']}].priority",
        "teams[name=Late shift].strategy",
    ]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=st.text(min_size=1, max_size=30).filter(lambda name: name.strip() == name))
def test_a_patchs_error_path_names_any_rows_key(published, name):
    """Property: whatever the key a PATCH sets a row under, an error in that row is reported
    under that key (or the key itself is what is wrong)."""
    draft = ConfigDraft.objects.filter(status="open").first() or config_draft_create(actor="t")
    with pytest.raises(RulesFileErrors) as caught:
        config_draft_patch(
            draft_id=draft.pk, changes={"teams": {name: {"strategy": "random"}}}, actor="t"
        )
    paths = [error.path for error in caught.value.errors]
    assert f"teams[name={name}].strategy" in paths or all(
        path.startswith(f"teams[name={name}]") for path in paths
    ), paths


def test_a_duplicate_in_a_patch_names_the_other_row_by_its_key_too(published):
    """Found by review: the path named the row by key, but the message still said "also
    rules[0]", a position the client never sent."""
    draft = config_draft_create(actor="t")
    taken = draft.document["ruleset"]["rules"][0]
    copy = {**draft.document["ruleset"]["rules"][-1], "name": "Copy", "priority": taken["priority"]}
    with pytest.raises(RulesFileErrors) as caught:
        config_draft_patch(draft_id=draft.pk, changes={"rules": {"Copy": copy}}, actor="t")
    shown = [f"{error.path}: {error.message}" for error in caught.value.errors]
    assert shown == [
        f"ruleset.rules[name=Copy].priority: duplicate priority {taken['priority']} "
        f"(also rules[name={taken['name']}])"
    ]
