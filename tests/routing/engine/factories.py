"""Plain-data builders for the engine tests: reps, teams, rulesets and a one-call `run`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from routing.engine import (
    Decision,
    LeadFacts,
    RepState,
    RotationState,
    TeamSpec,
    TerritoryIndex,
    TerritorySpec,
    compile_ruleset,
    decide,
)
from routing.engine.ruleset import CompiledRuleset

# A Monday, 10:00 UTC.
NOW = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)

NAMES = ["Ana", "Ben", "Cai", "Dee", "Eli", "Fay"]


def rep(rep_id: int, **changes: Any) -> RepState:
    """Rep ``rep_id`` (1 = Ana, 2 = Ben, ...), available and uncapped unless told."""
    name = NAMES[rep_id - 1] if rep_id <= len(NAMES) else f"Rep{rep_id}"
    return RepState(id=rep_id, email=f"{name.lower()}@example.com", name=name, **changes)


def reps(*states: RepState, count: int = 6) -> dict[int, RepState]:
    """Reps 1..count, with the given states replacing the defaults."""
    table = {i: rep(i) for i in range(1, count + 1)}
    table.update({state.id: state for state in states})
    return table


def team(team_id: int, name: str, *members: int | tuple[int, int], **changes: Any) -> TeamSpec:
    """A team of the given members (rep id, or (rep id, weight))."""
    pairs = tuple(m if isinstance(m, tuple) else (m, 1) for m in members)
    return TeamSpec(id=team_id, name=name, members=pairs, **changes)


KNOWN_TEAMS = {"Sales": 1, "Enterprise": 2, "Fallback": 3, "Nobody": 9}
KNOWN_REPS = {f"{name.lower()}@example.com": i for i, name in enumerate(NAMES, start=1)}


def compile_rules(
    rules: Sequence[Mapping[str, Any]],
    *,
    value_lists: Mapping[str, Iterable[str]] | None = None,
    version: int | None = 1,
) -> CompiledRuleset:
    """Compile rules with the test teams, reps and value lists."""
    data: dict[str, Any] = {"name": "test", "rules": list(rules)}
    if version is not None:
        data["version"] = version
    return compile_ruleset(
        data,
        value_lists=value_lists if value_lists is not None else {"competitors": ["rival.io"]},
        known_teams=KNOWN_TEAMS,
        known_reps=KNOWN_REPS,
    )


def rule(
    name: str, priority: int, action: Mapping[str, Any], when: Any = None, **extra: Any
) -> dict[str, Any]:
    """One rule as the file format spells it."""
    data: dict[str, Any] = {"name": name, "priority": priority, "action": dict(action)}
    if when is not None:
        data["when"] = when
    data.update(extra)
    return data


def leaf(field: str, op: str, value: Any = None) -> dict[str, Any]:
    """One condition leaf."""
    node: dict[str, Any] = {"field": field, "op": op}
    if value is not None:
        node["value"] = value
    return node


def lead(**fields: Any) -> LeadFacts:
    """A lead with the given canonical fields."""
    return LeadFacts(fields=fields)


def run(
    facts: LeadFacts,
    rules: Sequence[Mapping[str, Any]] | CompiledRuleset,
    *,
    rep_states: Mapping[int, RepState] | None = None,
    teams: Iterable[TeamSpec] = (),
    rotation: Mapping[int, RotationState] | None = None,
    territories: Iterable[TerritorySpec] = (),
    now: datetime = NOW,
) -> Decision:
    """Compile (if needed) and decide in one call."""
    ruleset = rules if isinstance(rules, CompiledRuleset) else compile_rules(rules)
    return decide(
        facts,
        ruleset,
        rep_states if rep_states is not None else reps(),
        {t.id: t for t in teams},
        rotation or {},
        TerritoryIndex(territories),
        now,
    )
