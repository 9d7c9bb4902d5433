"""The import/prune matrix of issue 19: an import with and without ``--prune`` of a file that
adds, changes or removes a row of each section; a removed row live leads still need (refused
under ``--prune`` with the reason, nothing written; kept without it); and after every import,
export -> import -> export byte-identical."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from routing.configuration import configuration_import
from routing.decisions import clear_live_config_cache
from routing.models import Rep
from routing.rules_io import PruneRefused, rules_export
from tests.routing.factories import AssignmentFactory
from tests.routing.test_rules_io import example, row_counts

pytestmark = pytest.mark.django_db

KEYS = {
    "reps": "email",
    "teams": "name",
    "territories": "name",
    "accounts": "domain",
    "value_lists": "name",
    "test_cases": "name",
}


def base() -> dict[str, Any]:
    data = example()
    data["sources"][0].pop("token")
    data["reps"].append({"email": "eve@example.com", "name": "Eve"})
    data["teams"].append({"name": "Spare", "members": [{"rep": "ana@example.com"}]})
    data["accounts"].append({"domain": "initech.com", "name": "Initech"})
    data["value_lists"].append({"name": "partners", "values": ["p.io"]})
    data["test_cases"] = [
        {
            "name": name,
            "lead": {"email": email},
            "expected_status": "excluded",
        }
        for name, email in (("Competitor", "spy@rival.io"), ("Other", "x@othercorp.com"))
    ]
    return data


def _find(data: dict[str, Any], section: str, key: str) -> dict[str, Any] | None:
    for row in data.get(section) or []:
        if str(row[KEYS[section]]).lower() == key.lower():
            return dict(row)
    return None


def _without(data: dict[str, Any], section: str, key: str) -> None:
    data[section] = [r for r in data[section] if str(r[KEYS[section]]).lower() != key.lower()]


# section -> (added row, (key, field, new value) changed, key removed)
ADD: dict[str, dict[str, Any]] = {
    "reps": {"email": "fay@example.com", "name": "Fay"},
    "teams": {"name": "Nordics SDR", "members": [{"rep": "ana@example.com"}]},
    "territories": {"name": "Nordics", "countries": ["SE"], "team": "EMEA SDR"},
    "accounts": {"domain": "globex.com", "name": "Globex"},
    "value_lists": {"name": "partners2", "values": ["q.io"]},
    "test_cases": {"name": "Third", "lead": {"email": "z@rival.io"}, "expected_status": "excluded"},
}
CHANGE: dict[str, tuple[str, str, Any]] = {
    "reps": ("ben@example.com", "name", "Benjamin"),
    "teams": ("Spare", "sla_minutes", 15),
    "territories": ("DACH", "countries", ["DE", "AT"]),
    "accounts": ("initech.com", "name", "Initech Inc"),
    "value_lists": ("partners", "values", ["p.io", "r.io"]),
    "test_cases": ("Competitor", "lead", {"email": "boss@rival.io"}),
}
REMOVE = {
    "reps": "eve@example.com",
    "teams": "Spare",
    "territories": "US West",
    "accounts": "initech.com",
    "value_lists": "partners",
    "test_cases": "Other",
}


def _added(section: str, data: dict[str, Any]) -> str:
    data[section].append(ADD[section])
    return str(ADD[section][KEYS[section]])


def _changed(section: str, data: dict[str, Any]) -> str:
    key, field, value = CHANGE[section]
    for row in data[section]:
        if str(row[KEYS[section]]).lower() == key.lower():
            row[field] = value
    return key


def _removed(section: str, data: dict[str, Any]) -> str:
    _without(data, section, REMOVE[section])
    return REMOVE[section]


EDITS: dict[str, Callable[[str, dict[str, Any]], str]] = {
    "added": _added,
    "changed": _changed,
    "removed": _removed,
}


def _round_trip_is_identical(prune: bool) -> None:
    first = json.dumps(rules_export(), indent=2, ensure_ascii=False)
    configuration_import(data=json.loads(first), publish=True, prune=prune)
    assert json.dumps(rules_export(), indent=2, ensure_ascii=False) == first


@pytest.mark.parametrize("prune", [False, True], ids=["plain", "prune"])
@pytest.mark.parametrize("edit", list(EDITS))
@pytest.mark.parametrize("section", list(KEYS))
def test_import_matrix(section: str, edit: str, prune: bool) -> None:
    clear_live_config_cache()
    configuration_import(data=base(), publish=True)
    data = base()
    key = EDITS[edit](section, data)
    configuration_import(data=data, publish=True, prune=prune)
    stored = _find(rules_export(), section, key)
    if edit == "added":
        assert stored is not None
    elif edit == "changed":
        _key, field, value = CHANGE[section]
        assert stored is not None
        assert stored[field] == value
    else:
        # Without --prune an import never deletes; with it, what the file no longer names goes.
        assert (stored is None) is prune, stored
    _round_trip_is_identical(prune)
    clear_live_config_cache()


@pytest.mark.parametrize("prune", [False, True], ids=["plain", "prune"])
def test_a_removed_row_live_leads_still_need(prune: bool) -> None:
    clear_live_config_cache()
    configuration_import(data=base(), publish=True)
    eve = Rep.objects.get(email="eve@example.com")
    AssignmentFactory(rep=eve)  # an open lead of Eve's
    data = base()
    _without(data, "reps", "eve@example.com")
    data["accounts"][0]["name"] = "Acme Renamed"  # and a change that must not half-apply
    before = row_counts()
    if not prune:
        configuration_import(data=data, publish=True)
        assert Rep.objects.filter(email="eve@example.com").exists()
        _round_trip_is_identical(False)
        return
    with pytest.raises(PruneRefused) as caught:
        configuration_import(data=data, publish=True, prune=True)
    messages = [str(error) for error in caught.value.errors]
    assert (
        'reps: "eve@example.com" is not in the file but owns 1 open lead(s): reassign them first'
        in messages
    ), messages
    assert row_counts() == before
    assert _find(rules_export(), "accounts", "acme.com")["name"] == "Acme"  # type: ignore[index]
    clear_live_config_cache()


def _refuse_rep_with_history(data: dict[str, Any]) -> bool:
    AssignmentFactory(rep=Rep.objects.get(email="eve@example.com"), active=False)  # a closed one
    _without(data, "reps", "eve@example.com")
    data["ruleset"]["rules"] = [r for r in data["ruleset"]["rules"] if r["name"] != "To Eve"]
    return True


def _refuse_value_list_of_a_live_rule(data: dict[str, Any]) -> bool:
    # The file drops the list and the rule using it, but does not publish: the live rule stays.
    _without(data, "value_lists", "competitors")
    data["ruleset"]["rules"] = [
        r for r in data["ruleset"]["rules"] if r["name"] != "Exclude competitors"
    ]
    data["test_cases"] = [c for c in data["test_cases"] if c["name"] != "Competitor"]
    return False


def _refuse_rep_of_a_live_rule(data: dict[str, Any]) -> bool:
    _without(data, "reps", "eve@example.com")
    data["ruleset"]["rules"] = [r for r in data["ruleset"]["rules"] if r["name"] != "To Eve"]
    return False


def _refuse_team_a_kept_row_points_at(data: dict[str, Any]) -> bool:
    # No territories section: the stored ones stay, and "US West" points at the team removed.
    del data["territories"]
    _without(data, "teams", "US West AE")
    return True


TO_EVE = {
    "name": "To Eve",
    "priority": 5,
    "when": {"all": [{"field": "email_domain", "op": "eq", "value": "eve.io"}]},
    "action": {"type": "rep", "rep": "eve@example.com"},
}

# case -> (the file edit: returns whether to publish, the refusal it must give)
REFUSALS: dict[str, tuple[Callable[[dict[str, Any]], bool], str]] = {
    "rep-with-lead-history": (
        _refuse_rep_with_history,
        'reps: "eve@example.com" is not in the file but has 1 assignment(s) in the lead '
        "history, which keeps them: keep the rep in the file (deactivate them in the admin)",
    ),
    "value-list-a-live-rule-uses": (
        _refuse_value_list_of_a_live_rule,
        'value_lists: "competitors" is not in the file but a live rule uses it: publish the '
        "file's rules too",
    ),
    "rep-a-live-rule-names": (
        _refuse_rep_of_a_live_rule,
        'reps: "eve@example.com" is not in the file but a live rule sends leads to them: '
        "publish the file's rules",
    ),
    "team-a-kept-row-points-at": (
        _refuse_team_a_kept_row_points_at,
        'teams: "US West AE" is not in the file but territory "US West" (kept) points at it',
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_prune_refuses_what_live_leads_or_rules_still_need_with_the_reason(case: str) -> None:
    """Each reason ``rules_prune`` refuses for, under --prune: the reason with its section,
    nothing written (not even the file's unrelated change); without --prune the row stays."""
    clear_live_config_cache()
    published = base()
    published["ruleset"]["rules"].insert(0, TO_EVE)
    configuration_import(data=published, publish=True)
    edit, reason = REFUSALS[case]
    data = base()
    data["ruleset"]["rules"].insert(0, TO_EVE)
    publish = edit(data)
    data["accounts"][0]["name"] = "Acme Renamed"  # a change that must not half-apply
    before = row_counts()
    with pytest.raises(PruneRefused) as caught:
        configuration_import(data=data, publish=publish, prune=True)
    messages = [str(error) for error in caught.value.errors]
    assert reason in messages, messages
    assert row_counts() == before
    assert _find(rules_export(), "accounts", "acme.com")["name"] == "Acme"  # type: ignore[index]
    # Without --prune nothing is deleted, so nothing is refused.
    configuration_import(data=data, publish=publish)
    assert _find(rules_export(), "accounts", "acme.com")["name"] == "Acme Renamed"  # type: ignore[index]
    clear_live_config_cache()
