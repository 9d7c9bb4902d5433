"""decide(): priority order, tag rules, every action yielding or not, SLA, trace, determinism."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from routing.engine import (
    AccountFacts,
    LeadFacts,
    RotationState,
    TerritorySpec,
    TraceEntry,
)
from tests.routing.engine.factories import (
    NOW,
    compile_rules,
    lead,
    leaf,
    rep,
    reps,
    rule,
    run,
    team,
)

SALES = team(1, "Sales", 1, 2, 3, sla_minutes=60)
ENTERPRISE = team(2, "Enterprise", 4, 5, strategy="least_loaded", sla_minutes=120)
FALLBACK = team(3, "Fallback", 6)
TEAMS = (SALES, ENTERPRISE, FALLBACK)
TO_SALES = {"type": "team", "team": "Sales"}
AWAY = datetime(2026, 12, 3, tzinfo=NOW.tzinfo)


def whys(decision: Any) -> list[tuple[str, bool, str]]:
    return [(entry.rule_name, entry.matched, entry.why) for entry in decision.trace]


def test_rules_run_in_ascending_priority_whatever_the_listed_order() -> None:
    decision = run(
        lead(country="DE"),
        [
            rule("later", 20, {"type": "rep", "rep": "ben@example.com"}),
            rule("first", 10, {"type": "rep", "rep": "ana@example.com"}),
        ],
    )
    assert (decision.outcome, decision.rep_id, decision.rule_name) == ("owner", 1, "first")
    assert decision.reason == "first: rep Ana"
    assert [e.rule_name for e in decision.trace] == ["first"]
    assert decision.trace[0] == TraceEntry(None, "first", 10, True, "rep Ana", True)


def test_the_trace_says_which_condition_failed() -> None:
    decision = run(
        lead(country="FR", lead_score=42),
        [
            rule("DACH", 10, TO_SALES, when=leaf("country", "in", ["DE", "AT", "CH"])),
            rule(
                "Hot",
                20,
                TO_SALES,
                when={"all": [leaf("country", "eq", "FR"), leaf("lead_score", "gte", 80)]},
            ),
            rule("Catch-all", 30, {"type": "rep", "rep": "cai@example.com"}),
        ],
        teams=TEAMS,
    )
    assert whys(decision) == [
        ("DACH", False, 'country is "FR", not in [DE, AT, CH]'),
        ("Hot", False, "lead_score is 42, below 80"),
        ("Catch-all", True, "rep Cai"),
    ]
    assert [e.decided for e in decision.trace] == [False, False, True]


def test_tag_rules_record_first_values_accumulate_tags_and_continue() -> None:
    decision = run(
        lead(lead_score=90),
        [
            rule("Hot", 10, {"type": "tag", "priority": "hot", "sla_minutes": 5, "tags": ["hot"]}),
            rule(
                "Warm",
                20,
                {"type": "tag", "priority": "warm", "sla_minutes": 30, "tags": ["hot", "inbound"]},
            ),
            rule("Plain", 25, {"type": "tag"}),
            rule("Assign", 30, TO_SALES),
        ],
        teams=TEAMS,
    )
    assert decision.outcome == "owner"
    assert (decision.priority, decision.tags) == ("hot", ("hot", "inbound"))
    assert decision.sla_minutes == 5  # the tag's, over the team's 60
    assert whys(decision)[:3] == [
        ("Hot", True, "tagged: priority hot; SLA 5 min; tags hot"),
        (
            "Warm",
            True,
            "tagged: priority warm not applied (hot set earlier); "
            "SLA 30 min not applied (5 min set earlier); tags inbound",
        ),
        ("Plain", True, "tag rule: nothing new to record"),
    ]


def test_tags_are_kept_when_nothing_yields_and_on_exclusion() -> None:
    tag = rule("Tag", 10, {"type": "tag", "priority": "low", "tags": ["cold"]})
    nothing = run(lead(), [tag])
    assert (nothing.outcome, nothing.priority, nothing.tags) == ("nothing", "low", ("cold",))
    excluded = run(lead(), [tag, rule("Out", 20, {"type": "exclude", "reason": "spam"})])
    assert (excluded.outcome, excluded.tags, excluded.sla_minutes) == ("excluded", ("cold",), None)


@pytest.mark.parametrize(
    ("rule_sla", "tag_sla", "team_sla", "expected"),
    [
        (15, 5, 60, 15),
        (None, 5, 60, 5),
        (None, None, 60, 60),
        (None, None, None, None),
    ],
)
def test_sla_comes_from_rule_then_tag_then_team(
    rule_sla: int | None, tag_sla: int | None, team_sla: int | None, expected: int | None
) -> None:
    rules = [rule("Assign", 20, TO_SALES, **({"sla_minutes": rule_sla} if rule_sla else {}))]
    if tag_sla:
        rules.append(rule("Tag", 10, {"type": "tag", "sla_minutes": tag_sla}))
    decision = run(lead(), rules, teams=[team(1, "Sales", 1, sla_minutes=team_sla)])
    assert decision.sla_minutes == expected


def test_a_tag_rules_own_sla_counts_as_the_tags() -> None:
    decision = run(
        lead(),
        [rule("Tag", 10, {"type": "tag"}, sla_minutes=7), rule("A", 20, TO_SALES)],
        teams=TEAMS,
    )
    assert decision.sla_minutes == 7


def test_on_sla_breach_comes_from_the_deciding_rule() -> None:
    decision = run(lead(), [rule("A", 1, TO_SALES, on_sla_breach="reassign")], teams=TEAMS)
    assert decision.on_sla_breach == "reassign"
    assert run(lead(), [rule("A", 1, TO_SALES)], teams=TEAMS).on_sla_breach == "notify"


# --- rep ---------------------------------------------------------------------------------------


def test_rep_action_yields_an_eligible_rep_without_a_team() -> None:
    decision = run(lead(), [rule("R", 1, {"type": "rep", "rep": "ben@example.com"})])
    assert (decision.rep_id, decision.team_id, decision.sla_minutes) == (2, None, None)
    assert decision.rotation_update is None


def test_rep_action_that_yields_nothing_continues() -> None:
    table = reps(rep(1, out_of_office_until=AWAY), rep(2, max_open=2, open_count=2))
    decision = run(
        lead(),
        [
            rule("Ana", 1, {"type": "rep", "rep": "ana@example.com"}),
            rule("Ben", 2, {"type": "rep", "rep": "ben@example.com"}),
            rule("Ben anyway", 3, {"type": "rep", "rep": "ben@example.com", "ignore_caps": True}),
        ],
        rep_states=table,
    )
    assert whys(decision) == [
        ("Ana", True, "rep Ana is out of office until 2026-12-03"),
        ("Ben", True, "rep Ben is at max_open 2"),
        ("Ben anyway", True, "rep Ben (caps ignored)"),
    ]
    assert decision.rep_id == 2


def test_rep_missing_from_the_snapshot_yields_nothing() -> None:
    decision = run(
        lead(), [rule("R", 1, {"type": "rep", "rep": "fay@example.com"})], rep_states=reps(count=2)
    )
    assert decision.outcome == "nothing"
    assert whys(decision) == [("R", True, "rep #6 is not in the rep snapshot")]


def test_ignore_caps_still_needs_an_active_rep() -> None:
    decision = run(
        lead(),
        [rule("R", 1, {"type": "rep", "rep": "ana@example.com", "ignore_caps": True})],
        rep_states=reps(rep(1, active=False)),
    )
    assert whys(decision) == [("R", True, "rep Ana is inactive")]


# --- team --------------------------------------------------------------------------------------


def test_team_action_yields_a_member_and_moves_the_turn() -> None:
    decision = run(lead(), [rule("T", 1, TO_SALES)], teams=TEAMS, rotation={1: RotationState(1, 1)})
    assert (decision.rep_id, decision.team_id, decision.sla_minutes) == (2, 1, 60)
    assert decision.rotation_update == RotationState(1, last_rep_id=2, last_position=1)
    assert decision.reason == "T: team Sales (round robin) → Ben, next in rotation"


def test_team_action_lists_every_member_skipped() -> None:
    table = reps(
        rep(1, max_open=50, open_count=50),
        rep(2, timezone="Europe/Berlin", working_hours=None, active=False),
        rep(3, out_of_office_until=AWAY),
    )
    decision = run(
        lead(),
        [rule("T", 1, TO_SALES), rule("Else", 2, {"type": "rep", "rep": "dee@example.com"})],
        teams=TEAMS,
        rep_states=table,
    )
    assert whys(decision)[0] == (
        "T",
        True,
        "team Sales (round robin): no eligible member in team Sales: Ana: at max_open 50; "
        "Ben: inactive; Cai: out of office until 2026-12-03",
    )
    assert decision.rep_id == 4
    assert decision.rotation_update is None  # the team's turn did not move


def test_team_skips_show_in_the_winners_words() -> None:
    decision = run(
        lead(), [rule("T", 1, TO_SALES)], teams=TEAMS, rep_states=reps(rep(1, active=False))
    )
    assert (
        decision.trace[0].why
        == "team Sales (round robin) → Ben, next in rotation; skipped Ana: inactive"
    )


def test_team_missing_from_the_snapshot_yields_nothing() -> None:
    decision = run(lead(), [rule("T", 1, TO_SALES)])
    assert whys(decision) == [("T", True, "team Sales is not in the team snapshot")]


def test_least_loaded_team_moves_no_turn() -> None:
    table = reps(rep(4, open_count=3), rep(5, open_count=1))
    decision = run(
        lead(),
        [rule("E", 1, {"type": "team", "team": "Enterprise"})],
        teams=TEAMS,
        rep_states=table,
    )
    assert (decision.rep_id, decision.sla_minutes, decision.rotation_update) == (5, 120, None)


# --- territory ---------------------------------------------------------------------------------

TERRITORIES = [
    TerritorySpec(1, "DACH", ("DE", "AT", "CH"), team_id=1),
    TerritorySpec(2, "Bay Area", ("US",), postal_prefixes=("941",), rep_id=3),
    TerritorySpec(3, "Nowhere", ("NZ",)),
]
BY_TERRITORY = [rule("By territory", 1, {"type": "territory"})]


def test_territory_yields_its_rep() -> None:
    decision = run(lead(country="US", postal_code="94105"), BY_TERRITORY, territories=TERRITORIES)
    assert (decision.rep_id, decision.team_id) == (3, None)
    assert decision.reason == "By territory: territory Bay Area (postal prefix 941): rep Cai"


def test_territory_yields_a_member_of_its_team() -> None:
    decision = run(lead(country="at"), BY_TERRITORY, territories=TERRITORIES, teams=TEAMS)
    assert (decision.rep_id, decision.team_id, decision.sla_minutes) == (1, 1, 60)
    assert decision.rotation_update == RotationState(1, last_rep_id=1, last_position=0)
    assert decision.trace[0].why == (
        "territory DACH (country AT): team Sales (round robin) → Ana, next in rotation"
    )


@pytest.mark.parametrize(
    ("facts", "table", "why"),
    [
        ({"country": "FR"}, None, "no territory for country FR"),
        (
            {"country": "US", "postal_code": "10001"},
            None,
            "no territory for country US, postal code 10001",
        ),
        ({}, None, "no territory: the lead has no country"),
        (
            {"country": "US", "postal_code": "94105"},
            reps(rep(3, out_of_office_until=AWAY)),
            "territory Bay Area (postal prefix 941): rep Cai is out of office until 2026-12-03",
        ),
        ({"country": "NZ"}, None, "territory Nowhere (country NZ) has no rep or team"),
        (
            {"country": "DE"},
            reps(*(rep(i, active=False) for i in (1, 2, 3))),
            "territory DACH (country DE): team Sales (round robin): no eligible member in team "
            "Sales: Ana: inactive; Ben: inactive; Cai: inactive",
        ),
    ],
)
def test_territory_that_yields_nothing(facts: dict[str, Any], table: Any, why: str) -> None:
    decision = run(
        LeadFacts(fields=facts),
        BY_TERRITORY,
        territories=TERRITORIES,
        teams=TEAMS,
        rep_states=table,
    )
    assert decision.outcome == "nothing"
    assert whys(decision) == [("By territory", True, why)]


# --- account owner -----------------------------------------------------------------------------

ACME = AccountFacts(name="Acme", tier="enterprise", domain="acme.com", owner_rep_id=2)
OWNER = [rule("Named accounts", 1, {"type": "account_owner"})]
OWNER_OR_FALLBACK = [
    rule("Named accounts", 1, {"type": "account_owner", "fallback_team": "Fallback"})
]


def test_account_owner_yields_the_owner() -> None:
    decision = run(LeadFacts(account=ACME), OWNER)
    assert (decision.rep_id, decision.team_id) == (2, None)
    assert decision.trace[0].why == "account owner Ben"


@pytest.mark.parametrize(
    ("account", "table", "why"),
    [
        (None, None, "no account matched"),
        (AccountFacts(name="Acme", domain="acme.com"), None, "account Acme has no owner"),
        (
            ACME,
            reps(rep(2, out_of_office_until=AWAY)),
            "account owner Ben is out of office until 2026-12-03",
        ),
        (ACME, reps(rep(2, active=False)), "account owner Ben is inactive"),
    ],
)
def test_account_owner_that_yields_nothing(
    account: AccountFacts | None, table: Any, why: str
) -> None:
    decision = run(LeadFacts(account=account), OWNER, rep_states=table)
    assert decision.outcome == "nothing"
    assert whys(decision) == [("Named accounts", True, why)]


def test_account_owner_falls_back_to_the_team() -> None:
    decision = run(
        LeadFacts(account=ACME),
        OWNER_OR_FALLBACK,
        teams=TEAMS,
        rep_states=reps(rep(2, active=False)),
    )
    assert (decision.rep_id, decision.team_id) == (6, 3)
    assert decision.trace[0].why == (
        "account owner Ben is inactive; "
        "fallback team Fallback (round robin) → Fay, next in rotation"
    )
    no_account = run(LeadFacts(), OWNER_OR_FALLBACK, teams=TEAMS)
    assert no_account.rep_id == 6
    assert no_account.trace[0].why.startswith("no account matched; fallback team Fallback")


def test_account_owner_and_fallback_both_empty() -> None:
    table = reps(rep(2, active=False), rep(6, max_per_day=1, assigned_today=1))
    decision = run(LeadFacts(account=ACME), OWNER_OR_FALLBACK, teams=TEAMS, rep_states=table)
    assert decision.outcome == "nothing"
    assert decision.trace[0].why == (
        "account owner Ben is inactive; fallback team Fallback (round robin): no eligible member "
        "in team Fallback: Fay: at max_per_day 1"
    )


def test_an_eligible_owner_wins_over_the_fallback() -> None:
    assert run(LeadFacts(account=ACME), OWNER_OR_FALLBACK, teams=TEAMS).rep_id == 2


# --- exclude and nothing -----------------------------------------------------------------------


def test_exclude_ends_evaluation() -> None:
    decision = run(
        lead(email_domain="Rival.io"),
        [
            rule(
                "Competitors",
                10,
                {"type": "exclude", "reason": "competitor"},
                when=leaf("email_domain", "in_list", "competitors"),
            ),
            rule("Catch-all", 20, TO_SALES),
        ],
        teams=TEAMS,
    )
    assert (decision.outcome, decision.exclusion_reason, decision.rep_id) == (
        "excluded",
        "competitor",
        None,
    )
    assert decision.reason == "Competitors: excluded: competitor"
    assert decision.on_sla_breach is None
    assert len(decision.trace) == 1


def test_exclude_without_a_reason() -> None:
    decision = run(lead(), [rule("Out", 1, {"type": "exclude"})])
    assert (decision.outcome, decision.exclusion_reason) == ("excluded", "excluded")


def test_nothing_yields_so_the_lead_stays_unassigned() -> None:
    decision = run(
        lead(country="FR"),
        [
            rule("DE", 1, TO_SALES, when=leaf("country", "eq", "DE")),
            rule("Owner", 2, {"type": "account_owner"}),
            rule("Off", 3, TO_SALES, active=False),
        ],
        teams=TEAMS,
    )
    assert decision.outcome == "nothing"
    assert (decision.rep_id, decision.team_id, decision.rule_name) == (None, None, None)
    assert (
        decision.reason
        == "no rule yielded an owner (2 rules considered): the lead stays unassigned"
    )
    assert whys(decision) == [
        ("DE", False, 'country is "FR", not "DE"'),
        ("Owner", True, "no account matched"),
    ]
    assert not any(entry.decided for entry in decision.trace)


def test_an_empty_ruleset_decides_nothing() -> None:
    decision = run(lead(), [])
    assert (decision.outcome, len(decision.trace)) == ("nothing", 0)


# --- facts beyond the canonical fields ---------------------------------------------------------


def test_conditions_read_source_account_custom_and_free_email() -> None:
    facts = LeadFacts(
        fields={"country": "DE"},
        custom={"Plan": "Pro", "seats": "12"},
        source="webinar",
        is_free_email=True,
        account=ACME,
    )
    when = {
        "all": [
            leaf("source", "eq", "Webinar"),
            leaf("is_free_email", "eq", True),
            leaf("account.exists", "eq", True),
            leaf("account.tier", "eq", "Enterprise"),
            leaf("account.domain", "ends_with", ".com"),
            leaf("account.name", "eq", "acme"),
            leaf("custom.Plan", "eq", "pro"),
            leaf("custom.seats", "gte", 10),
            leaf("custom.missing", "not_exists"),
        ]
    }
    assert (
        run(facts, [rule("All", 1, {"type": "rep", "rep": "ana@example.com"}, when=when)]).rep_id
        == 1
    )
    no_account = run(LeadFacts(), [rule("R", 1, TO_SALES, when=leaf("account.exists", "eq", True))])
    assert whys(no_account) == [("R", False, "account.exists is false, not true")]


# --- trace, determinism, purity ----------------------------------------------------------------


def test_rules_skipped_by_the_index_still_appear_with_their_reason() -> None:
    rules = [
        rule(f"country {i}", i, TO_SALES, when=leaf("country", "eq", f"C{i}")) for i in range(1, 51)
    ]
    rules.append(rule("Catch-all", 100, {"type": "rep", "rep": "ana@example.com"}))
    decision = run(lead(country="C7"), rules, teams=TEAMS)
    assert decision.rule_name == "country 7"
    assert [e.rule_name for e in decision.trace] == [f"country {i}" for i in range(1, 8)]
    assert decision.trace[2].why == 'country is "C7", not "C3"'
    assert decision.matched_trace() == (decision.trace[-1],)
    assert decision.matched_trace() == tuple(e for e in decision.trace if e.matched)
    fallthrough = run(lead(country="XX"), rules, teams=TEAMS)
    only_matched = fallthrough.matched_trace()  # before the full trace is built
    assert [e.rule_name for e in only_matched] == ["Catch-all"]
    assert len(fallthrough.trace) == 51
    assert only_matched == fallthrough.matched_trace()
    assert fallthrough.trace[-1].decided


def test_same_inputs_give_the_same_decision() -> None:
    ruleset = compile_rules(
        [
            rule("Tag", 1, {"type": "tag", "tags": ["x"]}, when=leaf("lead_score", "gt", 5)),
            rule(
                "T", 2, {"type": "team", "team": "Sales"}, when=leaf("country", "in", ["DE", "FR"])
            ),
        ]
    )
    facts = lead(country="FR", lead_score=9)
    first = run(facts, ruleset, teams=TEAMS, rotation={1: RotationState(1, 2)})
    second = run(facts, ruleset, teams=TEAMS, rotation={1: RotationState(1, 2)})
    assert first == second
    assert first.to_json() == second.to_json()
    assert first.rep_id == 3


def test_decide_writes_nothing_and_persisting_the_update_moves_the_turn() -> None:
    ruleset = compile_rules([rule("T", 1, TO_SALES)])
    rotation: dict[int, RotationState] = {}
    simulated = [run(lead(), ruleset, teams=TEAMS, rotation=rotation).rep_id for _ in range(3)]
    assert simulated == [1, 1, 1]
    picked = []
    for _ in range(4):
        decision = run(lead(), ruleset, teams=TEAMS, rotation=rotation)
        picked.append(decision.rep_id)
        assert decision.rotation_update is not None
        rotation[1] = decision.rotation_update
    assert picked == [1, 2, 3, 1]


def test_decision_json() -> None:
    decision = run(lead(), [rule("T", 1, TO_SALES, id=42)], teams=TEAMS)
    assert decision.to_json() == {
        "outcome": "owner",
        "reason": "T: team Sales (round robin) → Ana, next in rotation",
        "ruleset_version": 1,
        "rep_id": 1,
        "team_id": 1,
        "rule_id": 42,
        "rule": "T",
        "sla_minutes": 60,
        "on_sla_breach": "notify",
        "priority": None,
        "tags": [],
        "exclusion_reason": None,
        "trace": [
            {
                "rule_id": 42,
                "rule": "T",
                "priority": 1,
                "matched": True,
                "decided": True,
                "why": "team Sales (round robin) → Ana, next in rotation",
            }
        ],
    }


def test_now_must_be_aware() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        run(lead(), [], now=datetime(2026, 1, 1))  # noqa: DTZ001


def test_now_decides_availability() -> None:
    table = reps(rep(1, out_of_office_until=NOW + timedelta(hours=1)))
    rules = [rule("R", 1, {"type": "rep", "rep": "ana@example.com"})]
    assert run(lead(), rules, rep_states=table).outcome == "nothing"
    assert run(lead(), rules, rep_states=table, now=NOW + timedelta(hours=1)).rep_id == 1
