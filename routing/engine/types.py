"""Plain data in and out of the engine: the lead's facts, rep and team state, the decision.

Everything is a frozen dataclass the caller builds from its own storage; nothing here knows
about the database. Datetimes must be timezone-aware.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from routing.engine.fields import CUSTOM_PREFIX

Strategy = Literal["round_robin", "weighted", "least_loaded"]
Outcome = Literal["owner", "excluded", "nothing"]
OnSlaBreach = Literal["notify", "reassign"]

STRATEGIES: tuple[Strategy, ...] = ("round_robin", "weighted", "least_loaded")


def _require_aware(name: str, value: datetime | None) -> None:
    if value is not None and value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime")


@dataclass(frozen=True, slots=True)
class AccountFacts:
    """The account the lead matched (by domain): what conditions and `account_owner` read."""

    name: str | None = None
    tier: str | None = None
    domain: str | None = None
    owner_rep_id: int | None = None


@dataclass(frozen=True, slots=True)
class LeadFacts:
    """What the engine knows of a lead; treat the mappings as read-only once built."""

    fields: Mapping[str, Any] = field(default_factory=dict)  # canonical field -> value
    custom: Mapping[str, Any] = field(default_factory=dict)  # unmapped keys, as sent
    source: str | None = None  # the source's slug
    is_free_email: bool = False
    account: AccountFacts | None = None

    def facts(self) -> dict[str, Any]:
        """One flat mapping of every condition field (``custom.<key>`` included) to its value."""
        flat = dict(self.fields)
        account = self.account
        flat["source"] = self.source
        flat["is_free_email"] = self.is_free_email
        flat["account.exists"] = account is not None
        if account is not None:
            flat["account.name"] = account.name
            flat["account.tier"] = account.tier
            flat["account.domain"] = account.domain
        else:
            flat["account.name"] = flat["account.tier"] = flat["account.domain"] = None
        for key, value in self.custom.items():
            flat[CUSTOM_PREFIX + str(key)] = value
        return flat


@dataclass(frozen=True, slots=True)
class WorkingHours:
    """Weekly hours in the rep's time zone; ``start > end`` is an overnight window (22:00-06:00).

    ``days`` are ISO weekdays (1 = Monday); an overnight window belongs to the day it starts on.
    ``start == end`` means the whole day.
    """

    days: frozenset[int]
    start: time
    end: time


@dataclass(frozen=True, slots=True)
class Absence:
    """A rep's planned time off: from ``starts_at`` (inclusive) to ``ends_at`` (exclusive)."""

    starts_at: datetime
    ends_at: datetime

    def __post_init__(self) -> None:
        _require_aware("starts_at", self.starts_at)
        _require_aware("ends_at", self.ends_at)
        if self.ends_at <= self.starts_at:
            raise ValueError("an absence must end after it starts")

    def covers(self, moment: datetime) -> bool:
        return self.starts_at <= moment < self.ends_at


@dataclass(frozen=True, slots=True)
class Holiday:
    """A day off of a holiday calendar: a public holiday, or a custom day the calendar adds."""

    name: str
    custom: bool = False

    @property
    def label(self) -> str:
        """As the trace reads it: "public holiday: Christmas Day", "company holiday: Offsite"."""
        return f"{'company' if self.custom else 'public'} holiday: {self.name}"


@dataclass(frozen=True, slots=True)
class RepState:
    """A snapshot of one rep: availability, caps and the counts the caps are checked against."""

    id: int
    email: str
    name: str
    active: bool = True
    out_of_office_until: datetime | None = None
    timezone: str = "UTC"
    working_hours: WorkingHours | None = None
    max_open: int | None = None  # None = unlimited
    max_per_day: int | None = None  # None = unlimited
    open_count: int = 0  # assigned leads awaiting first touch
    assigned_today: int = 0  # assignments since local midnight in `timezone` (caller computes)
    last_assigned_at: datetime | None = None
    # Planned time off (any order; the caller may leave out those already over) and the days
    # off of the rep's holiday calendar: local date in ``timezone`` -> the holiday (a plain name
    # is a public holiday's).
    absences: tuple[Absence, ...] = ()
    holidays: Mapping[date, str | Holiday] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require_aware("out_of_office_until", self.out_of_office_until)
        _require_aware("last_assigned_at", self.last_assigned_at)


@dataclass(frozen=True, slots=True)
class TeamSpec:
    """A team: its strategy and its members in listed order as ``(rep_id, weight)`` pairs."""

    id: int
    name: str
    strategy: Strategy = "round_robin"
    respect_working_hours: bool = False
    sla_minutes: int | None = None
    members: tuple[tuple[int, int], ...] = ()
    # rep id -> its place in ``members`` (the first, should a rep be listed twice): a round
    # robin finds the turn's place in O(1), whatever the size of the team. Derived, not compared.
    positions: Mapping[int, int] = field(
        init=False, default_factory=dict, compare=False, hash=False, repr=False
    )

    def __post_init__(self) -> None:
        places: dict[int, int] = {}
        for index, (rep_id, _weight) in enumerate(self.members):
            places.setdefault(rep_id, index)
        object.__setattr__(self, "positions", places)


@runtime_checkable
class LoadOrdered(Protocol):
    """A reps mapping that can list a team's members from the least loaded up, so a
    least-loaded team need not read every member (the caller's database sorts them).

    ``least_loaded_order(team)`` yields indexes into ``team.members``, every member once, in
    ascending ``(open_count, last_assigned_at is not None, last_assigned_at, index)``: the
    order ``choose_member`` ranks eligible members by. None: no such order (read them all).
    """

    def least_loaded_order(self, team: TeamSpec) -> Iterable[int] | None: ...


@dataclass(frozen=True, slots=True)
class WeightedTurn:
    """One member's place in a smooth weighted round robin: its weight and current weight."""

    rep_id: int
    weight: int
    current: int


@dataclass(frozen=True, slots=True)
class RotationState:
    """A team's turn, persisted by the caller as JSON (``to_json``/``from_json``).

    - ``last_rep_id``: the member served last (round robin starts after it; weighted records it).
    - ``last_position``: that member's place in the list then; when they have left the team,
      round robin goes on with whoever now holds that place instead of the top of the list.
    - ``current_weights``: weighted teams only: nginx smooth-WRR current weight per member, in
      member order, with the weight it was computed for. Empty means the cycle starts afresh
      (all zero); so does any state whose ``(rep_id, weight)`` list no longer matches the team
      (the order stays exact after a membership or weight change) or whose currents do not sum
      to zero (edited or damaged).
    """

    team_id: int
    last_rep_id: int | None = None
    current_weights: tuple[WeightedTurn, ...] = ()
    last_position: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The state as JSON-ready data."""
        return {
            "team_id": self.team_id,
            "last_rep_id": self.last_rep_id,
            "last_position": self.last_position,
            "current_weights": [
                {"rep_id": turn.rep_id, "weight": turn.weight, "current": turn.current}
                for turn in self.current_weights
            ],
        }

    @classmethod
    def from_json(cls, team_id: int, data: Any) -> RotationState:
        """Read a state written by ``to_json``; anything malformed reads as a fresh cycle."""
        if not isinstance(data, Mapping):
            return cls(team_id=team_id)
        last = data.get("last_rep_id")
        last_rep_id = last if isinstance(last, int) and not isinstance(last, bool) else None
        place = data.get("last_position")
        last_position = (
            place if isinstance(place, int) and not isinstance(place, bool) and place >= 0 else None
        )
        turns: list[WeightedTurn] = []
        raw_turns = data.get("current_weights")
        if isinstance(raw_turns, list):
            for raw in raw_turns:
                values = (
                    [raw.get(key) for key in ("rep_id", "weight", "current")]
                    if isinstance(raw, Mapping)
                    else []
                )
                numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
                if len(numbers) != 3:
                    turns = []  # a damaged vector would break exactness: restart the cycle
                    break
                turns.append(WeightedTurn(*numbers))
        return cls(
            team_id=team_id,
            last_rep_id=last_rep_id,
            current_weights=tuple(turns),
            last_position=last_position,
        )


@dataclass(frozen=True, slots=True)
class TerritorySpec:
    """A territory: countries, optional regions and postal prefixes, and its rep or team."""

    id: int
    name: str
    countries: tuple[str, ...]
    regions: tuple[str, ...] = ()
    postal_prefixes: tuple[str, ...] = ()
    team_id: int | None = None
    rep_id: int | None = None


class TraceEntry(NamedTuple):
    """One rule considered: whether it matched, and in plain words why (not) or what it yielded.

    A named tuple rather than a frozen dataclass: a trace can hold thousands of entries, and a
    frozen dataclass costs about three times as much to build.
    """

    rule_id: int | None
    rule_name: str
    priority: int
    matched: bool
    why: str
    decided: bool = False  # this rule's action ended the evaluation

    def to_json(self) -> dict[str, Any]:
        """The entry as JSON-ready data."""
        return {
            "rule_id": self.rule_id,
            "rule": self.rule_name,
            "priority": self.priority,
            "matched": self.matched,
            "decided": self.decided,
            "why": self.why,
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """The engine's answer for one lead, with the trace that explains it.

    ``rotation_update`` is the new turn of the team whose rotation moved (None when none did):
    the caller persists it under the team's lock, or drops it for a simulation. ``trace`` is
    built on first access, so deciding stays cheap when nobody reads it.
    """

    outcome: Outcome
    reason: str
    trace: Sequence[TraceEntry]
    ruleset_version: int | None = None
    rep_id: int | None = None
    team_id: int | None = None
    rule_id: int | None = None
    rule_name: str | None = None
    sla_minutes: int | None = None
    on_sla_breach: OnSlaBreach | None = None
    priority: str | None = None
    tags: tuple[str, ...] = ()
    exclusion_reason: str | None = None
    rotation_update: RotationState | None = None

    def matched_trace(self) -> tuple[TraceEntry, ...]:
        """The trace entries of the rules that matched, without building the others' words."""
        matched = getattr(self.trace, "matched", None)
        if callable(matched):
            entries: tuple[TraceEntry, ...] = matched()
            return entries
        return tuple(entry for entry in self.trace if entry.matched)

    def to_json(self) -> dict[str, Any]:
        """The decision as JSON-ready data (trace included; the rotation update left out)."""
        return {
            "outcome": self.outcome,
            "reason": self.reason,
            "ruleset_version": self.ruleset_version,
            "rep_id": self.rep_id,
            "team_id": self.team_id,
            "rule_id": self.rule_id,
            "rule": self.rule_name,
            "sla_minutes": self.sla_minutes,
            "on_sla_breach": self.on_sla_breach,
            "priority": self.priority,
            "tags": list(self.tags),
            "exclusion_reason": self.exclusion_reason,
            "trace": [entry.to_json() for entry in self.trace],
        }
