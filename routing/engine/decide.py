"""``decide``: run a compiled ruleset over one lead's facts and the reps' state at ``now``.

Rules run in ascending priority. A matching ``tag`` rule records priority, SLA and tags (a value
an earlier tag rule set is never overwritten; tags accumulate) and evaluation continues. Any other
matching rule tries its action: the first that yields an owner or excludes ends evaluation; one
that yields nothing lets the next rule run; when none yields the outcome is ``nothing`` and the
caller marks the lead unassigned. SLA minutes come from the deciding rule, else the first tag
rule that set them, else the team the owner came through (the caller applies the global default).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Final, NamedTuple

from routing.engine.ruleset import (
    AccountOwnerAction,
    Action,
    CompiledRule,
    CompiledRuleset,
    ExcludeAction,
    RepAction,
    TagAction,
    TeamAction,
    TerritoryAction,
    compile_ruleset,
)
from routing.engine.strategies import choose_member, rep_is_eligible, rep_label
from routing.engine.territories import TerritoryIndex, describe_miss
from routing.engine.trace import Trace
from routing.engine.types import (
    Decision,
    LeadFacts,
    Outcome,
    RepState,
    RotationState,
    TeamSpec,
)

__all__ = ["compile_ruleset", "decide"]

_STRATEGY_WORDS = {
    "round_robin": "round robin",
    "weighted": "weighted round robin",
    "least_loaded": "least loaded",
}


class _Result(NamedTuple):
    outcome: Outcome
    why: str
    rep_id: int | None = None
    team_id: int | None = None
    rotation_update: RotationState | None = None
    exclusion_reason: str | None = None


_NOTHING: Final = "nothing"


class _Context:
    __slots__ = ("lead", "now", "reps", "rotation", "teams", "territories")

    def __init__(
        self,
        lead: LeadFacts,
        reps: Mapping[int, RepState],
        teams: Mapping[int, TeamSpec],
        rotation: Mapping[int, RotationState],
        territories: TerritoryIndex,
        now: datetime,
    ) -> None:
        self.lead = lead
        self.reps = reps
        self.teams = teams
        self.rotation = rotation
        self.territories = territories
        self.now = now

    def rep(self, rep_id: int, role: str, *, ignore_caps: bool = False) -> _Result:
        rep = self.reps.get(rep_id)
        if rep is None:
            return _Result(_NOTHING, f"{role} #{rep_id} is not in the rep snapshot")
        eligible, why = rep_is_eligible(rep, None, self.now, ignore_caps=ignore_caps)
        label = rep_label(rep_id, self.reps)
        if not eligible:
            return _Result(_NOTHING, f"{role} {label} is {why}")
        caps = " (caps ignored)" if ignore_caps else ""
        return _Result("owner", f"{role} {label}{caps}", rep_id=rep_id)

    def team(self, team_id: int, role: str, name: str | None = None) -> _Result:
        team = self.teams.get(team_id)
        if team is None:
            return _Result(_NOTHING, f"{role} {name or f'#{team_id}'} is not in the team snapshot")
        choice = choose_member(team, self.reps, self.rotation.get(team_id), self.now)
        title = f"{role} {team.name} ({_STRATEGY_WORDS.get(team.strategy, team.strategy)})"
        skipped = "; ".join(choice.skipped)
        if choice.rep_id is None:
            return _Result(_NOTHING, f"{title}: {choice.why}" + (f": {skipped}" if skipped else ""))
        why = f"{title} → {rep_label(choice.rep_id, self.reps)}, {choice.why}"
        if skipped:
            why += f"; skipped {skipped}"
        return _Result(
            "owner",
            why,
            rep_id=choice.rep_id,
            team_id=team_id,
            rotation_update=choice.rotation_update,
        )

    def apply(self, action: Action) -> _Result:
        if isinstance(action, RepAction):
            return self.rep(action.rep_id, "rep", ignore_caps=action.ignore_caps)
        if isinstance(action, TeamAction):
            return self.team(action.team_id, "team", action.team)
        if isinstance(action, TerritoryAction):
            return self.territory()
        if isinstance(action, AccountOwnerAction):
            return self.account_owner(action)
        if isinstance(action, ExcludeAction):
            reason = action.reason or "excluded"
            return _Result("excluded", f"excluded: {reason}", exclusion_reason=reason)
        raise AssertionError(f"unexpected action {action!r}")  # tags are handled by decide()

    def territory(self) -> _Result:
        fields = self.lead.fields
        country, region, postal = (
            fields.get("country"),
            fields.get("region"),
            fields.get("postal_code"),
        )
        match = self.territories.lookup(country, region, postal)
        if match is None:
            return _Result(_NOTHING, describe_miss(country, region, postal))
        territory = match.territory
        title = f"territory {territory.name} ({match.why})"
        if territory.rep_id is not None:
            result = self.rep(territory.rep_id, "rep")
        elif territory.team_id is not None:
            result = self.team(territory.team_id, "team")
        else:
            return _Result(_NOTHING, f"{title} has no rep or team")
        return _Result(
            result.outcome,
            f"{title}: {result.why}",
            rep_id=result.rep_id,
            team_id=result.team_id,
            rotation_update=result.rotation_update,
        )

    def account_owner(self, action: AccountOwnerAction) -> _Result:
        account = self.lead.account
        if account is None:
            first = _Result(_NOTHING, "no account matched")
        elif account.owner_rep_id is None:
            first = _Result(_NOTHING, f"account {account.name or account.domain} has no owner")
        else:
            first = self.rep(account.owner_rep_id, "account owner")
        if first.outcome == "owner" or action.fallback_team_id is None:
            return first
        fallback = self.team(action.fallback_team_id, "fallback team", action.fallback_team)
        return _Result(
            fallback.outcome,
            f"{first.why}; {fallback.why}",
            rep_id=fallback.rep_id,
            team_id=fallback.team_id,
            rotation_update=fallback.rotation_update,
        )


class _Tags:
    __slots__ = ("priority", "sla_minutes", "tags")

    def __init__(self) -> None:
        self.priority: str | None = None
        self.sla_minutes: int | None = None
        self.tags: list[str] = []

    def record(self, rule: CompiledRule, action: TagAction) -> str:
        """Keep what no earlier tag rule set; say what was recorded and what was kept."""
        said: list[str] = []
        if action.priority is not None:
            if self.priority is None:
                self.priority = action.priority
                said.append(f"priority {action.priority}")
            else:
                said.append(f"priority {action.priority} not applied ({self.priority} set earlier)")
        sla = action.sla_minutes if action.sla_minutes is not None else rule.sla_minutes
        if sla is not None:
            if self.sla_minutes is None:
                self.sla_minutes = sla
                said.append(f"SLA {sla} min")
            else:
                said.append(f"SLA {sla} min not applied ({self.sla_minutes} min set earlier)")
        added = [tag for tag in action.tags if tag not in self.tags]
        self.tags.extend(added)
        if added:
            said.append("tags " + ", ".join(added))
        return "tagged: " + "; ".join(said) if said else "tag rule: nothing new to record"


def _sla_minutes(
    rule: CompiledRule, tags: _Tags, teams: Mapping[int, TeamSpec], team_id: int | None
) -> int | None:
    # The deciding rule's, else a tag rule's, else the team's; the caller adds the default.
    if rule.sla_minutes is not None:
        return rule.sla_minutes
    if tags.sla_minutes is not None:
        return tags.sla_minutes
    team = teams.get(team_id) if team_id is not None else None
    return team.sla_minutes if team is not None else None


def decide(
    lead: LeadFacts,
    ruleset: CompiledRuleset,
    reps: Mapping[int, RepState],
    teams: Mapping[int, TeamSpec],
    rotation: Mapping[int, RotationState],
    territories: TerritoryIndex,
    now: datetime,
) -> Decision:
    """Decide one lead's owner (or exclusion) and explain it; pure and deterministic.

    ``reps``/``teams``/``rotation`` are keyed by id and need hold only the reps and teams the
    ruleset can reach. Nothing is written: a moved turn comes back as ``rotation_update``.
    """
    if now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime")
    facts = lead.facts()
    rules = ruleset.rules
    context = _Context(lead, reps, teams, rotation, territories, now)
    tags = _Tags()
    notes: dict[int, str] = {}
    tests = ruleset.tests
    for position in ruleset.candidates(facts):
        if not tests[position](facts):
            continue
        rule = rules[position]
        action = rule.action
        if isinstance(action, TagAction):
            notes[position] = tags.record(rule, action)
            continue
        result = context.apply(action)
        notes[position] = result.why
        if result.outcome == _NOTHING:
            continue
        owner = result.outcome == "owner"
        return Decision(
            outcome=result.outcome,
            reason=f"{rule.name}: {result.why}",
            trace=Trace(rules, position + 1, facts, notes, position),
            ruleset_version=ruleset.version,
            rep_id=result.rep_id,
            team_id=result.team_id,
            rule_id=rule.id,
            rule_name=rule.name,
            sla_minutes=_sla_minutes(rule, tags, teams, result.team_id) if owner else None,
            on_sla_breach=rule.on_sla_breach if owner else None,
            priority=tags.priority,
            tags=tuple(tags.tags),
            exclusion_reason=result.exclusion_reason,
            rotation_update=result.rotation_update,
        )
    considered = len(rules)
    return Decision(
        outcome="nothing",
        reason=f"no rule yielded an owner ({considered} rule{'s' if considered != 1 else ''} "
        "considered): the lead stays unassigned",
        trace=Trace(rules, considered, facts, notes, None),
        ruleset_version=ruleset.version,
        priority=tags.priority,
        tags=tuple(tags.tags),
    )
