"""Conditions: every operator's exact semantics, nesting, explanations and validation paths."""

from __future__ import annotations

from typing import Any

import pytest

from routing.engine import RuleError, RuleErrors, compile_condition
from routing.engine.operators import MATCH_INPUT_MAX_LENGTH, Condition

LISTS = {"competitors": ["rival.io", " OtherCorp.com "], "empty": []}


def compiled(node: Any) -> Condition:
    return compile_condition(node, value_lists=LISTS)


def holds(node: Any, facts: dict[str, Any]) -> bool:
    condition = compiled(node)
    result = condition.test(facts)
    # The explanation exists exactly when the condition fails.
    assert (condition.explain(facts) is None) is result
    return result


def leaf(field: str, op: str, value: Any = None) -> dict[str, Any]:
    node: dict[str, Any] = {"field": field, "op": op}
    if value is not None:
        node["value"] = value
    return node


MISSING = object()

# (field, op, value, lead value, expected)
CASES: list[tuple[str, str, Any, Any, bool]] = [
    # eq: text ignores case and surrounding whitespace on both sides
    ("country", "eq", "DE", "DE", True),
    ("country", "eq", "DE", " de ", True),
    ("country", "eq", " De ", "de", True),
    ("country", "eq", "DE", "FR", False),
    ("country", "eq", "DE", None, False),
    ("country", "eq", "DE", MISSING, False),
    ("country", "eq", "DE", "", False),
    ("employees", "eq", 1000, 1000, True),
    ("employees", "eq", 1000, 1000.0, True),
    ("employees", "eq", 1000, " 1000 ", True),
    ("employees", "eq", 1000, "many", False),
    ("employees", "eq", 1000, MISSING, False),
    ("employees", "eq", 1000, True, False),
    ("is_free_email", "eq", True, True, True),
    ("is_free_email", "eq", True, False, False),
    ("is_free_email", "eq", False, False, True),
    ("is_free_email", "eq", True, " TRUE ", True),
    ("is_free_email", "eq", True, None, False),
    ("is_free_email", "eq", True, 1, False),
    ("custom.plan", "eq", "Pro", " pro", True),
    ("custom.seats", "eq", 10, "10", True),
    ("custom.seats", "eq", "10", 10, True),
    ("custom.seats", "eq", "10", 10.0, True),
    ("custom.seats", "eq", 10, "ten", False),
    ("custom.flag", "eq", True, "true", True),
    ("custom.flag", "eq", "yes", ["yes"], False),
    # neq: the exact negation of eq, so a missing value satisfies it
    ("country", "neq", "DE", "FR", True),
    ("country", "neq", "DE", " de ", False),
    ("country", "neq", "DE", MISSING, True),
    ("employees", "neq", 10, "10", False),
    # in / not_in
    ("country", "in", ["DE", "AT", "CH"], "at", True),
    ("country", "in", ["DE", "AT", "CH"], " CH ", True),
    ("country", "in", ["DE", "AT", "CH"], "FR", False),
    ("country", "in", ["DE", "AT", "CH"], MISSING, False),
    ("employees", "in", [10, 20], "20", True),
    ("employees", "in", [10, 20], 20.0, True),
    ("employees", "in", [10, 20], 30, False),
    ("custom.x", "in", ["a", 5, True], 5.0, True),
    ("custom.x", "in", ["a", 5, True], " A ", True),
    ("custom.x", "in", ["a", 5, True], True, True),
    ("custom.x", "in", ["a", 5, True], "b", False),
    ("custom.x", "in", ["a", 5], False, False),
    ("country", "not_in", ["DE"], "FR", True),
    ("country", "not_in", ["DE"], "de", False),
    ("country", "not_in", ["DE"], MISSING, True),
    # contains / not_contains / starts_with / ends_with
    ("title", "contains", "sales", "Head of SALES ", True),
    ("title", "contains", " Sales ", "VP sales", True),
    ("title", "contains", "sales", "CEO", False),
    ("title", "contains", "sales", MISSING, False),
    ("custom.code", "contains", "23", 1234, True),
    ("title", "not_contains", "sales", "CEO", True),
    ("title", "not_contains", "sales", "VP Sales", False),
    ("title", "not_contains", "sales", MISSING, True),
    ("email", "starts_with", "ANA@", "ana@x.com", True),
    ("email", "starts_with", "ana@", "  ana@x.com", True),
    ("email", "starts_with", "ana@", "bob@x.com", False),
    ("email", "starts_with", "ana@", MISSING, False),
    ("email_domain", "ends_with", ".io", "rival.IO ", True),
    ("email_domain", "ends_with", ".io", "x.com", False),
    ("email_domain", "ends_with", ".io", MISSING, False),
    # matches: RE2, a search, ignoring case, on the trimmed text
    ("email", "matches", r"^[a-z]+@rival\.io$", "ANA@RIVAL.IO", True),
    ("title", "matches", "chief|head", "The Head of IT", True),
    ("title", "matches", "^ceo$", "  CEO  ", True),
    ("title", "matches", "^ceo$", "CEO of X", False),
    ("title", "matches", "ceo", MISSING, False),
    ("custom.n", "matches", "^12", 123, True),
    ("title", "matches", "needle", "x" * MATCH_INPUT_MAX_LENGTH + "needle", False),
    ("title", "matches", "needle", "x" * (MATCH_INPUT_MAX_LENGTH - 6) + "needle", True),
    # numeric comparisons: missing or non-numeric is false, never an error
    ("lead_score", "gt", 80, 81, True),
    ("lead_score", "gt", 80, 80, False),
    ("lead_score", "gte", 80, 80, True),
    ("lead_score", "gte", 80, 79.99, False),
    ("lead_score", "lt", 80, 79.5, True),
    ("lead_score", "lt", 80, 80, False),
    ("lead_score", "lte", 80, 80, True),
    ("lead_score", "lte", 80, 80.01, False),
    ("lead_score", "gt", 80, " 85 ", True),
    ("lead_score", "gt", 80, "high", False),
    ("lead_score", "gt", 80, MISSING, False),
    ("lead_score", "gt", 80, None, False),
    ("lead_score", "lt", 80, "", False),
    ("lead_score", "gt", 0, True, False),
    ("lead_score", "gt", 0, "nan", False),
    ("lead_score", "gt", 0, float("nan"), False),
    ("lead_score", "gt", 0, float("inf"), False),
    ("lead_score", "lt", 0, float("-inf"), False),
    ("lead_score", "eq", 5, float("nan"), False),
    ("lead_score", "lt", 0, "-inf", False),
    ("lead_score", "gt", 0.5, 1, True),
    ("custom.seats", "gte", 10, "12", True),
    ("country", "gt", 5, "DE", False),
    ("postal_code", "gte", 90000, "94105", True),
    # between: inclusive at both ends
    ("employees", "between", [10, 100], 10, True),
    ("employees", "between", [10, 100], 100, True),
    ("employees", "between", [10, 100], 101, False),
    ("employees", "between", [10, 100], 9.99, False),
    ("employees", "between", [10, 100], "50", True),
    ("employees", "between", [10, 100], MISSING, False),
    ("employees", "between", [10, 100], "lots", False),
    ("employees", "between", [5, 5], 5, True),
    # exists / not_exists: missing or empty counts as absent; 0 and false are values
    ("phone", "exists", None, "+4930123", True),
    ("phone", "exists", None, "", False),
    ("phone", "exists", None, "   ", False),
    ("phone", "exists", None, None, False),
    ("phone", "exists", None, MISSING, False),
    ("employees", "exists", None, 0, True),
    ("is_free_email", "exists", None, False, True),
    ("custom.tags", "exists", None, [], False),
    ("custom.tags", "exists", None, ["a"], True),
    ("custom.meta", "exists", None, {}, False),
    ("phone", "not_exists", None, "", True),
    ("phone", "not_exists", None, MISSING, True),
    ("phone", "not_exists", None, "+4930123", False),
    # in_list / not_in_list: resolved at compile time, compared as text
    ("email_domain", "in_list", "competitors", "RIVAL.io", True),
    ("email_domain", "in_list", "competitors", "othercorp.com", True),
    ("email_domain", "in_list", "competitors", "x.com", False),
    ("email_domain", "in_list", "competitors", MISSING, False),
    ("email_domain", "in_list", "empty", "x.com", False),
    ("email_domain", "not_in_list", "competitors", "x.com", True),
    ("email_domain", "not_in_list", "competitors", MISSING, True),
    ("email_domain", "not_in_list", "competitors", " Rival.IO", False),
]


@pytest.mark.parametrize(("field", "op", "value", "found", "expected"), CASES)
def test_operator(field: str, op: str, value: Any, found: Any, expected: bool) -> None:
    facts = {} if found is MISSING else {field: found}
    assert holds(leaf(field, op, value), facts) is expected


def test_every_operator_is_covered() -> None:
    from routing.engine import OPERATORS

    assert {op for _f, op, _v, _l, _e in CASES} == set(OPERATORS)


@pytest.mark.parametrize(
    ("node", "facts", "why"),
    [
        (leaf("country", "eq", "DE"), {"country": "FR"}, 'country is "FR", not "DE"'),
        (leaf("country", "eq", "DE"), {}, 'country is missing, not "DE"'),
        (
            leaf("country", "in", ["DE", "AT", "CH"]),
            {"country": "FR"},
            'country is "FR", not in [DE, AT, CH]',
        ),
        (leaf("country", "not_in", ["DE"]), {"country": "DE"}, 'country is "DE", which is in [DE]'),
        (leaf("country", "neq", "DE"), {"country": "de"}, 'country is "de" (must not be)'),
        (leaf("lead_score", "gte", 80), {"lead_score": 42}, "lead_score is 42, below 80"),
        (leaf("lead_score", "gt", 80), {"lead_score": 80}, "lead_score is 80, not above 80"),
        (leaf("lead_score", "lt", 10), {"lead_score": 10}, "lead_score is 10, not below 10"),
        (leaf("lead_score", "lte", 10), {"lead_score": 11}, "lead_score is 11, above 10"),
        (leaf("lead_score", "gt", 80), {}, "lead_score is missing"),
        (leaf("lead_score", "gt", 80), {"lead_score": "hot"}, 'lead_score is "hot", not a number'),
        (
            leaf("employees", "between", [10, 100]),
            {"employees": 5},
            "employees is 5, not between 10 and 100",
        ),
        (leaf("phone", "exists"), {"phone": " "}, "phone is empty"),
        (leaf("phone", "not_exists"), {"phone": "+4930"}, 'phone is set ("+4930")'),
        (
            leaf("title", "contains", "sales"),
            {"title": "CEO"},
            'title is "CEO", does not contain "sales"',
        ),
        (
            leaf("title", "not_contains", "sales"),
            {"title": "VP Sales"},
            'title is "VP Sales", which contains "sales"',
        ),
        (
            leaf("email", "matches", "^a"),
            {"email": "bob@x.io"},
            'email is "bob@x.io", does not match /^a/',
        ),
        (
            leaf("email_domain", "in_list", "competitors"),
            {"email_domain": "x.com"},
            'email_domain is "x.com", not in list "competitors"',
        ),
        (
            leaf("email_domain", "not_in_list", "competitors"),
            {"email_domain": "rival.io"},
            'email_domain is "rival.io", which is in list "competitors"',
        ),
        (
            leaf("company", "eq", "Acme"),
            {"company": "x" * 100},
            'company is "' + "x" * 59 + '…", not "Acme"',
        ),
    ],
)
def test_failure_is_explained(node: dict[str, Any], facts: dict[str, Any], why: str) -> None:
    condition = compiled(node)
    assert condition.test(facts) is False
    assert condition.explain(facts) == why


def test_all_any_not_nesting() -> None:
    node = {
        "all": [
            leaf("country", "in", ["DE", "AT"]),
            {"any": [leaf("lead_score", "gte", 80), leaf("employees", "gte", 1000)]},
            {"not": leaf("email_domain", "in_list", "competitors")},
        ]
    }
    assert holds(node, {"country": "DE", "lead_score": 90, "email_domain": "x.com"})
    assert holds(node, {"country": "at", "employees": 5000})
    assert not holds(node, {"country": "FR", "lead_score": 90})
    assert not holds(node, {"country": "DE", "lead_score": 10, "employees": 10})
    assert not holds(node, {"country": "DE", "lead_score": 90, "email_domain": "rival.io"})
    condition = compiled(node)
    assert condition.explain({"country": "DE", "lead_score": 10, "employees": 10}) == (
        "none of these held: lead_score is 10, below 80; employees is 10, below 1000"
    )
    assert condition.explain({"country": "DE", "lead_score": 90, "email_domain": "rival.io"}) == (
        'email_domain in list "competitors" holds, so `not` fails'
    )
    assert condition.explain({"country": "FR"}) == 'country is "FR", not in [DE, AT]'


def test_double_negation_and_deep_nesting() -> None:
    node: dict[str, Any] = leaf("country", "eq", "DE")
    for _ in range(10):
        node = {"not": {"not": node}}
    assert holds({"all": [{"any": [node]}]}, {"country": "de"})
    assert not holds({"all": [{"any": [node]}]}, {"country": "fr"})


def test_condition_text_describes_the_tree() -> None:
    node = {
        "all": [
            leaf("country", "in", ["DE", "AT"]),
            {"any": [leaf("lead_score", "gte", 80), {"not": leaf("phone", "exists")}]},
        ]
    }
    assert compiled(node).text == ("country in [DE, AT] and (lead_score ≥ 80 or not phone exists)")


def test_none_is_always() -> None:
    condition = compiled(None)
    assert condition.test({}) is True
    assert condition.explain({}) is None


def test_guards_promise_what_the_index_relies_on() -> None:
    assert compiled(leaf("country", "eq", " De ")).guard == ("country", frozenset({"de"}))
    assert compiled(leaf("country", "in", ["DE", "AT"])).guard == (
        "country",
        frozenset({"de", "at"}),
    )
    assert compiled(leaf("email_domain", "in_list", "competitors")).guard == (
        "email_domain",
        frozenset({"rival.io", "othercorp.com"}),
    )
    narrow = {"all": [leaf("country", "in", ["DE", "AT"]), leaf("source", "eq", "web")]}
    assert compiled(narrow).guard == ("source", frozenset({"web"}))
    same_field = {"any": [leaf("country", "eq", "DE"), leaf("country", "eq", "AT")]}
    assert compiled(same_field).guard == ("country", frozenset({"de", "at"}))
    mixed = {"any": [leaf("country", "eq", "DE"), leaf("source", "eq", "web")]}
    assert compiled(mixed).guard is None
    assert compiled(leaf("employees", "eq", 5)).guard is None
    assert compiled(leaf("country", "neq", "DE")).guard is None
    assert compiled({"not": leaf("country", "eq", "DE")}).guard is None
    assert compiled(leaf("custom.x", "in", ["a", 1])).guard is None


def errors_of(node: Any) -> list[str]:
    with pytest.raises(RuleErrors) as caught:
        compile_condition(node, value_lists=LISTS)
    assert isinstance(caught.value, RuleError)  # one base error type
    return [str(error) for error in caught.value.errors]


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (leaf("colour", "eq", "red"), 'when.field: unknown field "colour"'),
        (leaf("custom.", "eq", "red"), 'when.field: unknown field "custom."'),
        (leaf("account.owner", "eq", "x"), 'when.field: unknown field "account.owner"'),
        (leaf("country", "equalz", "DE"), 'when.op: unknown operator "equalz"'),
        ({"field": "country", "value": "DE"}, "when.op: must be an operator, got null"),
        ({"op": "eq", "value": "DE"}, "when.field: must be a field name, got null"),
        (
            leaf("email", "matches", "(unclosed"),
            "when.value: bad regular expression: missing ): (unclosed",
        ),
        (
            leaf("email", "matches", r"(a)\1"),
            r"when.value: bad regular expression: invalid escape sequence: \1",
        ),
        (
            leaf("email", "matches", "a" * 201),
            "when.value: regular expression is 201 characters long, at most 200 allowed",
        ),
        (
            leaf("email", "matches", 5),
            'when.value: "matches" takes a regular expression as text, got a number',
        ),
        (leaf("country", "in", "DE"), 'when.value: "in" takes a list of values, got text'),
        (leaf("country", "not_in", []), 'when.value: "not_in" needs at least one value'),
        (leaf("country", "in", ["DE", 5]), "when.value[1]: must be text, got a number"),
        (leaf("employees", "in", [5, "x"]), "when.value[1]: must be a number, got text"),
        (
            leaf("employees", "between", [1, 2, 3]),
            'when.value: "between" takes exactly 2 numbers [low, high], got 3',
        ),
        (leaf("employees", "between", 5), 'when.value: "between" takes [low, high], got a number'),
        (leaf("employees", "between", [1, "2"]), "when.value[1]: must be a number, got text"),
        (leaf("employees", "between", [9, 2]), "when.value: low 9 is above high 2"),
        (leaf("lead_score", "gt", "80"), 'when.value: "gt" takes a number, got text'),
        (leaf("lead_score", "lte", True), 'when.value: "lte" takes a number, got true/false'),
        (leaf("country", "eq", 5), "when.value: must be text, got a number"),
        (
            leaf("country", "eq", "  "),
            "when.value: must not be empty (use not_exists to test for a missing value)",
        ),
        (leaf("employees", "eq", "5"), "when.value: must be a number, got text"),
        (leaf("is_free_email", "eq", "yes"), "when.value: must be true or false, got text"),
        (
            leaf("custom.x", "eq", [1]),
            "when.value: must be text, a number or true/false, got a list",
        ),
        (leaf("country", "eq"), 'when.value: "eq" needs a value'),
        (leaf("phone", "exists", "yes"), 'when.value: "exists" takes no value'),
        (leaf("title", "contains", 5), 'when.value: "contains" takes text, got a number'),
        (
            leaf("employees", "contains", "5"),
            'when.op: operator "contains" does not apply to number field "employees"',
        ),
        (
            leaf("is_free_email", "gt", 1),
            'when.op: operator "gt" does not apply to yes/no field "is_free_email"',
        ),
        (leaf("email_domain", "in_list", "rivals"), 'when.value: unknown value list "rivals"'),
        (
            leaf("email_domain", "in_list", ["x"]),
            'when.value: "in_list" takes the name of a value list, got a list',
        ),
        ("country eq DE", "when: must be an object, got text"),
        (
            {"all": [leaf("country", "eq", "DE")], "any": []},
            "when: \"all\" must stand alone, found also ['any']",
        ),
        (
            {"all": []},
            "when.all: must list at least one condition (leave `when` out to always match)",
        ),
        (
            {"any": leaf("country", "eq", "DE")},
            "when.any: must be a list of conditions, got an object",
        ),
        ({"not": [leaf("country", "eq", "DE")]}, "when.not: must be an object, got a list"),
        (
            {"field": "country", "op": "eq", "vaule": "DE"},
            'when: unknown key "vaule": a condition is {"all": [...]}, {"any": [...]}, '
            '{"not": {...}} or {"field": ..., "op": ..., "value": ...}',
        ),
        (
            {"all": [leaf("country", "eq", "DE"), {"any": [leaf("country", "equalz", "DE")]}]},
            'when.all[1].any[0].op: unknown operator "equalz"',
        ),
    ],
)
def test_validation_error_paths(node: Any, message: str) -> None:
    assert errors_of(node) == [message]


def test_an_empty_object_lacks_field_and_operator() -> None:
    assert errors_of({}) == [
        "when.field: must be a field name, got null",
        "when.op: must be an operator, got null",
    ]


def test_every_error_in_a_tree_is_reported() -> None:
    node = {
        "any": [
            leaf("colour", "eq", "red"),
            leaf("country", "equalz", "DE"),
            {"not": leaf("lead_score", "gt", "high")},
        ]
    }
    assert errors_of(node) == [
        'when.any[0].field: unknown field "colour"',
        'when.any[1].op: unknown operator "equalz"',
        'when.any[2].not.value: "gt" takes a number, got text',
    ]


def test_depth_is_bounded() -> None:
    node: dict[str, Any] = leaf("country", "eq", "DE")
    for _ in range(40):
        node = {"not": node}
    (message,) = errors_of(node)
    assert message.endswith("conditions nested deeper than 32 levels")


def test_value_lists_are_resolved_when_compiling() -> None:
    lists = {"competitors": ["rival.io"]}
    condition = compile_condition(leaf("email_domain", "in_list", "competitors"), value_lists=lists)
    lists["competitors"].append("late.io")
    assert not condition.test({"email_domain": "late.io"})


@pytest.mark.parametrize(
    "when",
    [
        {"field": "employees", "op": "gte", "value": 10**400},
        {"field": "employees", "op": "between", "value": [1, 10**30]},
        {"field": "employees", "op": "in", "value": [1, -(10**20)]},
    ],
)
def test_a_number_too_large_to_compare_is_a_path_error_not_a_crash(when: dict) -> None:
    """10**400 raised OverflowError (a traceback from the import, a 500 in the admin)."""
    from routing.engine import RuleErrors, compile_condition

    with pytest.raises(RuleErrors) as caught:
        compile_condition(when, value_lists={})
    assert "too large" in str(caught.value)


@pytest.mark.parametrize("text", ["1_000", "١٢٣", "0x10", "Infinity", "1e400", "--1", ""])
def test_only_plain_decimal_text_is_a_number(text: str) -> None:
    from routing.engine.values import number_of

    assert number_of(text) is None


@pytest.mark.parametrize(
    ("text", "number"), [(" 1e3 ", 1000.0), ("-2.5", -2.5), (".5", 0.5), ("7.", 7.0), ("+3", 3.0)]
)
def test_decimal_text_is_read_as_a_number(text: str, number: float) -> None:
    from routing.engine.values import number_of

    assert number_of(text) == number
