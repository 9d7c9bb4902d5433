"""The condition summariser: words for people, total over any input (no database)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routing.engine import compile_condition
from routing.engine.describe import INVALID, describe_action, describe_condition

COUNTRIES = {"field": "country", "op": "in", "value": ["DE", "AT", "CH"]}
BIG = {"field": "employees", "op": "gte", "value": 1000}


def test_the_issue_example() -> None:
    assert describe_condition({"all": [COUNTRIES, BIG]}) == (
        "country in DE, AT, CH and employees ≥ 1000"
    )


@pytest.mark.parametrize(
    ("leaf", "words"),
    [
        ({"field": "country", "op": "eq", "value": "DE"}, "country is DE"),
        ({"field": "country", "op": "neq", "value": " de "}, "country is not de"),
        ({"field": "country", "op": "not_in", "value": ["US"]}, "country not in US"),
        ({"field": "title", "op": "contains", "value": "VP"}, 'title contains "VP"'),
        (
            {"field": "title", "op": "not_contains", "value": "intern"},
            'title does not contain "intern"',
        ),
        ({"field": "email", "op": "starts_with", "value": "ceo"}, 'email starts with "ceo"'),
        ({"field": "email", "op": "ends_with", "value": ".de"}, 'email ends with ".de"'),
        ({"field": "title", "op": "matches", "value": "^(vp|head)"}, "title matches /^(vp|head)/"),
        ({"field": "lead_score", "op": "gt", "value": 80.0}, "lead_score > 80"),
        ({"field": "lead_score", "op": "lt", "value": 2.5}, "lead_score < 2.5"),
        ({"field": "employees", "op": "lte", "value": 50}, "employees ≤ 50"),
        ({"field": "employees", "op": "between", "value": [10, 99]}, "employees between 10 and 99"),
        ({"field": "phone", "op": "exists"}, "phone is set"),
        ({"field": "phone", "op": "not_exists"}, "phone is empty"),
        ({"field": "is_free_email", "op": "eq", "value": True}, "is_free_email is yes"),
        (
            {"field": "email_domain", "op": "in_list", "value": "competitors"},
            'email_domain in list "competitors"',
        ),
        (
            {"field": "email_domain", "op": "not_in_list", "value": "competitors"},
            'email_domain not in list "competitors"',
        ),
    ],
)
def test_each_operator_in_words(leaf: dict[str, Any], words: str) -> None:
    assert describe_condition(leaf) == words


def test_nesting_is_bracketed_and_not_is_said() -> None:
    tree = {
        "any": [
            {"all": [COUNTRIES, BIG]},
            {"not": {"any": [BIG, {"field": "phone", "op": "exists"}]}},
            {"field": "account.tier", "op": "eq", "value": "enterprise"},
        ]
    }
    assert describe_condition(tree) == (
        "(country in DE, AT, CH and employees ≥ 1000) or not (employees ≥ 1000 or phone is set)"
        " or account.tier is enterprise"
    )


def test_no_condition_is_always_and_long_lists_are_cut() -> None:
    assert describe_condition(None) == "always"
    many = {"field": "region", "op": "in", "value": [f"R{i}" for i in range(13)]}
    assert describe_condition(many).endswith("R9 and 3 more")


@pytest.mark.parametrize(
    "broken", [[], {"all": []}, {"any": "x"}, {"field": 3, "op": "eq"}, "text", {"op": "eq"}]
)
def test_malformed_trees_are_described_not_raised(broken: Any) -> None:
    assert INVALID in describe_condition(broken)


@pytest.mark.parametrize(
    ("action", "words"),
    [
        ({"type": "team", "team": "EMEA SDR"}, "team EMEA SDR"),
        (
            {"type": "rep", "rep": "ana@x.example", "ignore_caps": True},
            "rep ana@x.example, ignoring caps",
        ),
        ({"type": "territory"}, "the matching territory's owner"),
        ({"type": "account_owner", "fallback_team": "AE"}, "the account owner, else team AE"),
        ({"type": "exclude", "reason": "competitor"}, "exclude (competitor)"),
        (
            {"type": "tag", "priority": "hot", "sla_minutes": 5, "tags": ["hot"]},
            "tag: priority hot, SLA 5 min, tags hot, then continue",
        ),
        ({"type": "teleport"}, "(invalid action)"),
    ],
)
def test_actions_in_words(action: dict[str, Any], words: str) -> None:
    assert describe_action(action) == words


# --- property: every valid tree is described, without "(invalid", naming each field ----------

_TEXT = st.text(alphabet="abcdefghij", min_size=1, max_size=6)
_NUMBER = st.integers(min_value=-10_000, max_value=10_000)


def _leaves() -> st.SearchStrategy[dict[str, Any]]:
    text_field = st.sampled_from(["country", "title", "email_domain", "account.tier", "source"])
    number_field = st.sampled_from(["employees", "lead_score", "annual_revenue"])
    text_ops = st.sampled_from(
        ["eq", "neq", "contains", "not_contains", "starts_with", "ends_with", "matches"]
    )
    return st.one_of(
        st.builds(lambda f, o, v: {"field": f, "op": o, "value": v}, text_field, text_ops, _TEXT),
        st.builds(
            lambda f, o, v: {"field": f, "op": o, "value": v},
            text_field,
            st.sampled_from(["in", "not_in"]),
            st.lists(_TEXT, min_size=1, max_size=12),
        ),
        st.builds(
            lambda f, o, v: {"field": f, "op": o, "value": v},
            number_field,
            st.sampled_from(["gt", "gte", "lt", "lte", "eq"]),
            _NUMBER,
        ),
        st.builds(
            lambda f, lo, d: {"field": f, "op": "between", "value": [lo, lo + d]},
            number_field,
            _NUMBER,
            st.integers(min_value=0, max_value=100),
        ),
        st.builds(
            lambda f, o: {"field": f, "op": o},
            st.one_of(text_field, number_field),
            st.sampled_from(["exists", "not_exists"]),
        ),
        st.builds(
            lambda f, o: {"field": f, "op": o, "value": "competitors"},
            text_field,
            st.sampled_from(["in_list", "not_in_list"]),
        ),
    )


TREES = st.recursive(
    _leaves(),
    lambda children: st.one_of(
        st.builds(lambda c: {"all": c}, st.lists(children, min_size=1, max_size=4)),
        st.builds(lambda c: {"any": c}, st.lists(children, min_size=1, max_size=4)),
        st.builds(lambda c: {"not": c}, children),
    ),
    max_leaves=12,
)


def _fields(node: dict[str, Any]) -> list[str]:
    if "field" in node:
        return [node["field"]]
    children = node.get("all") or node.get("any") or [node["not"]]
    return [name for child in children for name in _fields(child)]


@given(TREES)
def test_every_valid_tree_is_described(tree: dict[str, Any]) -> None:
    compile_condition(tree, value_lists={"competitors": ["rival.io"]})  # the engine accepts it
    words = describe_condition(tree)
    assert words
    assert INVALID not in words
    for name in _fields(tree):
        assert name in words


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["all", "any", "not", "field", "op", "value", "x"]), inner, max_size=3
        )
    ),
    max_leaves=15,
)


@given(JSON)
def test_any_json_is_described_without_raising(value: Any) -> None:
    assert isinstance(describe_condition(value), str)
    assert isinstance(describe_action(value), str)
