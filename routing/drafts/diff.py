"""Two configuration documents compared row by row, in words (a draft against the published
configuration, or a snapshot against the one before it). Rows are matched by natural key:
source slug, rep e-mail (ignoring case), team, calendar, territory, value list and test case
name, account domain, rule name. A key an entry leaves out is not a change (an import leaves
that field as it is)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from routing.engine.describe import describe_action, describe_condition

KEYS = {
    "sources": "slug",
    "reps": "email",
    "teams": "name",
    "holiday_calendars": "name",
    "territories": "name",
    "accounts": "domain",
    "value_lists": "name",
    "rules": "name",
    "test_cases": "name",
}
NOUNS = {
    "sources": "Source",
    "reps": "Rep",
    "teams": "Team",
    "holiday_calendars": "Holiday calendar",
    "territories": "Territory",
    "accounts": "Account",
    "value_lists": "Value list",
    "rules": "Rule",
    "test_cases": "Test case",
}
_RULE_DEFAULTS = {"when": None, "sla_minutes": None, "on_sla_breach": "notify", "active": True}


@dataclass(frozen=True, slots=True)
class RowChange:
    """One row added, removed or changed: ``fields`` are (field, before, after)."""

    section: str
    key: str
    change: str  # "added", "removed", "changed"
    fields: tuple[tuple[str, Any, Any], ...]
    words: str

    def to_json(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "key": self.key,
            "change": self.change,
            "fields": [
                {"field": name, "before": before, "after": after}
                for name, before, after in self.fields
            ],
            "words": self.words,
        }


def _words(name: str, value: Any) -> str:
    if name == "when":
        return describe_condition(value)
    if name == "action":
        return describe_action(value)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name == "members" and isinstance(value, list):
        return (
            ", ".join(
                f"{m.get('rep')} weight {m.get('weight', 1)}" if isinstance(m, Mapping) else str(m)
                for m in value
            )
            or "no members"
        )
    if isinstance(value, list) and all(isinstance(v, str | int) for v in value):
        return ", ".join(str(v) for v in value) or "none"
    if isinstance(value, str):
        return value or '""'
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _rows(document: Mapping[str, Any], section: str) -> dict[str, dict[str, Any]]:
    if section == "rules":
        ruleset = document.get("ruleset")
        raw = ruleset.get("rules") if isinstance(ruleset, Mapping) else None
    else:
        raw = document.get(section)
    key_field = KEYS[section]
    rows: dict[str, dict[str, Any]] = {}
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get(key_field), str):
            continue
        row = dict(entry)
        if section == "rules":
            row = {**_RULE_DEFAULTS, **row}
        key = row[key_field].strip()
        rows[key.lower() if section == "reps" else key] = row
    return rows


def row_change_words(section: str, before: Mapping[str, Any] | None, after: Any) -> str:
    """What happened to one row between two documents, in words: "removed", "added", or each
    changed field ("values rival.io → a.io")."""
    if after is None:
        return "removed"
    if before is None:
        return "added"
    key_field = KEYS.get(section, "")
    defaults = _RULE_DEFAULTS if section == "rules" else {}
    old, new = {**defaults, **before}, {**defaults, **after}
    fields = [
        f"{f.replace('_', ' ')} {_words(f, old.get(f))} → {_words(f, v)}"
        for f, v in sorted(new.items())
        if f != key_field and old.get(f) != v
    ]
    return "; ".join(fields) or "unchanged"


def configuration_diff(*, before: Mapping[str, Any], after: Mapping[str, Any]) -> list[RowChange]:
    """Every row ``after`` adds, removes or changes compared with ``before``, in words."""
    changes: list[RowChange] = []
    old_ruleset, new_ruleset = before.get("ruleset"), after.get("ruleset")
    old_name = old_ruleset.get("name") if isinstance(old_ruleset, Mapping) else None
    new_name = new_ruleset.get("name") if isinstance(new_ruleset, Mapping) else None
    if old_name != new_name:
        changes.append(
            RowChange(
                section="ruleset",
                key="name",
                change="changed",
                fields=(("name", old_name, new_name),),
                words=f"Ruleset renamed: {_words('name', old_name)} → {_words('name', new_name)}",
            )
        )
    for section, key_field in KEYS.items():
        old_rows, new_rows = _rows(before, section), _rows(after, section)
        noun = NOUNS[section]
        for key, row in new_rows.items():
            shown = row[key_field]
            old = old_rows.get(key)
            if old is None:
                fields = tuple((f, None, v) for f, v in sorted(row.items()) if f != key_field)
                described = "; ".join(
                    f"{f.replace('_', ' ')} {_words(f, v)}" for f, _o, v in fields
                )
                changes.append(
                    RowChange(
                        section=section,
                        key=shown,
                        change="added",
                        fields=fields,
                        words=f'{noun} "{shown}" added' + (f": {described}" if described else ""),
                    )
                )
                continue
            fields = tuple(
                (f, old.get(f), v)
                for f, v in sorted(row.items())
                if old.get(f) != v and not (f == key_field and str(v).lower() == key)
            )
            if fields:
                described = "; ".join(
                    f"{f.replace('_', ' ')} {_words(f, o)} → {_words(f, v)}" for f, o, v in fields
                )
                changes.append(
                    RowChange(
                        section=section,
                        key=shown,
                        change="changed",
                        fields=fields,
                        words=f'{noun} "{shown}": {described}',
                    )
                )
        for key, row in old_rows.items():
            if key not in new_rows:
                shown = row[key_field]
                changes.append(
                    RowChange(
                        section=section,
                        key=shown,
                        change="removed",
                        fields=tuple(
                            (f, v, None) for f, v in sorted(row.items()) if f != key_field
                        ),
                        words=f'{noun} "{shown}" removed',
                    )
                )
    return changes
