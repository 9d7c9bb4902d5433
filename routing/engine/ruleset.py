"""Compiling a ruleset: every rule validated with a path-precise error, then indexed.

Validation collects *every* problem (for an import to print them all) and raises one
:class:`RuleErrors`. Rule and team references are resolved to ids here, so a decision never
looks a name up. Inactive rules are validated (a saved rule is always valid) but left out of
evaluation and of the trace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from routing.engine.conditions import compile_condition_into
from routing.engine.errors import RuleError, RuleErrors
from routing.engine.operators import Condition, Facts, Test, type_name
from routing.engine.types import OnSlaBreach
from routing.engine.values import text_of

ACTION_TYPES: tuple[str, ...] = ("rep", "team", "territory", "account_owner", "exclude", "tag")
_RULE_KEYS = frozenset(
    {"id", "name", "priority", "when", "action", "sla_minutes", "on_sla_breach", "active"}
)
_RULESET_KEYS = frozenset({"name", "version", "rules"})
_ACTION_KEYS: dict[str, frozenset[str]] = {
    "rep": frozenset({"type", "rep", "ignore_caps"}),
    "team": frozenset({"type", "team"}),
    "territory": frozenset({"type"}),
    "account_owner": frozenset({"type", "fallback_team"}),
    "exclude": frozenset({"type", "reason"}),
    "tag": frozenset({"type", "priority", "sla_minutes", "tags"}),
}


# An SLA longer than a year is a typo; unbounded values overflowed the database and datetimes.
MAX_SLA_MINUTES = 525_600
# The lead's and assignment's priority column (leads.priority.PRIORITY_MAX_LENGTH; the engine
# imports nothing of the apps, tests/routing/engine check the two agree).
PRIORITY_MAX_LENGTH = 50


@dataclass(frozen=True, slots=True)
class RepAction:
    """Assign a named rep if eligible (``ignore_caps`` skips max_open / max_per_day)."""

    rep_id: int
    rep: str
    ignore_caps: bool = False


@dataclass(frozen=True, slots=True)
class TeamAction:
    """Assign a member of a team chosen by the team's strategy."""

    team_id: int
    team: str


@dataclass(frozen=True, slots=True)
class TerritoryAction:
    """Assign the most specific matching territory's rep, or a member of its team."""


@dataclass(frozen=True, slots=True)
class AccountOwnerAction:
    """Assign the matched account's owner if eligible, else a member of the fallback team."""

    fallback_team_id: int | None = None
    fallback_team: str | None = None


@dataclass(frozen=True, slots=True)
class ExcludeAction:
    """Exclude the lead."""

    reason: str | None = None


@dataclass(frozen=True, slots=True)
class TagAction:
    """Record priority, SLA and tags, and let evaluation continue."""

    priority: str | None = None
    sla_minutes: int | None = None
    tags: tuple[str, ...] = ()


Action = RepAction | TeamAction | TerritoryAction | AccountOwnerAction | ExcludeAction | TagAction


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """One validated rule with its compiled condition and resolved action."""

    id: int | None
    name: str
    priority: int
    condition: Condition
    action: Action
    sla_minutes: int | None = None
    on_sla_breach: OnSlaBreach = "notify"
    active: bool = True


class RuleIndex:
    """Rules grouped by the text value their condition requires, so most are never tested.

    A rule whose condition carries a guard (e.g. ``country eq "DE"`` at the top of an ``all``)
    can only match a lead whose field has one of the guard's values; such rules sit in
    ``field -> value -> positions``. Every other rule is always a candidate.
    """

    __slots__ = ("_tables", "_unguarded")

    def __init__(self, rules: Sequence[CompiledRule]) -> None:
        tables: dict[str, dict[str, list[int]]] = {}
        unguarded: list[int] = []
        for position, rule in enumerate(rules):
            guard = rule.condition.guard
            if guard is None:
                unguarded.append(position)
                continue
            name, values = guard
            table = tables.setdefault(name, {})
            for value in values:
                table.setdefault(value, []).append(position)
        self._unguarded: tuple[int, ...] = tuple(unguarded)
        self._tables: tuple[tuple[str, dict[str, tuple[int, ...]]], ...] = tuple(
            (name, {value: tuple(ps) for value, ps in table.items()})
            for name, table in tables.items()
        )

    def candidates(self, facts: Facts) -> Sequence[int]:
        """Positions of the rules that may match these facts, in priority order."""
        buckets: list[tuple[int, ...]] = []
        for name, table in self._tables:
            found = facts.get(name)
            key = found.strip().casefold() if found.__class__ is str else text_of(found)
            if key is not None:
                bucket = table.get(key)
                if bucket:
                    buckets.append(bucket)
        if not buckets:
            return self._unguarded
        # Each input is sorted and a rule sits in one field's table: timsort merges the runs.
        return sorted(chain(self._unguarded, *buckets))


@dataclass(frozen=True, slots=True)
class CompiledRuleset:
    """A validated ruleset: active rules in ascending priority, plus their index."""

    version: int | None
    name: str
    rules: tuple[CompiledRule, ...]
    index: RuleIndex
    # rules[i].condition.test, unpacked once so the hot loop skips two attribute loads per rule
    tests: tuple[Test, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tests", tuple(rule.condition.test for rule in self.rules))

    def candidates(self, facts: Facts) -> Sequence[int]:
        """Positions (into ``rules``) of the rules worth testing for these facts, in order."""
        return self.index.candidates(facts)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Compiler:
    def __init__(
        self,
        value_lists: Mapping[str, Iterable[str]],
        known_teams: Mapping[str, int],
        known_reps: Mapping[str, int],
    ) -> None:
        self.value_lists = value_lists
        self.teams = dict(known_teams)
        self.reps = {email.strip().casefold(): rep_id for email, rep_id in known_reps.items()}
        self.errors: list[RuleError] = []

    def error(self, path: str, message: str) -> None:
        self.errors.append(RuleError(path, message))

    def unknown_keys(self, node: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
        for key in node:
            if key not in allowed:
                self.error(f"{path}.{key}", f'unknown key "{key}"')

    def positive_int(
        self, node: Mapping[str, Any], key: str, path: str, maximum: int = MAX_SLA_MINUTES
    ) -> int | None:
        value = node.get(key)
        if value is None:
            return None
        if not _is_int(value) or not 1 <= value <= maximum:
            self.error(
                f"{path}.{key}", f"must be a whole number from 1 to {maximum}, got {value!r}"
            )
            return None
        return int(value)

    def team(self, value: Any, path: str) -> int | None:
        if not isinstance(value, str) or not value.strip():
            self.error(path, f"must be a team name, got {type_name(value)}")
            return None
        team_id = self.teams.get(value)
        if team_id is None:
            self.error(path, f'unknown team "{value}"')
        return team_id

    def ruleset(self, data: Any) -> CompiledRuleset | None:
        path = "ruleset"
        if not isinstance(data, Mapping):
            self.error(path, f"must be an object, got {type_name(data)}")
            return None
        self.unknown_keys(data, _RULESET_KEYS, path)
        name = data.get("name", "")
        if not isinstance(name, str):
            self.error(f"{path}.name", f"must be text, got {type_name(name)}")
            name = ""
        version = data.get("version")
        if version is not None and not _is_int(version):
            self.error(f"{path}.version", f"must be a whole number, got {type_name(version)}")
            version = None
        raw_rules = data.get("rules")
        if not isinstance(raw_rules, list):
            self.error(f"{path}.rules", f"must be a list of rules, got {type_name(raw_rules)}")
            return None
        rules: list[CompiledRule] = []
        names: dict[str, int] = {}
        priorities: dict[int, int] = {}
        for i, raw in enumerate(raw_rules):
            rule_path = f"{path}.rules[{i}]"
            rule = self.rule(raw, rule_path)
            if isinstance(raw, Mapping):
                # Duplicates are reported on the later rule, naming the earlier one.
                rule_name, priority = raw.get("name"), raw.get("priority")
                if isinstance(rule_name, str) and rule_name.strip():
                    seen = names.setdefault(rule_name.strip(), i)
                    if seen != i:
                        self.error(
                            f"{rule_path}.name",
                            f'duplicate name "{rule_name.strip()}" (also rules[{seen}])',
                        )
                if isinstance(priority, int) and not isinstance(priority, bool):
                    seen = priorities.setdefault(priority, i)
                    if seen != i:
                        self.error(
                            f"{rule_path}.priority",
                            f"duplicate priority {priority} (also rules[{seen}])",
                        )
            if rule is not None:
                rules.append(rule)
        if self.errors:
            return None
        active = tuple(sorted((r for r in rules if r.active), key=lambda r: r.priority))
        return CompiledRuleset(version=version, name=name, rules=active, index=RuleIndex(active))

    def rule(self, raw: Any, path: str) -> CompiledRule | None:
        if not isinstance(raw, Mapping):
            self.error(path, f"must be an object, got {type_name(raw)}")
            return None
        before = len(self.errors)
        self.unknown_keys(raw, _RULE_KEYS, path)
        name = raw.get("name")
        if not isinstance(name, str) or not name.strip():
            self.error(f"{path}.name", f"must be a non-empty name, got {type_name(name)}")
        raw_priority = raw.get("priority")
        priority: int | None = None
        if isinstance(raw_priority, int) and not isinstance(raw_priority, bool):
            priority = raw_priority
        else:
            self.error(f"{path}.priority", f"must be a whole number, got {type_name(raw_priority)}")
        rule_id = raw.get("id")
        if rule_id is not None and not _is_int(rule_id):
            self.error(f"{path}.id", f"must be a whole number, got {type_name(rule_id)}")
        active = raw.get("active", True)
        if not isinstance(active, bool):
            self.error(f"{path}.active", f"must be true or false, got {type_name(active)}")
        sla_minutes = self.positive_int(raw, "sla_minutes", path)
        raw_breach = raw.get("on_sla_breach")
        if raw_breach not in (None, "notify", "reassign"):
            self.error(
                f"{path}.on_sla_breach", f'must be "notify" or "reassign", got {raw_breach!r}'
            )
        on_breach: OnSlaBreach = "reassign" if raw_breach == "reassign" else "notify"
        condition = compile_condition_into(
            raw.get("when"), value_lists=self.value_lists, path=f"{path}.when", errors=self.errors
        )
        action = self.action(raw.get("action"), f"{path}.action")
        if len(self.errors) != before or condition is None or action is None or priority is None:
            return None
        return CompiledRule(
            id=rule_id,
            name=str(name).strip(),
            priority=priority,
            condition=condition,
            action=action,
            sla_minutes=sla_minutes,
            on_sla_breach=on_breach,
            active=active is True,
        )

    def action(self, raw: Any, path: str) -> Action | None:
        if not isinstance(raw, Mapping):
            self.error(path, f"must be an object with a type, got {type_name(raw)}")
            return None
        kind = raw.get("type")
        if kind not in ACTION_TYPES:
            shown = f'"{kind}"' if isinstance(kind, str) else type_name(kind)
            self.error(f"{path}.type", f"unknown action type {shown}")
            return None
        self.unknown_keys(raw, _ACTION_KEYS[kind], path)
        if kind == "rep":
            email = raw.get("rep")
            ignore_caps = raw.get("ignore_caps", False)
            if not isinstance(ignore_caps, bool):
                self.error(
                    f"{path}.ignore_caps", f"must be true or false, got {type_name(ignore_caps)}"
                )
            if not isinstance(email, str) or not email.strip():
                self.error(f"{path}.rep", f"must be a rep's e-mail, got {type_name(email)}")
                return None
            rep_id = self.reps.get(email.strip().casefold())
            if rep_id is None:
                self.error(f"{path}.rep", f'unknown rep "{email}"')
                return None
            return RepAction(rep_id=rep_id, rep=email.strip(), ignore_caps=ignore_caps is True)
        if kind == "team":
            team_id = self.team(raw.get("team"), f"{path}.team")
            return None if team_id is None else TeamAction(team_id, str(raw["team"]))
        if kind == "territory":
            return TerritoryAction()
        if kind == "account_owner":
            fallback = raw.get("fallback_team")
            if fallback is None:
                return AccountOwnerAction()
            team_id = self.team(fallback, f"{path}.fallback_team")
            return None if team_id is None else AccountOwnerAction(team_id, str(fallback))
        if kind == "exclude":
            reason = raw.get("reason")
            if reason is not None and not isinstance(reason, str):
                self.error(f"{path}.reason", f"must be text, got {type_name(reason)}")
                return None
            return ExcludeAction(reason=(reason.strip() or None) if reason else None)
        return self.tag(raw, path)

    def tag(self, raw: Mapping[str, Any], path: str) -> TagAction | None:
        before = len(self.errors)
        priority = raw.get("priority")
        if priority is not None and (not isinstance(priority, str) or not priority.strip()):
            self.error(f"{path}.priority", f"must be non-empty text, got {type_name(priority)}")
        elif isinstance(priority, str) and priority.strip().casefold() == "none":
            # Filters read ?priority=none as "leads without a priority": a priority of that name
            # could never be found.
            self.error(f"{path}.priority", '"none" is reserved for leads without a priority')
        elif isinstance(priority, str) and len(priority.strip()) > PRIORITY_MAX_LENGTH:
            self.error(
                f"{path}.priority",
                f"must be at most {PRIORITY_MAX_LENGTH} characters, got {len(priority.strip())}",
            )
        sla_minutes = self.positive_int(raw, "sla_minutes", path)
        raw_tags = raw.get("tags", [])
        tags: list[str] = []
        if not isinstance(raw_tags, list):
            self.error(f"{path}.tags", f"must be a list of text, got {type_name(raw_tags)}")
        else:
            for i, tag in enumerate(raw_tags):
                if not isinstance(tag, str) or not tag.strip():
                    self.error(f"{path}.tags[{i}]", f"must be non-empty text, got {type_name(tag)}")
                elif tag.strip() not in tags:
                    tags.append(tag.strip())
        if len(self.errors) != before:
            return None
        return TagAction(
            priority=priority.strip() if isinstance(priority, str) else None,
            sla_minutes=sla_minutes,
            tags=tuple(tags),
        )


def compile_ruleset(
    data: Mapping[str, Any],
    *,
    value_lists: Mapping[str, Iterable[str]],
    known_teams: Mapping[str, int],
    known_reps: Mapping[str, int],
) -> CompiledRuleset:
    """Validate and compile a ruleset (the format's ``ruleset`` object); raises RuleErrors.

    ``value_lists`` maps list name -> values; ``known_teams`` team name -> id; ``known_reps``
    rep e-mail (any case) -> id.
    """
    compiler = _Compiler(value_lists, known_teams, known_reps)
    ruleset = compiler.ruleset(data)
    if compiler.errors or ruleset is None:
        raise RuleErrors(compiler.errors or [RuleError("ruleset", "invalid ruleset")])
    return ruleset
