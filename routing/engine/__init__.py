"""The routing decision core: plain data in, a decision and its trace out. No Django here.

    ruleset = compile_ruleset(data["ruleset"], value_lists={...}, known_teams={name: id},
                              known_reps={email: id})          # once per version; RuleErrors
    territories = TerritoryIndex(territory_specs)              # once per territory table
    decision = decide(lead_facts, ruleset, reps, teams, rotation, territories, now)
    # persist decision.rotation_update under the team's lock (drop it for a simulation)

Every rule problem is a ``RuleError`` (``RuleErrors`` holds all of a ruleset's) whose ``str()``
is ``path: message``. ``decision.trace`` builds its words on first read; store
``decision.to_json()`` or, for very large rulesets, ``decision.matched_trace()``.
"""

from routing.engine.availability import rep_away_reason
from routing.engine.conditions import compile_condition
from routing.engine.decide import decide
from routing.engine.errors import RuleError, RuleErrors
from routing.engine.fields import CANONICAL_FIELDS, FIELD_NAMES
from routing.engine.operators import OPERATORS, Condition
from routing.engine.ruleset import ACTION_TYPES, CompiledRule, CompiledRuleset, compile_ruleset
from routing.engine.strategies import (
    MAX_MEMBER_WEIGHT,
    MAX_TEAM_WEIGHT,
    MemberChoice,
    choose_member,
    rep_is_eligible,
)
from routing.engine.territories import TerritoryIndex, TerritoryMatch
from routing.engine.types import (
    STRATEGIES,
    Absence,
    AccountFacts,
    Decision,
    Holiday,
    LeadFacts,
    LoadOrdered,
    RepState,
    RotationState,
    TeamSpec,
    TerritorySpec,
    TraceEntry,
    WeightedTurn,
    WorkingHours,
)

__all__ = [
    "ACTION_TYPES",
    "CANONICAL_FIELDS",
    "FIELD_NAMES",
    "MAX_MEMBER_WEIGHT",
    "MAX_TEAM_WEIGHT",
    "OPERATORS",
    "STRATEGIES",
    "Absence",
    "AccountFacts",
    "CompiledRule",
    "CompiledRuleset",
    "Condition",
    "Decision",
    "Holiday",
    "LeadFacts",
    "LoadOrdered",
    "MemberChoice",
    "RepState",
    "RotationState",
    "RuleError",
    "RuleErrors",
    "TeamSpec",
    "TerritoryIndex",
    "TerritoryMatch",
    "TerritorySpec",
    "TraceEntry",
    "WeightedTurn",
    "WorkingHours",
    "choose_member",
    "compile_condition",
    "compile_ruleset",
    "decide",
    "rep_away_reason",
    "rep_is_eligible",
]
