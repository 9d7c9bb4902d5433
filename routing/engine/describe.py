"""Rules in words, for people: ``country in DE, AT, CH and employees ≥ 1000``.

Pure and total: any JSON value is described without raising (a malformed part reads as
"(invalid condition)"), so the admin can list a draft whose rules do not compile yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

INVALID = "(invalid condition)"
_SHOWN_ITEMS = 10

_SYMBOLS = {"gt": ">", "gte": "≥", "lt": "<", "lte": "≤"}
_TEXT_VERBS = {
    "contains": "contains",
    "not_contains": "does not contain",
    "starts_with": "starts with",
    "ends_with": "ends with",
}


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return value.strip()
    if value is None:
        return "nothing"
    if isinstance(value, int | float):
        return str(value)
    return INVALID


def _quoted(value: Any) -> str:
    return f'"{value.strip()}"' if isinstance(value, str) else _value(value)


def _values(value: Any) -> str:
    if not isinstance(value, list) or not value:
        return INVALID
    items = [_value(item) for item in value[:_SHOWN_ITEMS]]
    more = len(value) - _SHOWN_ITEMS
    return ", ".join(items) + (f" and {more} more" if more > 0 else "")


def describe_leaf(node: Mapping[str, Any]) -> str:
    """One ``{"field", "op", "value"}`` condition in words."""
    field, op, value = node.get("field"), node.get("op"), node.get("value")
    if not isinstance(field, str) or not field.strip() or not isinstance(op, str):
        return INVALID
    field = field.strip()
    if op == "eq":
        return f"{field} is {_value(value)}"
    if op == "neq":
        return f"{field} is not {_value(value)}"
    if op == "in":
        return f"{field} in {_values(value)}"
    if op == "not_in":
        return f"{field} not in {_values(value)}"
    if op in _TEXT_VERBS:
        return f"{field} {_TEXT_VERBS[op]} {_quoted(value)}"
    if op == "matches":
        return f"{field} matches /{value if isinstance(value, str) else INVALID}/"
    if op in _SYMBOLS:
        return f"{field} {_SYMBOLS[op]} {_value(value)}"
    if op == "between":
        if isinstance(value, list) and len(value) == 2:
            return f"{field} between {_value(value[0])} and {_value(value[1])}"
        return f"{field} between {INVALID}"
    if op == "exists":
        return f"{field} is set"
    if op == "not_exists":
        return f"{field} is empty"
    if op == "in_list":
        return f'{field} in list "{_value(value)}"'
    if op == "not_in_list":
        return f'{field} not in list "{_value(value)}"'
    return f"{field} {op} {_value(value)}"


def _describe(node: Any, depth: int) -> tuple[str, bool]:
    """The words, and whether they join several parts (and need brackets inside another)."""
    if depth > 64 or not isinstance(node, Mapping):
        return INVALID, False
    for combinator, joiner in (("all", " and "), ("any", " or ")):
        if combinator in node:
            children = node[combinator]
            if not isinstance(children, list) or not children:
                return INVALID, False
            parts = [_describe(child, depth + 1) for child in children]
            if len(parts) == 1:
                return parts[0]
            return joiner.join(_grouped(part) for part in parts), True
    if "not" in node:
        return f"not {_grouped(_describe(node['not'], depth + 1))}", False
    return describe_leaf(node), False


def _grouped(part: tuple[str, bool]) -> str:
    text, compound = part
    return f"({text})" if compound else text


def describe_condition(when: Any) -> str:
    """A ``when`` tree in words; ``None`` (no condition) is "always"."""
    if when is None:
        return "always"
    return _describe(when, 0)[0]


def describe_action(action: Any) -> str:
    """A rule's action in words: "team EMEA SDR", "exclude (competitor)", ..."""
    if not isinstance(action, Mapping):
        return "(invalid action)"
    kind = action.get("type")
    if kind == "rep":
        caps = ", ignoring caps" if action.get("ignore_caps") is True else ""
        return f"rep {_value(action.get('rep'))}{caps}"
    if kind == "team":
        return f"team {_value(action.get('team'))}"
    if kind == "territory":
        return "the matching territory's owner"
    if kind == "account_owner":
        fallback = action.get("fallback_team")
        return "the account owner" + (f", else team {_value(fallback)}" if fallback else "")
    if kind == "exclude":
        reason = action.get("reason")
        return "exclude" + (f" ({_value(reason)})" if reason else "")
    if kind == "tag":
        parts = []
        if action.get("priority"):
            parts.append(f"priority {_value(action['priority'])}")
        if action.get("sla_minutes"):
            parts.append(f"SLA {_value(action['sla_minutes'])} min")
        tags = action.get("tags")
        if isinstance(tags, list) and tags:
            parts.append(f"tags {_values(tags)}")
        return "tag" + (f": {', '.join(parts)}" if parts else "") + ", then continue"
    return "(invalid action)"
