"""Compiling rulesets: the spec's example, every error with its exact path, ordering, the index."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from routing.engine import (
    RuleError,
    RuleErrors,
    compile_ruleset,
)
from routing.engine.ruleset import (
    AccountOwnerAction,
    ExcludeAction,
    RepAction,
    TagAction,
    TeamAction,
    TerritoryAction,
)
from tests.routing.engine.factories import KNOWN_REPS, KNOWN_TEAMS, compile_rules, leaf, rule

SPEC = Path(__file__).resolve().parents[4] / "shared" / "spec" / "rules-format.md"


def spec_example() -> dict[str, Any]:
    text = SPEC.read_text()
    example: dict[str, Any] = json.loads(text.split("```json", 1)[1].split("```", 1)[0])
    return example


def errors_of(rules: list[Any]) -> list[str]:
    return ruleset_errors({"name": "x", "rules": rules})


def ruleset_errors(data: Any) -> list[str]:
    with pytest.raises(RuleErrors) as caught:
        compile_ruleset(
            data,
            value_lists={"competitors": ["rival.io"]},
            known_teams=KNOWN_TEAMS,
            known_reps=KNOWN_REPS,
        )
    assert isinstance(caught.value, RuleError)
    assert str(caught.value) == "\n".join(str(e) for e in caught.value.errors)
    return [str(error) for error in caught.value.errors]


TEAM = {"type": "team", "team": "Sales"}


@pytest.mark.skipif(not SPEC.exists(), reason="../shared/spec is not beside the project")
def test_the_spec_example_compiles() -> None:
    example = spec_example()
    ruleset = compile_ruleset(
        example["ruleset"],
        value_lists={v["name"]: v["values"] for v in example["value_lists"]},
        known_teams={"EMEA SDR": 1, "Enterprise AE": 2, "Inbound SDR": 3, "US West AE": 4},
        known_reps={"Ana@Example.com": 1, "bob@example.com": 2, "cai@example.com": 3},
    )
    assert [r.name for r in ruleset.rules] == [
        "Exclude competitors",
        "Hot leads",
        "Named accounts",
        "Enterprise",
        "By territory",
        "Catch-all",
    ]
    actions = [r.action for r in ruleset.rules]
    assert actions[0] == ExcludeAction("competitor")
    assert actions[1] == TagAction(priority="hot", sla_minutes=5, tags=("hot",))
    assert actions[2] == AccountOwnerAction()
    assert actions[3] == TeamAction(2, "Enterprise AE")
    assert actions[4] == TerritoryAction()
    assert actions[5] == TeamAction(3, "Inbound SDR")
    assert ruleset.rules[3].sla_minutes == 30
    assert ruleset.rules[3].on_sla_breach == "reassign"
    assert ruleset.rules[0].on_sla_breach == "notify"


def test_rules_run_in_priority_order_and_inactive_ones_are_left_out() -> None:
    ruleset = compile_rules(
        [
            rule("c", 30, TEAM),
            rule("a", 10, TEAM),
            rule("off", 5, TEAM, active=False),
            rule("b", 20, {"type": "rep", "rep": "BEN@example.com", "ignore_caps": True}, id=7),
        ],
        version=4,
    )
    assert [(r.name, r.priority) for r in ruleset.rules] == [("a", 10), ("b", 20), ("c", 30)]
    assert ruleset.rules[1].action == RepAction(2, "BEN@example.com", ignore_caps=True)
    assert ruleset.rules[1].id == 7
    assert ruleset.version == 4


def test_the_issue_example_path() -> None:
    rules = [rule(f"r{i}", i, TEAM) for i in range(3)]
    rules.append(
        rule(
            "r3",
            3,
            TEAM,
            when={"all": [leaf("country", "equalz", "DE")]},
        )
    )
    assert errors_of(rules) == ['ruleset.rules[3].when.all[0].op: unknown operator "equalz"']


@pytest.mark.parametrize(
    ("bad_rule", "message"),
    [
        (
            rule("r", 1, TEAM, when=leaf("colour", "eq", "x")),
            'rules[0].when.field: unknown field "colour"',
        ),
        (
            rule("r", 1, TEAM, when=leaf("country", "equalz", "x")),
            'rules[0].when.op: unknown operator "equalz"',
        ),
        (
            rule("r", 1, TEAM, when=leaf("email", "matches", "[")),
            "rules[0].when.value: bad regular expression: missing ]: [",
        ),
        (
            rule("r", 1, TEAM, when=leaf("email", "matches", "x" * 300)),
            "rules[0].when.value: regular expression is 300 characters long, at most 200 allowed",
        ),
        (
            rule("r", 1, TEAM, when=leaf("country", "in", "DE")),
            'rules[0].when.value: "in" takes a list of values, got text',
        ),
        (
            rule("r", 1, TEAM, when=leaf("employees", "between", [1, 2, 3])),
            'rules[0].when.value: "between" takes exactly 2 numbers [low, high], got 3',
        ),
        (
            rule("r", 1, TEAM, when=leaf("lead_score", "gt", "hot")),
            'rules[0].when.value: "gt" takes a number, got text',
        ),
        (
            rule("r", 1, TEAM, when=leaf("email_domain", "in_list", "rivals")),
            'rules[0].when.value: unknown value list "rivals"',
        ),
        (
            rule("r", 1, {"type": "team", "team": "Nope"}),
            'rules[0].action.team: unknown team "Nope"',
        ),
        (rule("r", 1, {"type": "team"}), "rules[0].action.team: must be a team name, got null"),
        (
            rule("r", 1, {"type": "rep", "rep": "zed@example.com"}),
            'rules[0].action.rep: unknown rep "zed@example.com"',
        ),
        (
            rule("r", 1, {"type": "rep", "rep": "ana@example.com", "ignore_caps": "yes"}),
            "rules[0].action.ignore_caps: must be true or false, got text",
        ),
        (
            rule("r", 1, {"type": "account_owner", "fallback_team": "Nope"}),
            'rules[0].action.fallback_team: unknown team "Nope"',
        ),
        (rule("r", 1, {"type": "assign"}), 'rules[0].action.type: unknown action type "assign"'),
        (rule("r", 1, {"team": "Sales"}), "rules[0].action.type: unknown action type null"),
        (
            rule("r", 1, {"type": "territory", "team": "Sales"}),
            'rules[0].action.team: unknown key "team"',
        ),
        (
            rule("r", 1, {"type": "exclude", "reason": 5}),
            "rules[0].action.reason: must be text, got a number",
        ),
        (
            rule("r", 1, {"type": "tag", "sla_minutes": 0}),
            "rules[0].action.sla_minutes: must be a whole number from 1 to 525600, got 0",
        ),
        (
            rule("r", 1, {"type": "tag", "tags": "hot"}),
            "rules[0].action.tags: must be a list of text, got text",
        ),
        (
            rule("r", 1, {"type": "tag", "tags": ["hot", ""]}),
            "rules[0].action.tags[1]: must be non-empty text, got text",
        ),
        (
            rule("r", 1, {"type": "tag", "priority": 3}),
            "rules[0].action.priority: must be non-empty text, got a number",
        ),
        (
            rule("r", 1, {"type": "tag", "priority": " None "}),
            'rules[0].action.priority: "none" is reserved for leads without a priority',
        ),
        (
            rule("r", 1, {"type": "tag", "priority": "h" * 51}),
            "rules[0].action.priority: must be at most 50 characters, got 51",
        ),
        ({"name": "r", "priority": 1}, "rules[0].action: must be an object with a type, got null"),
        (rule("", 1, TEAM), "rules[0].name: must be a non-empty name, got text"),
        (rule("r", "1", TEAM), "rules[0].priority: must be a whole number, got text"),  # type: ignore[arg-type]
        (rule("r", True, TEAM), "rules[0].priority: must be a whole number, got true/false"),
        (
            rule("r", 1, TEAM, sla_minutes=-5),
            "rules[0].sla_minutes: must be a whole number from 1 to 525600, got -5",
        ),
        (
            rule("r", 1, TEAM, on_sla_breach="page"),
            'rules[0].on_sla_breach: must be "notify" or "reassign", got \'page\'',
        ),
        (rule("r", 1, TEAM, active="no"), "rules[0].active: must be true or false, got text"),
        (rule("r", 1, TEAM, id="7"), "rules[0].id: must be a whole number, got text"),
        (rule("r", 1, TEAM, colour="red"), 'rules[0].colour: unknown key "colour"'),
        ("rule", "rules[0]: must be an object, got text"),
    ],
)
def test_rule_error_paths(bad_rule: Any, message: str) -> None:
    assert errors_of([bad_rule]) == [f"ruleset.{message}"]


def test_duplicate_priority_and_name_are_reported_on_the_later_rule() -> None:
    assert errors_of(
        [rule("a", 10, TEAM), rule("b", 20, TEAM), rule("c", 10, TEAM), rule("a", 30, TEAM)]
    ) == [
        "ruleset.rules[2].priority: duplicate priority 10 (also rules[0])",
        'ruleset.rules[3].name: duplicate name "a" (also rules[0])',
    ]


def test_inactive_rules_are_validated_too() -> None:
    assert errors_of([rule("r", 1, {"type": "team", "team": "Nope"}, active=False)]) == [
        'ruleset.rules[0].action.team: unknown team "Nope"'
    ]


def test_every_error_of_a_ruleset_is_collected() -> None:
    assert errors_of(
        [
            rule("a", 1, {"type": "team", "team": "Nope"}, when=leaf("colour", "eq", "x")),
            rule("b", 2, TEAM, when={"any": [leaf("country", "in", "DE"), leaf("x", "y")]}),
            rule("a", 1, TEAM),
        ]
    ) == [
        'ruleset.rules[0].when.field: unknown field "colour"',
        'ruleset.rules[0].action.team: unknown team "Nope"',
        'ruleset.rules[1].when.any[0].value: "in" takes a list of values, got text',
        'ruleset.rules[1].when.any[1].field: unknown field "x"',
        'ruleset.rules[1].when.any[1].op: unknown operator "y"',
        'ruleset.rules[2].name: duplicate name "a" (also rules[0])',
        "ruleset.rules[2].priority: duplicate priority 1 (also rules[0])",
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "ruleset: must be an object, got a list"),
        ({"name": "x"}, "ruleset.rules: must be a list of rules, got null"),
        ({"name": "x", "rules": [], "colour": 1}, 'ruleset.colour: unknown key "colour"'),
        ({"name": 5, "rules": []}, "ruleset.name: must be text, got a number"),
        (
            {"name": "x", "version": "2", "rules": []},
            "ruleset.version: must be a whole number, got text",
        ),
    ],
)
def test_ruleset_error_paths(data: Any, message: str) -> None:
    assert ruleset_errors(data) == [message]


def test_an_empty_ruleset_compiles() -> None:
    assert compile_rules([]).rules == ()


def test_rule_errors_is_a_rule_error_with_the_first_path() -> None:
    error = RuleErrors([RuleError("a.b", "first"), RuleError("c", "second")])
    assert (error.path, error.message) == ("a.b", "first")
    assert str(error) == "a.b: first\nc: second"
    with pytest.raises(ValueError, match="at least one"):
        RuleErrors([])


def test_the_index_skips_rules_whose_required_value_differs() -> None:
    ruleset = compile_rules(
        [
            rule("de", 1, TEAM, when=leaf("country", "eq", "DE")),
            rule(
                "dach",
                2,
                TEAM,
                when={"all": [leaf("country", "in", ["DE", "AT"]), leaf("lead_score", "gt", 1)]},
            ),
            rule("score", 3, TEAM, when=leaf("lead_score", "gt", 1)),
            rule("web", 4, TEAM, when=leaf("source", "eq", "Web")),
            rule("comp", 5, TEAM, when=leaf("email_domain", "in_list", "competitors")),
            rule("all", 6, TEAM),
        ]
    )
    assert list(ruleset.candidates({"country": "at"})) == [1, 2, 5]
    assert list(ruleset.candidates({"country": " DE ", "source": "web"})) == [0, 1, 2, 3, 5]
    assert list(ruleset.candidates({"email_domain": "Rival.io"})) == [2, 4, 5]
    assert list(ruleset.candidates({})) == [2, 5]


def test_sla_minutes_are_bounded_with_a_path():
    from routing.engine import RuleErrors, compile_ruleset
    from routing.engine.ruleset import MAX_SLA_MINUTES

    data = {
        "rules": [
            {
                "name": "Slow",
                "priority": 1,
                "sla_minutes": MAX_SLA_MINUTES + 1,
                "action": {"type": "exclude"},
            },
            {"name": "Tag", "priority": 2, "action": {"type": "tag", "sla_minutes": 3_000_000_000}},
        ]
    }
    with pytest.raises(RuleErrors) as caught:
        compile_ruleset(data, value_lists={}, known_teams={}, known_reps={})
    text = str(caught.value)
    assert "rules[0].sla_minutes" in text
    assert "rules[1].action.sla_minutes" in text


def test_the_engines_priority_bound_is_the_columns() -> None:
    from leads.priority import PRIORITY_MAX_LENGTH as COLUMN
    from routing.engine.ruleset import PRIORITY_MAX_LENGTH

    assert PRIORITY_MAX_LENGTH == COLUMN
    compile_rules([rule("r", 1, {"type": "tag", "priority": "h" * COLUMN})])  # no error
