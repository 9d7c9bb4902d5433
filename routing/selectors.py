"""Read queries of the routing app, with their related rows already fetched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Prefetch, QuerySet

from routing.models import Rep, Rule, RuleSet, RuleSetStatus, Team, ValueList


@dataclass(frozen=True, slots=True)
class RuleReferences:
    """What a rule may name, as ``compile_ruleset`` takes it: lists, teams and reps by key."""

    value_lists: dict[str, list[str]]
    teams: dict[str, int]  # team name -> id
    reps: dict[str, int]  # rep e-mail -> id


def rule_references() -> RuleReferences:
    """The value lists, teams and reps a rule can refer to (three queries)."""
    return RuleReferences(
        value_lists=dict(ValueList.objects.values_list("name", "values")),
        teams=dict(Team.objects.values_list("name", "id")),
        reps=dict(Rep.objects.values_list("email", "id")),
    )


def _rulesets() -> QuerySet[RuleSet]:
    return RuleSet.objects.prefetch_related(
        Prefetch("rules", queryset=Rule.objects.order_by("priority"))
    )


def ruleset_published() -> RuleSet | None:
    """The live ruleset with its rules (in priority order) prefetched, or None."""
    return _rulesets().filter(status=RuleSetStatus.PUBLISHED).first()


def ruleset_by_version(*, version: int) -> RuleSet | None:
    """Ruleset ``version`` with its rules (in priority order) prefetched, or None."""
    return _rulesets().filter(version=version).first()


def ruleset_latest() -> RuleSet | None:
    """The highest version, whatever its status, with its rules prefetched, or None."""
    return _rulesets().order_by("-version").first()


@dataclass(frozen=True, slots=True)
class NamesInUse:
    """Teams, reps and value lists named by rules that can still route (draft or published)."""

    teams: dict[str, list[str]]  # team name -> the rules naming it
    reps: dict[str, list[str]]  # lower-cased rep e-mail -> the rules naming it
    value_lists: dict[str, list[str]]  # value-list name -> the rules naming it

    def describe(self, users: list[str]) -> str:
        shown = ", ".join(users[:3])
        return shown + (f" and {len(users) - 3} more" if len(users) > 3 else "")


def _lists_in(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        if node.get("op") in ("in_list", "not_in_list") and isinstance(node.get("value"), str):
            found.add(node["value"])
        for key in ("all", "any"):
            for child in node.get(key) or []:
                _lists_in(child, found)
        _lists_in(node.get("not"), found)


def names_in_use() -> NamesInUse:
    """What the rules of draft and published rulesets refer to by name (one query).

    A rename or deletion of any of these would make those rules fail to compile, so the models'
    clean() and the admin refuse it until the rules are changed.
    """
    used = NamesInUse(teams={}, reps={}, value_lists={})
    rows = Rule.objects.filter(
        ruleset__status__in=[RuleSetStatus.DRAFT, RuleSetStatus.PUBLISHED]
    ).values_list("name", "when", "action", "ruleset__version", "ruleset__status")
    for name, when, action, version, status in rows:
        label = f'rule "{name}" (v{version}, {status})'
        act = action if isinstance(action, dict) else {}
        for key in ("team", "fallback_team"):
            if isinstance(act.get(key), str) and act.get("type") in ("team", "account_owner"):
                used.teams.setdefault(act[key], []).append(label)
        if act.get("type") == "rep" and isinstance(act.get("rep"), str):
            used.reps.setdefault(act["rep"].strip().lower(), []).append(label)
        lists: set[str] = set()
        _lists_in(when, lists)
        for list_name in lists:
            used.value_lists.setdefault(list_name, []).append(label)
    return used
