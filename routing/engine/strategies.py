"""Rep eligibility and the three team strategies; deterministic, with every skip explained.

- ``round_robin``: the next eligible member after the one served last, in listed order, wrapping.
  A skipped member gets no make-up turn.
- ``weighted``: nginx's smooth weighted round robin, run over *all* members: each step adds every
  member's weight to its current weight, picks the highest (first listed on ties) and subtracts
  the total. A step that lands on an ineligible member is consumed, as a skipped round-robin turn
  is (no make-up), and the next step is taken. The steps therefore always follow the same
  period-``sum(weights)`` sequence, so with every member eligible any run of ``sum(weights)``
  leads gives each member exactly its weight, interleaved smoothly (1:2 gives B A B, B A B, ...).
- ``least_loaded``: the fewest leads awaiting first touch; ties go to the member assigned least
  recently (never assigned first), then to listed order. It keeps no rotation state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import NamedTuple

from routing.engine.availability import rep_away_reason, zone_named
from routing.engine.types import (
    LoadOrdered,
    RepState,
    RotationState,
    TeamSpec,
    WeightedTurn,
    WorkingHours,
)

_NEVER = datetime.min.replace(tzinfo=UTC)

# The largest weight a member counts with in a weighted team, and the largest sum of a team's
# weights (see _weighted): a decision steps through at most that many turns.
MAX_MEMBER_WEIGHT = 1000
MAX_TEAM_WEIGHT = 1000


def within_working_hours(hours: WorkingHours, local: datetime) -> bool:
    """Whether a local wall-clock moment falls inside the weekly hours (overnight windows too)."""
    day, moment = local.isoweekday(), local.time()
    start, end = hours.start, hours.end
    if start < end:
        return day in hours.days and start <= moment < end
    if start == end:
        return day in hours.days
    # Overnight (22:00-06:00): the early-morning part belongs to the window opened the day before.
    previous_day = 7 if day == 1 else day - 1
    return (day in hours.days and moment >= start) or (previous_day in hours.days and moment < end)


def _until(moment: datetime) -> str:
    if (moment.hour, moment.minute, moment.second) == (0, 0, 0):
        return f"{moment:%Y-%m-%d}"
    return f"{moment:%Y-%m-%d %H:%M} {moment.tzname()}"


def rep_is_eligible(
    rep: RepState, team: TeamSpec | None, now: datetime, *, ignore_caps: bool = False
) -> tuple[bool, str]:
    """Whether a rep may take a lead now, and if not why ("at max_open 50").

    Working hours count only through a team that respects them; planned leave and holidays
    always count; ``ignore_caps`` (a ``rep`` action's option) skips the two caps but never
    activity or absence.
    """
    if not rep.active:
        return False, "inactive"
    until = rep.out_of_office_until
    if until is not None and until > now:
        return False, f"out of office until {_until(until)}"
    away = rep_away_reason(rep, now)
    if away is not None:
        return False, away
    if team is not None and team.respect_working_hours and rep.working_hours is not None:
        zone = zone_named(rep.timezone)
        if zone is None:
            return False, f'in an unknown time zone "{rep.timezone}"'
        local = now.astimezone(zone)
        if not within_working_hours(rep.working_hours, local):
            return False, f"outside working hours ({rep.timezone} {local:%a %H:%M})"
    if not ignore_caps:
        if rep.max_open is not None and rep.open_count >= rep.max_open:
            return False, f"at max_open {rep.max_open}"
        if rep.max_per_day is not None and rep.assigned_today >= rep.max_per_day:
            return False, f"at max_per_day {rep.max_per_day}"
    return True, "eligible"


class MemberChoice(NamedTuple):
    """A strategy's pick (or None), the members it skipped and why, and the team's new turn."""

    rep_id: int | None
    skipped: tuple[str, ...]  # "Ana: at max_open 50", in the order they were passed over
    rotation_update: RotationState | None
    why: str  # how the pick was made, or why nobody was picked


def rep_label(rep_id: int, reps: Mapping[int, RepState]) -> str:
    """A rep's name for a trace line (``rep #7`` when the snapshot lacks it)."""
    rep = reps.get(rep_id)
    return rep.name if rep is not None and rep.name else f"rep #{rep_id}"


def choose_member(
    team: TeamSpec,
    reps: Mapping[int, RepState],
    state: RotationState | None,
    now: datetime,
) -> MemberChoice:
    """Pick a member of ``team`` by its strategy among eligible members."""
    members = team.members
    if not members:
        return MemberChoice(None, (), None, f"team {team.name} has no members")
    verdicts: dict[int, tuple[bool, str]] = {}

    def check(index: int) -> tuple[bool, str]:
        verdict = verdicts.get(index)
        if verdict is None:
            rep = reps.get(members[index][0])
            verdict = (False, "unknown rep") if rep is None else rep_is_eligible(rep, team, now)
            verdicts[index] = verdict
        return verdict

    if team.strategy == "weighted":
        return _weighted(team, reps, state, check)
    if team.strategy == "least_loaded":
        return _least_loaded(team, reps, check)
    return _round_robin(team, reps, state, check)


def _skip_line(team: TeamSpec, reps: Mapping[int, RepState], index: int, why: str) -> str:
    return f"{rep_label(team.members[index][0], reps)}: {why}"


def _nobody(team: TeamSpec, skipped: list[str]) -> MemberChoice:
    return MemberChoice(None, tuple(skipped), None, f"no eligible member in team {team.name}")


def _round_robin(
    team: TeamSpec,
    reps: Mapping[int, RepState],
    state: RotationState | None,
    check: Callable[[int], tuple[bool, str]],
) -> MemberChoice:
    # O(1) to the turn, then member by member only as far as the first eligible one: a large
    # team costs what a small one does while its members are available.
    members = team.members
    count = len(members)
    last = state.last_rep_id if state is not None else None
    place = state.last_position if state is not None else None
    found = team.positions.get(last) if last is not None else None
    if found is not None:
        start = found + 1
    elif place is not None and count:
        # The last-served rep left the team: whoever now holds their place is next.
        start = place % count
    else:
        start = 0
    skipped: list[str] = []
    for step in range(count):
        index = (start + step) % count
        eligible, why = check(index)
        if eligible:
            rep_id = members[index][0]
            update = RotationState(
                team_id=team.id,
                last_rep_id=rep_id,
                current_weights=state.current_weights if state is not None else (),
                last_position=index,
            )
            return MemberChoice(rep_id, tuple(skipped), update, "next in rotation")
        skipped.append(_skip_line(team, reps, index, why))
    return _nobody(team, skipped)


def _weighted(
    team: TeamSpec,
    reps: Mapping[int, RepState],
    state: RotationState | None,
    check: Callable[[int], tuple[bool, str]],
) -> MemberChoice:
    members = team.members
    count = len(members)
    if not any(check(index)[0] for index in range(count)):
        return _nobody(team, [_skip_line(team, reps, i, check(i)[1]) for i in range(count)])
    # Bounded: a cycle is `total` steps long, and a stored weight of billions would make one
    # decision step through billions of turns (the model and the import refuse such weights).
    weights = [min(MAX_MEMBER_WEIGHT, max(1, weight)) for _rep_id, weight in members]
    total = sum(weights)
    if total > MAX_TEAM_WEIGHT:  # refused at save and import; scaled down if stored anyway
        weights = [max(1, weight * MAX_TEAM_WEIGHT // total) for weight in weights]
        total = sum(weights)
    layout = [(rep_id, weights[i]) for i, (rep_id, _w) in enumerate(members)]
    saved = state.current_weights if state is not None else ()
    starts = [[0] * count]  # a new team, or members/weights changed: the cycle starts afresh
    # A state written by this function keeps the (rep, weight) layout and sums to zero; anything
    # else was edited or damaged, and only the fresh cycle is trusted.
    if [(turn.rep_id, turn.weight) for turn in saved] == layout and not sum(
        turn.current for turn in saved
    ):
        starts.insert(0, [turn.current for turn in saved])
    skipped: list[str] = []
    passed_over: set[int] = set()
    for current in starts:
        # From the fresh cycle every member comes up within one period, so an eligible one is
        # found; the fallback only matters for a saved state that no longer lies on the cycle.
        for _step in range(total):
            for index in range(count):
                current[index] += weights[index]
            best = max(range(count), key=current.__getitem__)  # the first listed on ties
            current[best] -= total
            eligible, why = check(best)
            if eligible:
                turns = tuple(
                    WeightedTurn(rep_id, weight, current[i])
                    for i, (rep_id, weight) in enumerate(layout)
                )
                update = RotationState(
                    team_id=team.id, last_rep_id=members[best][0], current_weights=turns
                )
                return MemberChoice(members[best][0], tuple(skipped), update, "weighted turn")
            if best not in passed_over:
                passed_over.add(best)
                skipped.append(_skip_line(team, reps, best, why))
    return _nobody(team, skipped)  # unreachable: some member is eligible (checked above)


def _least_loaded(
    team: TeamSpec,
    reps: Mapping[int, RepState],
    check: Callable[[int], tuple[bool, str]],
) -> MemberChoice:
    order = reps.least_loaded_order(team) if isinstance(reps, LoadOrdered) else None
    if order is not None:
        return _least_loaded_in_order(team, reps, check, order)
    best_key: tuple[int, bool, datetime, int] | None = None
    best_index = -1
    skipped: list[str] = []
    for index, (rep_id, _weight) in enumerate(team.members):
        eligible, why = check(index)
        if not eligible:
            skipped.append(_skip_line(team, reps, index, why))
            continue
        rep = reps[rep_id]
        last = rep.last_assigned_at
        key = (rep.open_count, last is not None, last or _NEVER, index)
        if best_key is None or key < best_key:
            best_key, best_index = key, index
    if best_key is None:
        return _nobody(team, skipped)
    return MemberChoice(
        team.members[best_index][0],
        tuple(skipped),
        None,
        f"least loaded ({best_key[0]} open)",
    )


def _least_loaded_in_order(
    team: TeamSpec,
    reps: Mapping[int, RepState],
    check: Callable[[int], tuple[bool, str]],
    order: Iterable[int],
) -> MemberChoice:
    """``_least_loaded`` given the members from the least loaded up (``LoadOrdered``): the
    first eligible one is the one the full walk ranks first (the same key, a total order), so
    the walk stops there. Only the members passed over before it are listed as skipped (the
    full walk lists every ineligible member); with nobody eligible, all of them in listed
    order, as the full walk does."""
    passed: list[tuple[int, str]] = []
    for index in order:
        eligible, why = check(index)
        if not eligible:
            passed.append((index, why))
            continue
        rep = reps[team.members[index][0]]
        return MemberChoice(
            team.members[index][0],
            tuple(_skip_line(team, reps, i, w) for i, w in passed),
            None,
            f"least loaded ({rep.open_count} open)",
        )
    return _nobody(team, [_skip_line(team, reps, i, w) for i, w in sorted(passed)])
