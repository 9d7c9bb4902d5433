"""The look below the top level: canonical values found anywhere in a nested payload.

Used by the generic kind (a tool nobody wrote a decoder for) and as every kind's fallback, so
that a payload whose person sits one level down (``properties.email.value``, ``payload.data``,
``fields[{name, value}]``, a JSON string in a form field) is still recognised as a lead.

The walk is breadth first, so the shallowest value of a field wins, and bounded in nodes,
depth and JSON decoding. It emits only keys that the built-in aliases map to a canonical field,
and it does not enter subtrees that describe someone other than the lead (an owner, a host, the
form's own definition). A ``name`` below the top level counts as the person's name only where
the same object also holds an e-mail or a phone.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from leads.normalize import FULL_NAME, canonical_key
from leads.sources.base import fold_key, json_in, scalar_or_joined

MAX_NODES = 5000
MAX_DEPTH = 12

# Subtrees about another party or about the form, never the lead.
_OTHER_PARTIES = frozenset(
    {
        "owner",
        "owners",
        "assignee",
        "assignedto",
        "agent",
        "author",
        "sender",
        "creator",
        "createdby",
        "updatedby",
        "modifiedby",
        "organizer",
        "organiser",
        "host",
        "hosts",
        "rep",
        "salesrep",
        "accountowner",
        "admin",
        "app",
        "definition",
        "form",
        "portal",
        "useragent",
        "eventmemberships",
        "eventtype",
        "team",
        "account",
        "workspace",
        "hidden",
        "variables",
    }
)
# Key names that hold one of these anywhere describe someone else ("contact_owner",
# "assigned_user", "notification_recipient", "reply_to", "host_email").
_OTHER_PARTY_PARTS = (
    "owner",
    "host",
    "organizer",
    "organiser",
    "assign",
    "recipient",
    "notif",
    "sender",
    "agent",
    "author",
    "creator",
    "replyto",
)


def _other_party(key: str) -> bool:
    folded = fold_key(key)
    return folded in _OTHER_PARTIES or any(part in folded for part in _OTHER_PARTY_PARTS)


_NAME_KEYS = ("name", "key", "field", "label", "title", "id", "question", "field_name", "column_id")
_VALUE_KEYS = ("value", "values", "answer", "string_value", "text", "response")
_PERSON_TARGETS = frozenset({"email", "phone"})


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _name_value(item: dict[str, Any]) -> tuple[str, Any] | None:
    """A {name, value} item of a name/value array, as (name, value)."""
    name = next((item[k] for k in _NAME_KEYS if isinstance(item.get(k), str) and item[k]), None)
    if name is None:
        return None
    for key in _VALUE_KEYS:
        if key in item:
            value = scalar_or_joined(item[key])
            if _is_scalar(value):
                return name, value
    return None


def found_below(record: Any, *, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """{key: value} of canonical values below the top level, one per canonical field.

    ``skip`` names canonical fields already present (at the top level or from a decoder): they
    are not looked for. The keys are the payload's own key names, so the field map and the
    aliases map them as usual.
    """
    found: dict[str, Any] = {}
    targets: set[str] = set(skip)
    queue: deque[tuple[Any, int]] = deque()
    start = json_in(record)
    if isinstance(start, dict | list):
        queue.append((start, 0))
    visited = 0

    def offer(key: str, value: Any) -> None:
        target = canonical_key(key)
        if target is None or target in targets:
            return
        if not _is_scalar(value) or value in (None, ""):
            return
        targets.add(target)
        name = key
        while name in found:
            name = f"{name} "
        found[name] = value

    while queue and visited < MAX_NODES:
        node, depth = queue.popleft()
        visited += 1
        if depth > MAX_DEPTH:
            continue
        if isinstance(node, dict):
            pair = _name_value(node) if depth else None
            if pair is not None:
                offer(*pair)
            has_person = any(
                isinstance(k, str) and canonical_key(k) in _PERSON_TARGETS and _is_scalar(v)
                for k, v in node.items()
            )
            for key, value in node.items():
                if not isinstance(key, str):
                    continue
                if _other_party(key):
                    continue
                value = json_in(value)
                if _is_scalar(value):
                    # The top level's own scalars are the field mapping's business.
                    if depth and (canonical_key(key) != FULL_NAME or has_person):
                        offer(key, value)
                elif isinstance(value, dict):
                    # {"email": {"value": "..."}} and {"company": {"name": "..."}}
                    inner = next(
                        (
                            value[k]
                            for k in ("value", "name", "text")
                            if value.get(k) is not None and _is_scalar(value[k])
                        ),
                        None,
                    )
                    if inner is not None and canonical_key(key) not in (None, FULL_NAME):
                        offer(key, inner)
                    queue.append((value, depth + 1))
                elif isinstance(value, list):
                    unwrapped = scalar_or_joined(value)
                    if (
                        depth
                        and _is_scalar(unwrapped)
                        and canonical_key(key) not in (None, FULL_NAME)
                    ):
                        offer(key, unwrapped)
                    else:
                        queue.append((value, depth + 1))
        elif isinstance(node, list):
            for item in node:
                item = json_in(item)
                if isinstance(item, dict | list):
                    queue.append((item, depth + 1))
    return found
