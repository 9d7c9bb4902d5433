"""Read queries of the routing app, with their related rows already fetched."""

from __future__ import annotations

from dataclasses import dataclass

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
