"""Hypothesis: random valid rulesets, leads and rep state never crash the engine, and the trace
always explains the outcome (one entry per considered rule, ending with the deciding one)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, time, timedelta
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from routing.engine import (
    AccountFacts,
    LeadFacts,
    RepState,
    RotationState,
    TeamSpec,
    TerritoryIndex,
    TerritorySpec,
    WorkingHours,
    compile_condition,
    compile_ruleset,
    decide,
)
from routing.engine.operators import Facts
from routing.engine.values import text_of

NOW = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)
TEXTS = ["DE", "de ", " Fr", "US", "CA", "941", "94105", "rival.io", "Sales", "", "  ", "ünï", "10"]
LISTS = {"competitors": ["rival.io", "other.com"], "countries": ["DE", "AT"], "none": []}
TEXT_FIELDS = [
    "country",
    "region",
    "postal_code",
    "email_domain",
    "title",
    "source",
    "account.tier",
]
NUMBER_FIELDS = ["employees", "lead_score", "annual_revenue"]
BOOL_FIELDS = ["is_free_email", "account.exists"]
CUSTOM_FIELDS = ["custom.plan", "custom.seats"]
PATTERNS = ["^de$", "rival", r"\d{3}", "(a|b)+c", "^$", "ü"]
REP_IDS = [1, 2, 3, 4]
TEAM_NAMES = {"A": 1, "B": 2, "Ghost": 3}  # Ghost is known to the ruleset but absent at runtime
REP_EMAILS = {f"r{i}@x.io": i for i in [*REP_IDS, 9]}  # rep 9 is absent at runtime

text = st.sampled_from([t for t in TEXTS if t.strip()])
number = st.one_of(st.integers(-5, 2000), st.floats(-10, 2000, allow_nan=False))
scalar = st.one_of(text, number, st.booleans())


def leaf_for(field: str, kind: str) -> st.SearchStrategy[dict[str, Any]]:
    values: dict[str, st.SearchStrategy[Any]] = {
        "text": text,
        "number": number,
        "bool": st.booleans(),
        "any": scalar,
    }
    value = values[kind]
    options: list[st.SearchStrategy[dict[str, Any]]] = [
        st.builds(
            lambda op, v: {"field": field, "op": op, "value": v},
            st.sampled_from(["eq", "neq"]),
            value,
        ),
        st.builds(
            lambda op, v: {"field": field, "op": op, "value": v},
            st.sampled_from(["in", "not_in"]),
            st.lists(value, min_size=1, max_size=4),
        ),
        st.builds(lambda op: {"field": field, "op": op}, st.sampled_from(["exists", "not_exists"])),
    ]
    if kind != "bool":
        options.append(
            st.builds(
                lambda op, v: {"field": field, "op": op, "value": v},
                st.sampled_from(["gt", "gte", "lt", "lte"]),
                number,
            )
        )
        options.append(
            st.builds(
                lambda a, b: {"field": field, "op": "between", "value": sorted([a, b])},
                number,
                number,
            )
        )
        options.append(
            st.builds(
                lambda op, v: {"field": field, "op": op, "value": v},
                st.sampled_from(["in_list", "not_in_list"]),
                st.sampled_from(sorted(LISTS)),
            )
        )
    if kind in ("text", "any"):
        options.append(
            st.builds(
                lambda op, v: {"field": field, "op": op, "value": v},
                st.sampled_from(["contains", "not_contains", "starts_with", "ends_with"]),
                text,
            )
        )
        options.append(
            st.builds(
                lambda v: {"field": field, "op": "matches", "value": v}, st.sampled_from(PATTERNS)
            )
        )
    return st.one_of(options)


leaves = st.one_of(
    [leaf_for(f, "text") for f in TEXT_FIELDS]
    + [leaf_for(f, "number") for f in NUMBER_FIELDS]
    + [leaf_for(f, "bool") for f in BOOL_FIELDS]
    + [leaf_for(f, "any") for f in CUSTOM_FIELDS]
)
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.builds(lambda c: {"all": c}, st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda c: {"any": c}, st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda c: {"not": c}, children),
    ),
    max_leaves=8,
)
actions = st.one_of(
    st.builds(
        lambda r, caps: {"type": "rep", "rep": r, "ignore_caps": caps},
        st.sampled_from(sorted(REP_EMAILS)),
        st.booleans(),
    ),
    st.builds(lambda t: {"type": "team", "team": t}, st.sampled_from(sorted(TEAM_NAMES))),
    st.just({"type": "territory"}),
    st.just({"type": "account_owner"}),
    st.builds(
        lambda t: {"type": "account_owner", "fallback_team": t}, st.sampled_from(sorted(TEAM_NAMES))
    ),
    st.builds(lambda r: {"type": "exclude", "reason": r}, st.sampled_from(["spam", "competitor"])),
    st.builds(
        lambda p, s, t: {"type": "tag", "priority": p, "sla_minutes": s, "tags": t},
        st.sampled_from(["hot", "warm"]),
        st.sampled_from([None, 5, 30]),
        st.lists(st.sampled_from(["a", "b", "c"]), max_size=2),
    ),
)


@st.composite
def rulesets(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(0, 8) | st.integers(3, 8))
    priorities = draw(st.permutations(range(1, 20)))[:count]
    rules = []
    for i, priority in enumerate(priorities):
        rule: dict[str, Any] = {"name": f"rule {i}", "priority": priority, "action": draw(actions)}
        if draw(st.booleans()):
            rule["when"] = draw(trees)
        if draw(st.integers(0, 5)) == 0:
            rule["active"] = False
        if draw(st.booleans()):
            rule["sla_minutes"] = draw(st.integers(1, 120))
        rules.append(rule)
    return {"name": "random", "version": 3, "rules": rules}


odd = st.one_of(
    st.none(),
    st.sampled_from(TEXTS),
    number,
    st.booleans(),
    st.just(float("nan")),
    st.lists(st.sampled_from(TEXTS), max_size=2),
    st.just({}),
    st.text(max_size=30),
)
field_names = [*TEXT_FIELDS, *NUMBER_FIELDS]
leads = st.builds(
    lambda fields, custom, source, free, account: LeadFacts(
        fields={k: v for k, v in fields.items() if not k.startswith(("account.", "source"))},
        custom=custom,
        source=source,
        is_free_email=free,
        account=account,
    ),
    st.dictionaries(st.sampled_from(field_names), odd, max_size=8),
    st.dictionaries(st.sampled_from(["plan", "seats"]), odd, max_size=2),
    st.one_of(st.none(), st.sampled_from(TEXTS)),
    st.booleans(),
    st.one_of(
        st.none(),
        st.builds(
            AccountFacts,
            name=st.one_of(st.none(), st.sampled_from(TEXTS)),
            tier=st.one_of(st.none(), st.sampled_from(["enterprise", "smb"])),
            domain=st.just("acme.com"),
            owner_rep_id=st.one_of(st.none(), st.sampled_from([*REP_IDS, 9])),
        ),
    ),
)
moments = st.integers(-72, 72).map(lambda h: NOW + timedelta(hours=h))
mostly = st.sampled_from([True, True, True, False])


def rep_state(rep_id: int) -> st.SearchStrategy[RepState]:
    """A rep who is usually available, so that owners are decided often enough to test."""
    return st.builds(
        lambda active, away, tz, hours, max_open, open_count, last: RepState(
            id=rep_id,
            email=f"r{rep_id}@x.io",
            name=f"R{rep_id}",
            active=active,
            out_of_office_until=away,
            timezone=tz,
            working_hours=hours,
            max_open=max_open,
            open_count=open_count,
            last_assigned_at=last,
        ),
        mostly,
        st.one_of(st.none(), st.none(), moments),
        st.sampled_from(["UTC", "Europe/Berlin", "Asia/Tokyo", "America/Los_Angeles", "Nowhere/X"]),
        st.one_of(
            st.none(),
            st.builds(
                WorkingHours,
                st.frozensets(st.integers(1, 7), max_size=7),
                st.integers(0, 23).map(lambda h: time(h)),
                st.integers(0, 23).map(lambda h: time(h)),
            ),
        ),
        st.one_of(st.none(), st.integers(0, 3)),
        st.integers(0, 4),
        st.one_of(st.none(), moments),
    )


rep_tables = st.tuples(*(st.one_of(st.none(), rep_state(i), rep_state(i)) for i in REP_IDS)).map(
    lambda states: {state.id: state for state in states if state is not None}
)
teams = st.builds(
    lambda team_id, strategy, respect, members: TeamSpec(
        id=team_id,
        name={1: "A", 2: "B"}[team_id],
        strategy=strategy,
        respect_working_hours=respect,
        sla_minutes=30,
        members=tuple(members),
    ),
    st.sampled_from([1, 2]),
    st.sampled_from(["round_robin", "weighted", "least_loaded"]),
    st.booleans(),
    st.lists(
        st.tuples(st.sampled_from([*REP_IDS, 9]), st.integers(1, 4)),
        max_size=4,
        unique_by=lambda m: m[0],
    ),
)
rotations = st.dictionaries(
    st.sampled_from([1, 2, 3]),
    st.builds(
        lambda team_id, data: RotationState.from_json(team_id, data),
        st.sampled_from([1, 2]),
        st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {
                    "last_rep_id": st.one_of(st.none(), st.sampled_from([*REP_IDS, 9])),
                    "current_weights": st.lists(
                        st.fixed_dictionaries(
                            {
                                "rep_id": st.sampled_from(REP_IDS),
                                "weight": st.integers(1, 4),
                                "current": st.integers(-8, 8),
                            }
                        ),
                        max_size=4,
                    ),
                }
            ),
        ),
    ),
    max_size=2,
)
territory_lists = st.lists(
    st.builds(
        lambda tid, countries, regions, prefixes, owner: TerritorySpec(
            id=tid,
            name=f"T{tid}",
            countries=tuple(countries),
            regions=tuple(regions),
            postal_prefixes=tuple(prefixes),
            team_id=owner if owner in (1, 2, 3) else None,
            rep_id=owner - 10 if owner > 10 else None,
        ),
        st.integers(1, 50),
        st.lists(st.sampled_from(["DE", "US", "FR"]), min_size=1, max_size=2),
        st.lists(st.sampled_from(["CA", "BY", "NY"]), max_size=2),
        st.lists(st.sampled_from(["9", "94", "941", "10"]), max_size=2),
        st.sampled_from([0, 1, 2, 3, 11, 12, 19]),
    ),
    max_size=5,
)


class _ScanEverything:
    """An index that offers every rule: the reference the real index must agree with."""

    def __init__(self, count: int) -> None:
        self.count = count

    def candidates(self, facts: Facts) -> Sequence[int]:
        return range(self.count)


@given(
    data=rulesets(),
    lead=leads,
    reps=rep_tables,
    team_list=st.lists(teams, max_size=2, unique_by=lambda t: t.id),
    rotation=rotations,
    territories=territory_lists,
    now=moments,
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_rulesets_never_crash_and_the_trace_explains_the_outcome(
    data: dict[str, Any],
    lead: LeadFacts,
    reps: dict[int, RepState],
    team_list: list[TeamSpec],
    rotation: dict[int, RotationState],
    territories: list[TerritorySpec],
    now: datetime,
) -> None:
    ruleset = compile_ruleset(
        data, value_lists=LISTS, known_teams=TEAM_NAMES, known_reps=REP_EMAILS
    )
    rep_table = reps
    team_table = {team.id: team for team in team_list}
    index = TerritoryIndex(territories)
    decision = decide(lead, ruleset, rep_table, team_table, rotation, index, now)

    event(f"outcome {decision.outcome}, {len(decision.trace)} rules in the trace")
    active = [r for r in data["rules"] if r.get("active", True)]
    trace = list(decision.trace)
    priorities = [entry.priority for entry in trace]
    assert priorities == sorted(p["priority"] for p in active)[: len(trace)]
    facts = lead.facts()
    for entry, rule in zip(trace, ruleset.rules, strict=False):
        assert entry.rule_name == rule.name
        assert entry.matched is rule.condition.test(facts)
        assert entry.why
        assert entry.why != "did not match"
    if decision.outcome == "nothing":
        assert len(trace) == len(active)
        assert not any(entry.decided for entry in trace)
        assert decision.rep_id is None
        assert decision.rule_name is None
    else:
        assert trace, "a decision needs a deciding rule"
        last = trace[-1]
        assert last.decided
        assert last.matched
        assert [e.decided for e in trace].count(True) == 1
        assert last.rule_name == decision.rule_name
        assert decision.reason == f"{last.rule_name}: {last.why}"
    if decision.outcome == "owner":
        assert decision.rep_id in rep_table
        if decision.team_id is not None:
            assert decision.rep_id in dict(team_table[decision.team_id].members)
    if decision.rotation_update is not None:
        assert decision.rotation_update.team_id == decision.team_id
    assert decision.ruleset_version == 3

    # Determinism, and the index agrees with testing every rule.
    again = decide(lead, ruleset, rep_table, team_table, rotation, index, now)
    assert again == decision
    scanning = dataclasses.replace(ruleset, index=_ScanEverything(len(ruleset.rules)))  # type: ignore[arg-type]
    assert decide(lead, scanning, rep_table, team_table, rotation, index, now) == decision


@given(tree=trees, lead=leads)
@settings(max_examples=300, deadline=None)
def test_a_condition_is_explained_exactly_when_it_fails(
    tree: dict[str, Any], lead: LeadFacts
) -> None:
    condition = compile_condition(tree, value_lists=LISTS)
    facts = lead.facts()
    holds = condition.test(facts)
    event(f"holds: {holds}")
    assert (condition.explain(facts) is None) is holds
    if condition.guard is not None and holds:
        # The index's promise: a condition with a guard holds only for one of its values.
        field, values = condition.guard
        assert text_of(facts.get(field)) in values
