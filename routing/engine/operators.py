"""Condition leaves: the whitelist of operators and each one's exact semantics, compiled once.

Semantics (rules-format.md, "Conditions"):
- Text comparisons ignore case and surrounding whitespace, on both sides. A text value compares
  as text: a number the lead holds compares by its plain form (``1000.0`` reads ``"1000"``).
- A number value compares numerically (numeric text such as ``"85"`` counts); a yes/no value
  compares with booleans (or the text ``"true"``/``"false"``).
- Numeric operators (``gt``, ``gte``, ``lt``, ``lte``, ``between``) on a missing or non-numeric
  value are false. ``between`` is inclusive.
- The negative operators (``neq``, ``not_in``, ``not_contains``, ``not_in_list``) are the exact
  negation of their positive twin, so a missing value satisfies them.
- ``exists`` / ``not_exists``: missing or empty (blank text, empty list) counts as not existing.
- ``matches`` searches anywhere in the trimmed text, ignoring case, with RE2 (linear time); the
  pattern is at most 200 characters and the text is cut to 10,000 characters first. Anchor with
  ``^``/``$`` for a whole-value match.
- ``in_list`` / ``not_in_list`` name a value list, resolved when compiling: recompile the
  ruleset when a list changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import re2

from routing.engine.errors import RuleError
from routing.engine.fields import FieldKind, field_kind
from routing.engine.values import bool_of, is_empty, number_of, shown, text_of

Facts = Mapping[str, Any]
Test = Callable[[Facts], bool]
Explain = Callable[[Facts], "str | None"]
Guard = tuple[str, frozenset[str]]

PATTERN_MAX_LENGTH = 200
MATCH_INPUT_MAX_LENGTH = 10_000

OPERATORS: tuple[str, ...] = (
    "eq",
    "neq",
    "in",
    "not_in",
    "contains",
    "not_contains",
    "starts_with",
    "ends_with",
    "matches",
    "gt",
    "gte",
    "lt",
    "lte",
    "between",
    "exists",
    "not_exists",
    "in_list",
    "not_in_list",
)
_TEXT_ONLY = frozenset({"contains", "not_contains", "starts_with", "ends_with", "matches"})
_LEAF_KEYS = frozenset({"field", "op", "value"})
_SHOWN_LIST_ITEMS = 10


@dataclass(frozen=True, slots=True)
class Condition:
    """A compiled condition: a fast test, its explanation, its text, and an index guard.

    ``guard`` (field, texts) promises the condition can hold only when the field's text form is
    one of ``texts``; the ruleset index uses it to skip rules without testing them.
    """

    test: Test
    explain: Explain
    text: str
    guard: Guard | None = None


def no_failure(facts: Facts) -> str | None:
    """The explanation of a condition that cannot fail."""
    return None


def compile_leaf(
    node: Mapping[str, Any],
    path: str,
    value_lists: Mapping[str, Iterable[str]],
    folded_lists: dict[str, frozenset[str]],
    errors: list[RuleError],
) -> Condition | None:
    """Validate and compile one leaf; on a problem append it to ``errors`` and return None."""
    unknown = sorted(str(key) for key in node if key not in _LEAF_KEYS)
    if unknown:
        errors.append(
            RuleError(
                path,
                f'unknown key "{unknown[0]}": a condition is {{"all": [...]}}, {{"any": [...]}}, '
                '{"not": {...}} or {"field": ..., "op": ..., "value": ...}',
            )
        )
        return None
    field, op = node.get("field"), node.get("op")
    kind: FieldKind | None = None
    ok = True
    if not isinstance(field, str):
        errors.append(RuleError(f"{path}.field", f"must be a field name, got {type_name(field)}"))
        ok = False
    else:
        kind = field_kind(field)
        if kind is None:
            errors.append(RuleError(f"{path}.field", f'unknown field "{field}"'))
            ok = False
    if not isinstance(op, str):
        errors.append(RuleError(f"{path}.op", f"must be an operator, got {type_name(op)}"))
        return None
    if op not in OPERATORS:
        errors.append(RuleError(f"{path}.op", f'unknown operator "{op}"'))
        return None
    if not ok or kind is None or not isinstance(field, str):
        return None
    if kind is FieldKind.BOOLEAN and op not in (
        "eq",
        "neq",
        "in",
        "not_in",
        "exists",
        "not_exists",
    ):
        errors.append(
            RuleError(f"{path}.op", f'operator "{op}" does not apply to yes/no field "{field}"')
        )
        return None
    if kind is FieldKind.NUMBER and op in _TEXT_ONLY:
        errors.append(
            RuleError(f"{path}.op", f'operator "{op}" does not apply to number field "{field}"')
        )
        return None
    value_path = f"{path}.value"
    value = node.get("value")
    has_value = "value" in node and value is not None
    builder = _BUILDERS[op]
    if op in ("exists", "not_exists"):
        if has_value:
            errors.append(RuleError(value_path, f'"{op}" takes no value'))
            return None
    elif not has_value:
        errors.append(RuleError(value_path, f'"{op}" needs a value'))
        return None
    try:
        return builder(field, kind, value, value_lists, folded_lists)
    except RuleError as error:
        suffix = error.path
        errors.append(RuleError(value_path + suffix, error.message))
        return None


# A builder raises RuleError("", message) for a bad value; the caller prefixes the value's path
# (a list item's index becomes "[i]").
_Builder = Callable[
    [str, FieldKind, Any, Mapping[str, Iterable[str]], dict[str, frozenset[str]]], Condition
]


def type_name(value: Any) -> str:
    """What a JSON value is, in an error message's words ("text", "a number", "a list")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int) and abs(value) > 2**53:
        return "a number too large to compare exactly (at most 9007199254740992)"
    if isinstance(value, float) and not math.isfinite(value):
        return "a number that is not finite"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


# Numbers in rules are compared as floats: an integer beyond 2**53 could not be compared exactly
# (and one beyond 1e308 cannot even be converted), so rules refuse them.
_LARGEST_EXACT_INT = 2**53


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= _LARGEST_EXACT_INT
    return isinstance(value, float) and math.isfinite(value)


def _check_scalar(kind: FieldKind, value: Any, where: str = "") -> None:
    if kind is FieldKind.TEXT:
        if not isinstance(value, str):
            raise RuleError(where, f"must be text, got {type_name(value)}")
    elif kind is FieldKind.NUMBER:
        if not _is_number(value):
            raise RuleError(where, f"must be a number, got {type_name(value)}")
    elif kind is FieldKind.BOOLEAN:
        if not isinstance(value, bool):
            raise RuleError(where, f"must be true or false, got {type_name(value)}")
    elif not (isinstance(value, str | bool) or _is_number(value)):
        raise RuleError(where, f"must be text, a number or true/false, got {type_name(value)}")
    if isinstance(value, str) and not value.strip():
        raise RuleError(where, "must not be empty (use not_exists to test for a missing value)")


def _check_text(op: str, value: Any) -> str:
    if not isinstance(value, str):
        raise RuleError("", f'"{op}" takes text, got {type_name(value)}')
    if not value.strip():
        raise RuleError("", "must not be empty")
    return value


def _check_number(op: str, value: Any) -> int | float:
    if not _is_number(value):
        raise RuleError("", f'"{op}" takes a number, got {type_name(value)}')
    return value


def _show_target(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value.strip()}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _show_list(values: list[Any]) -> str:
    items = [v.strip() if isinstance(v, str) else _show_target(v) for v in values]
    if len(items) > _SHOWN_LIST_ITEMS:
        more = len(items) - _SHOWN_LIST_ITEMS
        return "[" + ", ".join(items[:_SHOWN_LIST_ITEMS]) + f", … {more} more]"
    return "[" + ", ".join(items) + "]"


def _leaf(
    key: str,
    test: Test,
    fail: Callable[[Any], str],
    text: str,
    guard: Guard | None = None,
) -> Condition:
    def explain(facts: Facts) -> str | None:
        return None if test(facts) else fail(facts.get(key))

    return Condition(test=test, explain=explain, text=text, guard=guard)


def _negated(key: str, positive: Condition, fail: Callable[[Any], str], text: str) -> Condition:
    positive_test = positive.test

    def test(facts: Facts) -> bool:
        return not positive_test(facts)

    return _leaf(key, test, fail, text)


def _equality_test(key: str, kind: FieldKind, value: Any) -> Test:
    if isinstance(value, str):
        target = value.strip().casefold()

        def text_test(facts: Facts) -> bool:
            found = facts.get(key)
            if found.__class__ is str:
                return found.strip().casefold() == target
            return text_of(found) == target

        return text_test
    if isinstance(value, bool):
        flag = value

        def bool_test(facts: Facts) -> bool:
            return bool_of(facts.get(key)) is flag

        return bool_test
    number = value

    def number_test(facts: Facts) -> bool:
        found = number_of(facts.get(key))
        return found is not None and found == number

    return number_test


def _build_eq(
    key: str,
    kind: FieldKind,
    value: Any,
    value_lists: Mapping[str, Iterable[str]],
    folded: dict[str, frozenset[str]],
) -> Condition:
    _check_scalar(kind, value)
    target = _show_target(value)
    guard = (key, frozenset({value.strip().casefold()})) if isinstance(value, str) else None
    return _leaf(
        key,
        _equality_test(key, kind, value),
        lambda found: f"{key} is {shown(found)}, not {target}",
        f"{key} is {target}",
        guard,
    )


def _build_neq(
    key: str,
    kind: FieldKind,
    value: Any,
    value_lists: Mapping[str, Iterable[str]],
    folded: dict[str, frozenset[str]],
) -> Condition:
    positive = _build_eq(key, kind, value, value_lists, folded)
    target = _show_target(value)
    return _negated(
        key,
        positive,
        lambda found: f"{key} is {shown(found)} (must not be)",
        f"{key} is not {target}",
    )


def _membership_test(key: str, kind: FieldKind, values: list[Any]) -> tuple[Test, Guard | None]:
    texts = frozenset(v.strip().casefold() for v in values if isinstance(v, str))
    flags = frozenset(v for v in values if isinstance(v, bool))
    numbers = frozenset(v for v in values if _is_number(v))
    if not flags and not numbers:

        def text_test(facts: Facts) -> bool:
            found = facts.get(key)
            if found.__class__ is str:
                return found.strip().casefold() in texts
            return text_of(found) in texts

        return text_test, (key, texts)

    def mixed_test(facts: Facts) -> bool:
        found = facts.get(key)
        if texts and text_of(found) in texts:
            return True
        if numbers:
            number = number_of(found)
            if number is not None and number in numbers:
                return True
        return bool(flags) and bool_of(found) in flags

    return mixed_test, None


def _check_list(op: str, kind: FieldKind, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise RuleError("", f'"{op}" takes a list of values, got {type_name(value)}')
    if not value:
        raise RuleError("", f'"{op}" needs at least one value')
    for i, item in enumerate(value):
        _check_scalar(kind, item, f"[{i}]")
    return value


def _build_in(
    key: str,
    kind: FieldKind,
    value: Any,
    value_lists: Mapping[str, Iterable[str]],
    folded: dict[str, frozenset[str]],
) -> Condition:
    values = _check_list("in", kind, value)
    test, guard = _membership_test(key, kind, values)
    listed = _show_list(values)
    return _leaf(
        key,
        test,
        lambda found: f"{key} is {shown(found)}, not in {listed}",
        f"{key} in {listed}",
        guard,
    )


def _build_not_in(
    key: str,
    kind: FieldKind,
    value: Any,
    value_lists: Mapping[str, Iterable[str]],
    folded: dict[str, frozenset[str]],
) -> Condition:
    values = _check_list("not_in", kind, value)
    test, _guard = _membership_test(key, kind, values)
    listed = _show_list(values)
    positive = Condition(test=test, explain=no_failure, text="")
    return _negated(
        key,
        positive,
        lambda found: f"{key} is {shown(found)}, which is in {listed}",
        f"{key} not in {listed}",
    )


def _text_op(
    op: str, key: str, value: Any, relation: Callable[[str, str], bool], verb: str
) -> tuple[Condition, str]:
    needle = _check_text(op, value).strip().casefold()
    target = f'"{value.strip()}"'

    def test(facts: Facts) -> bool:
        found = facts.get(key)
        text = found.strip().casefold() if found.__class__ is str else text_of(found)
        return text is not None and relation(text, needle)

    condition = _leaf(
        key,
        test,
        lambda found: f"{key} is {shown(found)}, does not {verb} {target}",
        f"{key} {verb}s {target}",
    )
    return condition, target


def _build_contains(key: str, kind: FieldKind, value: Any, *_: Any) -> Condition:
    return _text_op("contains", key, value, str.__contains__, "contain")[0]


def _build_not_contains(key: str, kind: FieldKind, value: Any, *_: Any) -> Condition:
    positive, target = _text_op("not_contains", key, value, str.__contains__, "contain")
    return _negated(
        key,
        positive,
        lambda found: f"{key} is {shown(found)}, which contains {target}",
        f"{key} does not contain {target}",
    )


def _build_starts_with(key: str, kind: FieldKind, value: Any, *_: Any) -> Condition:
    return _text_op("starts_with", key, value, str.startswith, "start with")[0]


def _build_ends_with(key: str, kind: FieldKind, value: Any, *_: Any) -> Condition:
    return _text_op("ends_with", key, value, str.endswith, "end with")[0]


def _regex_options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # errors are reported to the user as a RuleError instead
    options.case_sensitive = False
    options.never_capture = True
    return options


_REGEX_OPTIONS = _regex_options()


def _build_matches(key: str, kind: FieldKind, value: Any, *_: Any) -> Condition:
    if not isinstance(value, str):
        raise RuleError("", f'"matches" takes a regular expression as text, got {type_name(value)}')
    if not value:
        raise RuleError("", "the regular expression must not be empty")
    if len(value) > PATTERN_MAX_LENGTH:
        raise RuleError(
            "",
            f"regular expression is {len(value)} characters long, "
            f"at most {PATTERN_MAX_LENGTH} allowed",
        )
    try:
        search = re2.compile(value, _REGEX_OPTIONS).search
    except re2.error as error:
        detail = error.args[0] if error.args else error
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise RuleError("", f"bad regular expression: {detail}") from None
    limit = MATCH_INPUT_MAX_LENGTH

    def test(facts: Facts) -> bool:
        found = facts.get(key)
        if found.__class__ is not str:
            found = text_of(found)
            if found is None:
                return False
        # Cut first: a huge value costs no more than 10,000 characters of (linear) matching.
        return search(found[:limit].strip()) is not None

    return _leaf(
        key,
        test,
        lambda found: f"{key} is {shown(found)}, does not match /{value}/",
        f"{key} matches /{value}/",
    )


def _numeric_fail(key: str, relation: str) -> Callable[[Any], str]:
    def fail(found: Any) -> str:
        if is_empty(found):
            return f"{key} is {shown(found)}"
        if number_of(found) is None:
            return f"{key} is {shown(found)}, not a number"
        return f"{key} is {shown(found)}, {relation}"

    return fail


def _numeric_test(key: str, op: str, limit: float) -> Test:
    # One closure per operator with the comparison inline, and plain numbers skipping
    # number_of(): this leaf is what a scan runs once per rule when no index applies.
    if op == "gt":

        def test(facts: Facts) -> bool:
            found: Any = facts.get(key)
            cls = found.__class__
            if cls is not int and not (cls is float and -_INF < found < _INF):
                found = number_of(found)
                if found is None:
                    return False
            return found > limit

    elif op == "gte":

        def test(facts: Facts) -> bool:
            found: Any = facts.get(key)
            cls = found.__class__
            if cls is not int and not (cls is float and -_INF < found < _INF):
                found = number_of(found)
                if found is None:
                    return False
            return found >= limit

    elif op == "lt":

        def test(facts: Facts) -> bool:
            found: Any = facts.get(key)
            cls = found.__class__
            if cls is not int and not (cls is float and -_INF < found < _INF):
                found = number_of(found)
                if found is None:
                    return False
            return found < limit

    else:

        def test(facts: Facts) -> bool:
            found: Any = facts.get(key)
            cls = found.__class__
            if cls is not int and not (cls is float and -_INF < found < _INF):
                found = number_of(found)
                if found is None:
                    return False
            return found <= limit

    return test


_INF = math.inf
_RELATIONS = {
    "gt": ("not above {}", ">"),
    "gte": ("below {}", "≥"),
    "lt": ("not below {}", "<"),
    "lte": ("above {}", "≤"),
}


def _build_comparison(op: str) -> _Builder:
    def build(key: str, kind: FieldKind, value: Any, *_: Any) -> Condition:
        limit = _check_number(op, value)
        relation, symbol = _RELATIONS[op]
        return _leaf(
            key,
            _numeric_test(key, op, limit),
            _numeric_fail(key, relation.format(limit)),
            f"{key} {symbol} {limit}",
        )

    return build


def _build_between(key: str, kind: FieldKind, value: Any, *_: Any) -> Condition:
    if not isinstance(value, list):
        raise RuleError("", f'"between" takes [low, high], got {type_name(value)}')
    if len(value) != 2:
        raise RuleError("", f'"between" takes exactly 2 numbers [low, high], got {len(value)}')
    for i, item in enumerate(value):
        if not _is_number(item):
            raise RuleError(f"[{i}]", f"must be a number, got {type_name(item)}")
    low, high = value
    if low > high:
        raise RuleError("", f"low {low} is above high {high}")

    def test(facts: Facts) -> bool:
        found = number_of(facts.get(key))
        return found is not None and low <= found <= high

    return _leaf(
        key,
        test,
        _numeric_fail(key, f"not between {low} and {high}"),
        f"{key} between {low} and {high}",
    )


def _build_exists(key: str, kind: FieldKind, value: Any, *_: Any) -> Condition:
    def test(facts: Facts) -> bool:
        return not is_empty(facts.get(key))

    return _leaf(key, test, lambda found: f"{key} is {shown(found)}", f"{key} exists")


def _build_not_exists(key: str, kind: FieldKind, value: Any, *_: Any) -> Condition:
    def test(facts: Facts) -> bool:
        return is_empty(facts.get(key))

    return _leaf(key, test, lambda found: f"{key} is set ({shown(found)})", f"{key} does not exist")


def _resolve_list(
    op: str,
    value: Any,
    value_lists: Mapping[str, Iterable[str]],
    folded: dict[str, frozenset[str]],
) -> tuple[str, frozenset[str]]:
    if not isinstance(value, str):
        raise RuleError("", f'"{op}" takes the name of a value list, got {type_name(value)}')
    if value not in value_lists:
        raise RuleError("", f'unknown value list "{value}"')
    if value not in folded:
        folded[value] = frozenset(
            text for text in (text_of(item) for item in value_lists[value]) if text
        )
    return value, folded[value]


def _build_in_list(
    key: str,
    kind: FieldKind,
    value: Any,
    value_lists: Mapping[str, Iterable[str]],
    folded: dict[str, frozenset[str]],
) -> Condition:
    name, members = _resolve_list("in_list", value, value_lists, folded)

    def test(facts: Facts) -> bool:
        found = facts.get(key)
        if found.__class__ is str:
            return found.strip().casefold() in members
        return text_of(found) in members

    return _leaf(
        key,
        test,
        lambda found: f'{key} is {shown(found)}, not in list "{name}"',
        f'{key} in list "{name}"',
        (key, members),
    )


def _build_not_in_list(
    key: str,
    kind: FieldKind,
    value: Any,
    value_lists: Mapping[str, Iterable[str]],
    folded: dict[str, frozenset[str]],
) -> Condition:
    positive = _build_in_list(key, kind, value, value_lists, folded)
    name = value
    return _negated(
        key,
        positive,
        lambda found: f'{key} is {shown(found)}, which is in list "{name}"',
        f'{key} not in list "{name}"',
    )


_BUILDERS: dict[str, _Builder] = {
    "eq": _build_eq,
    "neq": _build_neq,
    "in": _build_in,
    "not_in": _build_not_in,
    "contains": _build_contains,
    "not_contains": _build_not_contains,
    "starts_with": _build_starts_with,
    "ends_with": _build_ends_with,
    "matches": _build_matches,
    "gt": _build_comparison("gt"),
    "gte": _build_comparison("gte"),
    "lt": _build_comparison("lt"),
    "lte": _build_comparison("lte"),
    "between": _build_between,
    "exists": _build_exists,
    "not_exists": _build_not_exists,
    "in_list": _build_in_list,
    "not_in_list": _build_not_in_list,
}
