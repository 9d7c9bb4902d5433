"""Time off as the engine reads it: each rep's absences and holidays, for a routing snapshot.

``time_off_facts(now=..., team_members=...)`` costs one query for the absences not yet over and,
only when a holiday calendar exists, two more (calendars with their reps and teams, custom
days). Public holidays come from the ``holidays`` package, computed once per process for each
(country, subdivision, year). A rep's holidays are the days of every calendar that names them
or one of their teams, for the year before ``now`` to two years after (the SLA clock's reach).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime

import holidays as holidays_package

from routing.engine import Absence, Holiday
from routing.timeoff.models import HolidayCalendar, HolidayCalendarDay, RepAbsence

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RepTimeOff:
    """One rep's absences (not yet over) and holidays (local date -> the holiday)."""

    absences: tuple[Absence, ...] = ()
    holidays: Mapping[date, Holiday] = field(default_factory=dict)


@functools.lru_cache(maxsize=256)
def public_holidays(country: str, subdivision: str, year: int) -> tuple[tuple[date, str], ...]:
    """A country's (and subdivision's) public holidays in ``year``, as (date, name) pairs.

    Calendars are checked against the package when saved, but an upgrade of it may rename or
    drop a country or subdivision (it raises NotImplementedError), or fail otherwise: that
    calendar then has its custom days only, and the error is logged (once per process and year),
    instead of raising into every routing decision."""
    try:
        found = holidays_package.country_holidays(country, subdiv=subdivision or None, years=year)
        return tuple(sorted(found.items()))
    except Exception:
        logger.exception(
            "holiday calendar: the holidays package cannot give %s%s's public holidays for %s; "
            "only the calendar's custom days count until it is fixed in the admin",
            country,
            f"-{subdivision}" if subdivision else "",
            year,
        )
        return ()


def calendar_days(
    country: str, subdivision: str, custom: Iterable[tuple[date, str]], years: Iterable[int]
) -> dict[date, Holiday]:
    """A calendar's days off in ``years``: public holidays, then custom days (which win)."""
    days: dict[date, Holiday] = {}
    if country:
        for year in years:
            for day, name in public_holidays(country, subdivision, year):
                days[day] = Holiday(name=name)
    for day, name in custom:
        days[day] = Holiday(name=name, custom=True)
    return days


def time_off_facts(
    *, now: datetime, team_members: Mapping[int, Iterable[int]]
) -> dict[int, RepTimeOff]:
    """Every rep with time off: their absences ending after ``now`` and their holidays."""
    absences: dict[int, list[Absence]] = {}
    for rep_id, starts_at, ends_at in (
        RepAbsence.objects.filter(ends_at__gt=now)
        .order_by("rep_id", "starts_at")
        .values_list("rep_id", "starts_at", "ends_at")
    ):
        absences.setdefault(rep_id, []).append(Absence(starts_at=starts_at, ends_at=ends_at))
    holidays = _holidays(now, team_members)
    return {
        rep_id: RepTimeOff(
            absences=tuple(absences.get(rep_id, ())), holidays=holidays.get(rep_id, {})
        )
        for rep_id in set(absences) | set(holidays)
    }


def _holidays(
    now: datetime, team_members: Mapping[int, Iterable[int]]
) -> dict[int, dict[date, Holiday]]:
    calendars = list(HolidayCalendar.objects.prefetch_related("reps", "teams").order_by("id"))
    if not calendars:
        return {}
    years = range(now.year - 1, now.year + 3)
    custom: dict[int, list[tuple[date, str]]] = {}
    for calendar_id, day, name in HolidayCalendarDay.objects.filter(
        date__year__gte=years.start, date__year__lt=years.stop
    ).values_list("calendar_id", "date", "name"):
        custom.setdefault(calendar_id, []).append((day, name))
    found: dict[int, dict[date, Holiday]] = {}
    for calendar in calendars:
        days = calendar_days(
            calendar.country, calendar.subdivision, custom.get(calendar.id, ()), years
        )
        if not days:
            continue
        rep_ids = {rep.id for rep in calendar.reps.all()}
        for team in calendar.teams.all():
            rep_ids.update(team_members.get(team.id, ()))
        for rep_id in rep_ids:
            found.setdefault(rep_id, {}).update(days)
    return found


class TimeOffByRep(Mapping[int, RepTimeOff]):
    """``time_off_facts`` rep by rep, each rep's worked out when first asked for: the same
    queries (absences, and the calendars when any exists), but a calendar naming a team of
    1,000 reps costs a decision only the reps it looks at. ``rep_teams(rep_id)``: the teams
    the rep is a member of. Every rep is in it (without time off: empty)."""

    def __init__(self, *, now: datetime, rep_teams: Callable[[int], Iterable[int]]) -> None:
        self._absences: dict[int, list[Absence]] = {}
        for rep_id, starts_at, ends_at in (
            RepAbsence.objects.filter(ends_at__gt=now)
            .order_by("rep_id", "starts_at")
            .values_list("rep_id", "starts_at", "ends_at")
        ):
            self._absences.setdefault(rep_id, []).append(
                Absence(starts_at=starts_at, ends_at=ends_at)
            )
        self._rep_teams = rep_teams
        self._years = range(now.year - 1, now.year + 3)
        self._calendars = list(
            HolidayCalendar.objects.prefetch_related("reps", "teams").order_by("id")
        )
        self._custom: dict[int, list[tuple[date, str]]] = {}
        self._by_rep: dict[int, list[int]] = {}
        self._by_team: dict[int, list[int]] = {}
        if self._calendars:
            for calendar_id, day, name in HolidayCalendarDay.objects.filter(
                date__year__gte=self._years.start, date__year__lt=self._years.stop
            ).values_list("calendar_id", "date", "name"):
                self._custom.setdefault(calendar_id, []).append((day, name))
            for place, calendar in enumerate(self._calendars):
                for rep in calendar.reps.all():
                    self._by_rep.setdefault(rep.id, []).append(place)
                for team in calendar.teams.all():
                    self._by_team.setdefault(team.id, []).append(place)
        self._days: dict[int, dict[date, Holiday]] = {}
        self._found: dict[int, RepTimeOff] = {}

    def _calendar_days(self, place: int) -> dict[date, Holiday]:
        days = self._days.get(place)
        if days is None:
            calendar = self._calendars[place]
            days = self._days[place] = calendar_days(
                calendar.country,
                calendar.subdivision,
                self._custom.get(calendar.id, ()),
                self._years,
            )
        return days

    def __getitem__(self, rep_id: int) -> RepTimeOff:
        found = self._found.get(rep_id)
        if found is not None:
            return found
        places = set(self._by_rep.get(rep_id, ()))
        if self._by_team:
            for team_id in self._rep_teams(rep_id):
                places.update(self._by_team.get(team_id, ()))
        holidays: dict[date, Holiday] = {}
        for place in sorted(places):  # calendar id order: a later calendar's day wins
            holidays.update(self._calendar_days(place))
        found = self._found[rep_id] = RepTimeOff(
            absences=tuple(self._absences.get(rep_id, ())), holidays=holidays
        )
        return found

    def __iter__(self) -> Iterator[int]:
        raise TypeError("time off by rep is looked up rep by rep, not listed")

    def __len__(self) -> int:
        raise TypeError("time off by rep is looked up rep by rep, not counted")


def rep_time_off(*, rep_id: int, now: datetime) -> RepTimeOff:
    """One rep's time off (an assignment made outside a routing decision)."""
    from routing.models import TeamMembership

    members: dict[int, list[int]] = {}
    for team_id in TeamMembership.objects.filter(rep_id=rep_id).values_list("team_id", flat=True):
        members.setdefault(team_id, []).append(rep_id)
    return time_off_facts(now=now, team_members=members).get(rep_id, RepTimeOff())
