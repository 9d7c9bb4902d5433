"""Eligibility and the three strategies: exact sequences, skips, caps, absence, working hours."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, time, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.engine import (
    RepState,
    RotationState,
    TeamSpec,
    WeightedTurn,
    WorkingHours,
    choose_member,
    rep_is_eligible,
)
from tests.routing.engine.factories import NOW, rep, reps, team

WEEKDAYS = frozenset({1, 2, 3, 4, 5})
OFFICE = WorkingHours(WEEKDAYS, time(8), time(18))
RESPECTING = team(1, "Sales", 1, respect_working_hours=True)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


# --- eligibility -------------------------------------------------------------------------------


def test_an_available_rep_is_eligible() -> None:
    assert rep_is_eligible(rep(1), None, NOW) == (True, "eligible")


def test_inactive() -> None:
    assert rep_is_eligible(rep(1, active=False), None, NOW) == (False, "inactive")


@pytest.mark.parametrize(
    ("until", "expected"),
    [
        (None, (True, "eligible")),
        (NOW - timedelta(seconds=1), (True, "eligible")),
        (NOW, (True, "eligible")),
        (utc(2026, 12, 3), (False, "out of office until 2026-12-03")),
        (NOW + timedelta(minutes=150), (False, "out of office until 2026-05-04 12:30 UTC")),
    ],
)
def test_out_of_office(until: datetime | None, expected: tuple[bool, str]) -> None:
    assert rep_is_eligible(rep(1, out_of_office_until=until), None, NOW) == expected


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"max_open": 50, "open_count": 49}, (True, "eligible")),
        ({"max_open": 50, "open_count": 50}, (False, "at max_open 50")),
        ({"max_open": 50, "open_count": 51}, (False, "at max_open 50")),
        ({"max_open": 0, "open_count": 0}, (False, "at max_open 0")),
        ({"max_open": None, "open_count": 10_000}, (True, "eligible")),
        ({"max_per_day": 20, "assigned_today": 19}, (True, "eligible")),
        ({"max_per_day": 20, "assigned_today": 20}, (False, "at max_per_day 20")),
        ({"max_per_day": None, "assigned_today": 10_000}, (True, "eligible")),
    ],
)
def test_caps_at_the_boundary(changes: dict[str, int], expected: tuple[bool, str]) -> None:
    assert rep_is_eligible(rep(1, **changes), None, NOW) == expected


def test_ignore_caps_skips_caps_only() -> None:
    capped = rep(1, max_open=1, open_count=1, max_per_day=1, assigned_today=1)
    assert rep_is_eligible(capped, None, NOW, ignore_caps=True) == (True, "eligible")
    away = rep(1, max_open=1, open_count=5, out_of_office_until=utc(2027, 1, 1))
    assert rep_is_eligible(away, None, NOW, ignore_caps=True)[0] is False
    assert rep_is_eligible(rep(1, active=False), None, NOW, ignore_caps=True)[0] is False


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        rep(1, out_of_office_until=datetime(2026, 1, 1))  # noqa: DTZ001
    with pytest.raises(ValueError, match="timezone-aware"):
        rep(1, last_assigned_at=datetime(2026, 1, 1))  # noqa: DTZ001


def hours_verdict(now: datetime, timezone: str, hours: WorkingHours = OFFICE) -> tuple[bool, str]:
    return rep_is_eligible(rep(1, timezone=timezone, working_hours=hours), RESPECTING, now)


@pytest.mark.parametrize(
    ("now", "timezone", "expected"),
    [
        # 2026-05-04 is a Monday; Berlin is UTC+2 in May.
        (utc(2026, 5, 4, 10, 0), "Europe/Berlin", (True, "eligible")),
        (utc(2026, 5, 4, 6, 0), "Europe/Berlin", (True, "eligible")),  # 08:00 local: opens
        (
            utc(2026, 5, 4, 5, 59),
            "Europe/Berlin",
            (False, "outside working hours (Europe/Berlin Mon 07:59)"),
        ),
        (
            utc(2026, 5, 4, 16, 0),
            "Europe/Berlin",
            (False, "outside working hours (Europe/Berlin Mon 18:00)"),
        ),
        (utc(2026, 5, 4, 15, 59), "Europe/Berlin", (True, "eligible")),
        (
            utc(2026, 5, 9, 10, 0),
            "Europe/Berlin",
            (False, "outside working hours (Europe/Berlin Sat 12:00)"),
        ),
        # Across midnight: Sunday evening UTC is already Monday morning in Tokyo.
        (
            utc(2026, 5, 3, 22, 30),
            "Asia/Tokyo",
            (False, "outside working hours (Asia/Tokyo Mon 07:30)"),
        ),
        (utc(2026, 5, 3, 23, 30), "Asia/Tokyo", (True, "eligible")),  # Monday 08:30 there
        # Monday 03:00 UTC is still Sunday evening in Los Angeles.
        (
            utc(2026, 5, 4, 3, 0),
            "America/Los_Angeles",
            (False, "outside working hours (America/Los_Angeles Sun 20:00)"),
        ),
        # Friday 23:30 UTC is Friday 16:30 in Los Angeles but Saturday in Berlin.
        (utc(2026, 5, 8, 23, 30), "America/Los_Angeles", (True, "eligible")),
        (
            utc(2026, 5, 8, 23, 30),
            "Europe/Berlin",
            (False, "outside working hours (Europe/Berlin Sat 01:30)"),
        ),
        (NOW, "Mars/Olympus", (False, 'in an unknown time zone "Mars/Olympus"')),
    ],
)
def test_working_hours_in_the_reps_time_zone(
    now: datetime, timezone: str, expected: tuple[bool, str]
) -> None:
    assert hours_verdict(now, timezone) == expected


@pytest.mark.parametrize(
    ("now", "inside"),
    [
        (utc(2026, 5, 4, 22, 0), True),  # Monday 22:00 opens Monday's window
        (utc(2026, 5, 4, 21, 59), False),
        (utc(2026, 5, 5, 3, 0), True),  # Tuesday 03:00: Monday's window
        (utc(2026, 5, 5, 6, 0), False),  # closes at 06:00
        (utc(2026, 5, 9, 3, 0), True),  # Saturday 03:00: Friday's window
        (utc(2026, 5, 9, 23, 0), False),  # Saturday evening: no window
        (utc(2026, 5, 10, 3, 0), False),  # Sunday 03:00: Saturday opened none
        (utc(2026, 5, 4, 3, 0), False),  # Monday 03:00: Sunday opened none
    ],
)
def test_overnight_windows_belong_to_the_day_they_open(now: datetime, inside: bool) -> None:
    night = WorkingHours(WEEKDAYS, time(22), time(6))
    assert hours_verdict(now, "UTC", night)[0] is inside


def test_daylight_saving_time_is_followed() -> None:
    # Berlin springs forward on 2026-03-29 (UTC+1 -> UTC+2): 06:30 UTC is 07:30, then 08:30.
    every_day = WorkingHours(frozenset(range(1, 8)), time(8), time(18))
    assert hours_verdict(utc(2026, 3, 28, 6, 30), "Europe/Berlin", every_day)[0] is False
    assert hours_verdict(utc(2026, 3, 29, 6, 30), "Europe/Berlin", every_day)[0] is True
    # New York falls back on 2026-11-01 (UTC-4 -> UTC-5): 12:30 UTC is 08:30, then 07:30.
    assert hours_verdict(utc(2026, 10, 31, 12, 30), "America/New_York", every_day)[0] is True
    assert hours_verdict(utc(2026, 11, 1, 12, 30), "America/New_York", every_day)[0] is False


def test_equal_start_and_end_means_the_whole_day() -> None:
    whole = WorkingHours(frozenset({1}), time(0), time(0))
    assert hours_verdict(utc(2026, 5, 4, 23, 59), "UTC", whole)[0] is True
    assert hours_verdict(utc(2026, 5, 5, 0, 0), "UTC", whole)[0] is False


def test_working_hours_count_only_where_the_team_respects_them() -> None:
    night_owl = rep(1, timezone="Europe/Berlin", working_hours=OFFICE)
    sunday = utc(2026, 5, 10, 12, 0)
    assert rep_is_eligible(night_owl, None, sunday) == (True, "eligible")
    assert rep_is_eligible(night_owl, team(1, "Sales", 1), sunday) == (True, "eligible")
    assert rep_is_eligible(night_owl, RESPECTING, sunday)[0] is False
    assert rep_is_eligible(rep(1), RESPECTING, sunday) == (True, "eligible")  # no hours set


# --- strategies --------------------------------------------------------------------------------

Availability = Callable[[int, int], RepState]  # (lead number, rep id) -> state


def sequence(
    spec: TeamSpec,
    leads: int,
    availability: Availability | None = None,
    state: RotationState | None = None,
) -> list[str | None]:
    """Names picked for consecutive leads, persisting each rotation update as a caller would."""
    picked: list[str | None] = []
    for number in range(leads):
        table: Mapping[int, RepState] = {
            rep_id: availability(number, rep_id) if availability else rep(rep_id)
            for rep_id, _w in spec.members
        }
        choice = choose_member(spec, table, state, NOW)
        if choice.rotation_update is not None:
            state = RotationState.from_json(spec.id, choice.rotation_update.to_json())
        picked.append(None if choice.rep_id is None else table[choice.rep_id].name)
    return picked


def round_robin(*members: int) -> TeamSpec:
    return team(1, "Sales", *members, strategy="round_robin")


def weighted(*members: tuple[int, int]) -> TeamSpec:
    return team(1, "Sales", *members, strategy="weighted")


def test_round_robin_rotates_in_listed_order_and_wraps() -> None:
    assert sequence(round_robin(1, 2, 3), 7) == ["Ana", "Ben", "Cai", "Ana", "Ben", "Cai", "Ana"]


def test_round_robin_starts_after_the_last_served() -> None:
    state = RotationState(team_id=1, last_rep_id=2)
    assert sequence(round_robin(1, 2, 3), 3, state=state) == ["Cai", "Ana", "Ben"]


def test_round_robin_skips_without_make_up() -> None:
    def ben_away_on_lead_1(number: int, rep_id: int) -> RepState:
        return rep(rep_id, active=not (rep_id == 2 and number == 1))

    # Lead 1 would be Ben's: Cai takes it, and the rotation goes on from Cai (Ben gets no extra).
    assert sequence(round_robin(1, 2, 3), 6, ben_away_on_lead_1) == [
        "Ana",
        "Cai",
        "Ana",
        "Ben",
        "Cai",
        "Ana",
    ]


def test_round_robin_skips_are_explained_and_nobody_is_none() -> None:
    table = reps(rep(2, max_open=3, open_count=3), rep(3, active=False))
    choice = choose_member(round_robin(1, 2, 3), table, RotationState(1, last_rep_id=1), NOW)
    assert choice.rep_id == 1
    assert choice.skipped == ("Ben: at max_open 3", "Cai: inactive")
    everyone_away = reps(*(rep(i, active=False) for i in (1, 2, 3)))
    choice = choose_member(round_robin(1, 2, 3), everyone_away, RotationState(1, 2), NOW)
    assert choice.rep_id is None
    assert choice.rotation_update is None
    assert choice.skipped == ("Cai: inactive", "Ana: inactive", "Ben: inactive")
    assert choice.why == "no eligible member in team Sales"


def test_round_robin_restarts_when_the_last_served_left() -> None:
    assert sequence(round_robin(1, 2), 2, state=RotationState(1, last_rep_id=6)) == ["Ana", "Ben"]


def test_unknown_members_and_empty_teams() -> None:
    choice = choose_member(round_robin(7, 1), reps(), None, NOW)
    assert (choice.rep_id, choice.skipped) == (1, ("rep #7: unknown rep",))
    empty = choose_member(round_robin(), reps(), None, NOW)
    assert (empty.rep_id, empty.why) == (None, "team Sales has no members")


@given(members=st.integers(1, 6), leads=st.integers(0, 40))
@settings(max_examples=50, deadline=None)
def test_round_robin_is_exact(members: int, leads: int) -> None:
    counts = Counter(sequence(round_robin(*range(1, members + 1)), leads))
    assert sum(counts.values()) == leads
    for rep_id in range(1, members + 1):
        assert counts[rep(rep_id).name] in (leads // members, -(-leads // members))


def test_weighted_one_to_two_is_smooth() -> None:
    assert sequence(weighted((1, 1), (2, 2)), 9) == ["Ben", "Ana", "Ben"] * 3


def test_weighted_one_to_three_is_smooth() -> None:
    assert sequence(weighted((1, 1), (2, 3)), 8) == ["Ben", "Ana", "Ben", "Ben"] * 2


def test_weighted_three_members() -> None:
    assert sequence(weighted((1, 5), (2, 1), (3, 1)), 7) == [
        "Ana",
        "Ana",
        "Ben",
        "Ana",
        "Cai",
        "Ana",
        "Ana",
    ]


@given(weights=st.lists(st.integers(1, 5), min_size=1, max_size=5), start=st.integers(0, 30))
@settings(max_examples=60, deadline=None)
def test_weighted_any_window_of_sum_weights_is_exact(weights: list[int], start: int) -> None:
    spec = weighted(*((i + 1, w) for i, w in enumerate(weights)))
    total = sum(weights)
    picked = sequence(spec, start + 2 * total)
    for offset in range(start, start + total + 1):
        counts = Counter(picked[offset : offset + total])
        assert [counts[rep(i + 1).name] for i in range(len(weights))] == weights


def test_weighted_skips_consume_the_turn() -> None:
    def ben_away_on_lead_0(number: int, rep_id: int) -> RepState:
        return rep(rep_id, max_open=0 if (rep_id == 2 and number == 0) else None)

    # Turn order is B A B | B A B ...; Ben's first turn is skipped (no make-up), Ana takes it.
    assert sequence(weighted((1, 1), (2, 2)), 6, ben_away_on_lead_0) == [
        "Ana",
        "Ben",
        "Ben",
        "Ana",
        "Ben",
        "Ben",
    ]
    choice = choose_member(weighted((1, 1), (2, 2)), reps(rep(2, active=False)), None, NOW)
    assert (choice.rep_id, choice.skipped) == (1, ("Ben: inactive",))


def test_weighted_state_is_plain_json_and_restarts_on_change() -> None:
    spec = weighted((1, 1), (2, 2))
    choice = choose_member(spec, reps(), None, NOW)
    assert choice.rotation_update is not None
    assert choice.rotation_update.to_json() == {
        "team_id": 1,
        "last_rep_id": 2,
        "last_position": None,
        "current_weights": [
            {"rep_id": 1, "weight": 1, "current": 1},
            {"rep_id": 2, "weight": 2, "current": -1},
        ],
    }
    stale = RotationState(1, 2, (WeightedTurn(1, 1, 1), WeightedTurn(2, 5, -1)))
    assert choose_member(spec, reps(), stale, NOW).rep_id == 2  # weights changed: fresh cycle
    fresh = RotationState.from_json(1, {"current_weights": [{"rep_id": 1}]})
    assert fresh == RotationState(1)
    assert RotationState.from_json(1, "garbage") == RotationState(1)
    assert RotationState.from_json(1, {"last_rep_id": True}) == RotationState(1)


def test_weighted_never_misses_an_eligible_member_after_a_damaged_state() -> None:
    spec = weighted((1, 1), (2, 1))
    # Sums to zero with the right layout, but far off the cycle: Ben would be due for 100 turns.
    damaged = RotationState(1, 2, (WeightedTurn(1, 1, -100), WeightedTurn(2, 1, 100)))
    choice = choose_member(spec, reps(rep(2, active=False)), damaged, NOW)
    assert choice.rep_id == 1
    unbalanced = RotationState(1, 2, (WeightedTurn(1, 1, 5), WeightedTurn(2, 1, 0)))
    assert choose_member(spec, reps(), unbalanced, NOW).rep_id == 1  # not summing to 0: fresh


def test_weighted_with_nobody_eligible() -> None:
    away = reps(rep(1, active=False), rep(2, max_per_day=0))
    choice = choose_member(weighted((1, 1), (2, 2)), away, None, NOW)
    assert choice.rep_id is None
    assert choice.rotation_update is None
    assert choice.skipped == ("Ana: inactive", "Ben: at max_per_day 0")


def least_loaded(*members: int) -> TeamSpec:
    return team(1, "Sales", *members, strategy="least_loaded")


def test_least_loaded_picks_the_fewest_open() -> None:
    table = reps(rep(1, open_count=5), rep(2, open_count=2), rep(3, open_count=3))
    choice = choose_member(least_loaded(1, 2, 3), table, None, NOW)
    assert (choice.rep_id, choice.why, choice.rotation_update) == (2, "least loaded (2 open)", None)


def test_least_loaded_ties_go_to_never_assigned_then_least_recent_then_listed() -> None:
    early, late = NOW - timedelta(hours=2), NOW - timedelta(hours=1)
    table = reps(
        rep(1, open_count=1, last_assigned_at=late),
        rep(2, open_count=1, last_assigned_at=early),
        rep(3, open_count=1),
        rep(4, open_count=1),
        rep(5, open_count=0, active=False),
    )
    assert choose_member(least_loaded(1, 2, 3, 4, 5), table, None, NOW).rep_id == 3
    assert choose_member(least_loaded(4, 3, 2, 1), table, None, NOW).rep_id == 4
    assert choose_member(least_loaded(1, 2), table, None, NOW).rep_id == 2
    same = reps(rep(1, last_assigned_at=early), rep(2, last_assigned_at=early))
    assert choose_member(least_loaded(2, 1), same, None, NOW).rep_id == 2
    choice = choose_member(least_loaded(5, 1), table, None, NOW)
    assert (choice.rep_id, choice.skipped) == (1, ("Eli: inactive",))


@given(
    strategy=st.sampled_from(["round_robin", "weighted", "least_loaded"]),
    members=st.lists(
        st.tuples(st.integers(1, 7), st.integers(1, 4)), max_size=5, unique_by=lambda m: m[0]
    ),
    available=st.dictionaries(st.integers(1, 6), st.booleans()),
    last=st.one_of(st.none(), st.integers(1, 7)),
    currents=st.lists(st.integers(-9, 9), max_size=5),
)
@settings(max_examples=150, deadline=None)
def test_a_member_is_picked_exactly_when_one_is_eligible(
    strategy: str,
    members: list[tuple[int, int]],
    available: dict[int, bool],
    last: int | None,
    currents: list[int],
) -> None:
    spec = TeamSpec(1, "Sales", strategy, members=tuple(members))  # type: ignore[arg-type]
    table = {rep_id: rep(rep_id, active=active) for rep_id, active in available.items()}
    turns = tuple(
        WeightedTurn(rep_id, weight, current)
        for (rep_id, weight), current in zip(members, currents, strict=False)
    )
    choice = choose_member(spec, table, RotationState(1, last, turns), NOW)
    eligible = {rep_id for rep_id, _w in members if available.get(rep_id)}
    if eligible:
        assert choice.rep_id in eligible
    else:
        assert choice.rep_id is None
        assert choice.rotation_update is None
        assert len(choice.skipped) == len(members)


@pytest.mark.timeout(10)
def test_a_huge_weight_beside_an_ineligible_heavy_member_decides_at_once() -> None:
    """A weight of 2**31 with its member away once made the engine step through 2**31 turns
    (the worker hung until its time limit). Weights count up to MAX_MEMBER_WEIGHT."""
    from routing.engine import MAX_MEMBER_WEIGHT

    spec = weighted((1, 2**31), (2, 1))
    choice = choose_member(spec, reps(rep(1, active=False)), None, NOW)
    assert choice.rep_id == 2
    # Capped at MAX_MEMBER_WEIGHT, then scaled into a team total of MAX_TEAM_WEIGHT.
    capped = sequence(weighted((1, 10**6), (2, 1)), MAX_MEMBER_WEIGHT)
    assert Counter(capped) == {"Ana": MAX_MEMBER_WEIGHT - 1, "Ben": 1}


@pytest.mark.timeout(10)
def test_a_hostile_weighted_team_decides_in_bounded_time() -> None:
    """200 members of weight 1,000 with all but the last away walked 200,000 turns of 200
    members each (4 s a decision, under the team's lock); the team total is bounded now."""
    import time

    from routing.engine import MAX_TEAM_WEIGHT

    members = [(i, 1000) for i in range(1, 201)]
    spec = weighted(*members[:-1], (200, 1))
    away = reps(*(rep(i, active=False) for i in range(1, 200)), rep(200))
    started = time.perf_counter()
    state = None
    for _ in range(3):
        choice = choose_member(spec, away, state, NOW)
        assert choice.rep_id == 200
        state = choice.rotation_update
    assert time.perf_counter() - started < 1.0
    assert sum(t.weight for t in state.current_weights) <= MAX_TEAM_WEIGHT + len(members)


def test_round_robin_goes_on_from_the_place_of_a_last_served_rep_who_left() -> None:
    """Ben (2nd of four) was served last and left: Cai, now second, is next — not Ana."""
    state = RotationState(1, last_rep_id=2, last_position=1)
    assert sequence(round_robin(1, 3, 4), 3, state=state) == ["Cai", "Dee", "Ana"]
    # The last place of the list wraps around to the top.
    state = RotationState(1, last_rep_id=4, last_position=3)
    assert sequence(round_robin(1, 2, 3), 1, state=state) == ["Ana"]
    assert RotationState.from_json(1, state.to_json()) == state
