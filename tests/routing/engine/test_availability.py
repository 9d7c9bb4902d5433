"""Planned absences and holidays in the engine (routing.engine.availability, rep_is_eligible,
the SLA clock): across DST changes and midnights in several zones, and as properties."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.engine import Absence, Holiday, TeamSpec, rep_is_eligible
from routing.engine.availability import (
    NonexistentLocalTime,
    absence_end_at,
    rep_away_reason,
    subtract_absences,
    wall_clock_at,
)
from routing.engine.sla import sla_due_at
from routing.engine.types import WorkingHours
from tests.routing.engine.factories import rep

ZONES = ("Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Sydney", "UTC")


def local(zone: str, year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(zone))


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def leave(zone: str, start: tuple[int, int, int, int], end: tuple[int, int, int, int]) -> Absence:
    return Absence(starts_at=local(zone, *start), ends_at=local(zone, *end))


# --- Absences across DST changes and midnights ------------------------------------------------


def test_berlin_leave_over_the_spring_dst_change_ends_at_local_nine() -> None:
    # 29 March 2026: Berlin moves from CET (+1) to CEST (+2) at 02:00.
    away = rep(
        1,
        timezone="Europe/Berlin",
        absences=(leave("Europe/Berlin", (2026, 3, 28, 18), (2026, 3, 30, 9)),),
    )
    assert rep_is_eligible(away, None, utc(2026, 3, 28, 16, 59))[0]  # 17:59 CET
    assert not rep_is_eligible(away, None, utc(2026, 3, 28, 17, 0))[0]
    assert not rep_is_eligible(away, None, utc(2026, 3, 30, 6, 59))[0]  # 08:59 CEST
    assert rep_is_eligible(away, None, utc(2026, 3, 30, 7, 0))[0]  # 09:00 CEST
    assert rep_is_eligible(away, None, utc(2026, 3, 30, 7, 0))[1] == "eligible"
    why = rep_is_eligible(away, None, utc(2026, 3, 29, 12))[1]
    assert why == "on leave until 2026-03-30 09:00 CEST (Europe/Berlin)"


def test_new_york_leave_to_midnight_after_the_autumn_change() -> None:
    # 1 November 2026: New York falls back from EDT (-4) to EST (-5) at 02:00.
    away = rep(
        1,
        timezone="America/New_York",
        absences=(leave("America/New_York", (2026, 10, 31, 0), (2026, 11, 2, 0)),),
    )
    assert rep_is_eligible(away, None, utc(2026, 10, 31, 3, 59))[0]  # 23:59 EDT on the 30th
    assert not rep_is_eligible(away, None, utc(2026, 10, 31, 4, 0))[0]  # midnight EDT
    # Midnight of 2 November is 05:00 UTC (EST), not 04:00 as the offset at the start was.
    assert not rep_is_eligible(away, None, utc(2026, 11, 2, 4, 30))[0]
    assert rep_is_eligible(away, None, utc(2026, 11, 2, 5, 0))[0]
    assert rep_is_eligible(away, None, utc(2026, 11, 1, 12))[1] == (
        "on leave until 2026-11-02 00:00 EST (America/New_York)"
    )


def test_kolkata_half_hour_offset_midnight() -> None:
    away = rep(
        1,
        timezone="Asia/Kolkata",
        absences=(leave("Asia/Kolkata", (2026, 8, 14, 0), (2026, 8, 16, 0)),),
    )
    assert rep_is_eligible(away, None, utc(2026, 8, 13, 18, 29))[0]  # 23:59 IST
    assert not rep_is_eligible(away, None, utc(2026, 8, 13, 18, 30))[0]  # 00:00 IST
    assert not rep_is_eligible(away, None, utc(2026, 8, 15, 18, 29))[0]
    assert rep_is_eligible(away, None, utc(2026, 8, 15, 18, 30))[0]


def test_sydney_leave_over_the_april_dst_end() -> None:
    # 5 April 2026: Sydney goes from AEDT (+11) back to AEST (+10) at 03:00.
    away = rep(
        1,
        timezone="Australia/Sydney",
        absences=(leave("Australia/Sydney", (2026, 4, 4, 0), (2026, 4, 6, 0)),),
    )
    assert not rep_is_eligible(away, None, utc(2026, 4, 3, 13, 0))[0]  # 00:00 AEDT
    assert rep_is_eligible(away, None, utc(2026, 4, 3, 12, 59))[0]
    assert not rep_is_eligible(away, None, utc(2026, 4, 5, 13, 59))[0]  # 23:59 AEST
    assert rep_is_eligible(away, None, utc(2026, 4, 5, 14, 0))[0]  # 00:00 AEST on the 6th
    assert rep_is_eligible(away, None, utc(2026, 4, 5, 1))[1] == (
        "on leave until 2026-04-06 00:00 AEST (Australia/Sydney)"
    )


def test_absences_that_meet_are_one_leave_for_the_trace() -> None:
    zone = "Europe/Berlin"
    first = leave(zone, (2026, 7, 1, 0), (2026, 7, 8, 0))
    second = leave(zone, (2026, 7, 8, 0), (2026, 7, 10, 12))
    later = leave(zone, (2026, 8, 1, 0), (2026, 8, 2, 0))
    away = rep(1, timezone=zone, absences=(later, second, first))
    assert absence_end_at(away.absences, local(zone, 2026, 7, 3, 10)) == second.ends_at
    assert rep_away_reason(away, local(zone, 2026, 7, 3, 10)) == (
        "on leave until 2026-07-10 12:00 CEST (Europe/Berlin)"
    )
    assert rep_away_reason(away, local(zone, 2026, 7, 20, 10)) is None


def test_an_absence_must_end_after_it_starts() -> None:
    moment = utc(2026, 1, 1)
    with pytest.raises(ValueError, match="end after"):
        Absence(starts_at=moment, ends_at=moment)
    with pytest.raises(ValueError, match="timezone-aware"):
        Absence(starts_at=datetime(2026, 1, 1), ends_at=moment + timedelta(days=1))  # noqa: DTZ001


# --- Holidays ---------------------------------------------------------------------------------


def test_a_holiday_is_the_local_date_in_the_reps_zone() -> None:
    republic_day = {date(2026, 1, 26): "Republic Day"}
    kolkata = rep(1, timezone="Asia/Kolkata", holidays=republic_day)
    assert rep_is_eligible(kolkata, None, utc(2026, 1, 25, 18, 29))[0]
    assert rep_is_eligible(kolkata, None, utc(2026, 1, 25, 18, 30)) == (
        False,
        "public holiday: Republic Day",
    )
    assert not rep_is_eligible(kolkata, None, utc(2026, 1, 26, 18, 29))[0]
    assert rep_is_eligible(kolkata, None, utc(2026, 1, 26, 18, 30))[0]

    christmas = {date(2026, 12, 25): "Christmas Day"}
    sydney = rep(2, timezone="Australia/Sydney", holidays=christmas)
    new_york = rep(3, timezone="America/New_York", holidays=christmas)
    moment = utc(2026, 12, 24, 14)  # 01:00 on the 25th in Sydney, 09:00 on the 24th in New York
    assert not rep_is_eligible(sydney, None, moment)[0]
    assert rep_is_eligible(new_york, None, moment)[0]


def test_leave_is_named_before_a_holiday_and_after_inactivity() -> None:
    zone = "Europe/Berlin"
    both = rep(
        1,
        timezone=zone,
        holidays={date(2026, 12, 25): "Christmas Day"},
        absences=(leave(zone, (2026, 12, 21, 0), (2027, 1, 4, 0)),),
    )
    assert rep_is_eligible(both, None, local(zone, 2026, 12, 25, 10))[1] == (
        "on leave until 2027-01-04 00:00 CET (Europe/Berlin)"
    )
    inactive = rep(2, active=False, holidays={date(2026, 12, 25): "Christmas Day"})
    assert rep_is_eligible(inactive, None, utc(2026, 12, 25, 10))[1] == "inactive"


def test_time_off_counts_whatever_the_team_and_caps() -> None:
    team = TeamSpec(id=1, name="T", respect_working_hours=False, members=((1, 1),))
    away = rep(1, holidays={date(2026, 5, 1): "Labour Day"})
    assert not rep_is_eligible(away, team, utc(2026, 5, 1, 10))[0]
    assert not rep_is_eligible(away, team, utc(2026, 5, 1, 10), ignore_caps=True)[0]


# --- Property: availability at t is exactly "no absence covers t, t's local date no holiday" --

_BASE = utc(2026, 1, 1)


@st.composite
def reps_with_time_off(draw: st.DrawFn) -> tuple[object, list[tuple[int, int]], set[date]]:
    zone = draw(st.sampled_from(ZONES))
    spans = draw(
        st.lists(st.tuples(st.integers(0, 400 * 24 * 60), st.integers(1, 20 * 24 * 60)), max_size=6)
    )
    days = draw(st.sets(st.integers(0, 400).map(lambda n: date(2026, 1, 1) + timedelta(n))))
    absences = tuple(
        Absence(
            starts_at=_BASE + timedelta(minutes=start),
            ends_at=_BASE + timedelta(minutes=start + length),
        )
        for start, length in spans
    )
    state = rep(1, timezone=zone, absences=absences, holidays=dict.fromkeys(days, "Day off"))
    return state, spans, days


@settings(max_examples=300, deadline=None)
@given(reps_with_time_off(), st.integers(-24 * 60, 430 * 24 * 60))
def test_available_exactly_when_no_absence_and_no_holiday(
    case: tuple[object, list[tuple[int, int]], set[date]], offset: int
) -> None:
    state, spans, days = case
    moment = _BASE + timedelta(minutes=offset)
    inside = any(start <= offset < start + length for start, length in spans)
    holiday = moment.astimezone(ZoneInfo(state.timezone)).date() in days  # type: ignore[attr-defined]
    eligible, why = rep_is_eligible(state, None, moment)  # type: ignore[arg-type]
    assert eligible == (not inside and not holiday)
    if inside:
        assert why.startswith("on leave until ")
        end = absence_end_at(state.absences, moment)  # type: ignore[attr-defined]
        assert end is not None
        assert end > moment
        assert rep_is_eligible(state, None, end - timedelta(microseconds=1))[1].startswith(  # type: ignore[arg-type]
            ("on leave", "public holiday")
        )
    elif holiday:
        assert why == "public holiday: Day off"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 300)), max_size=5),
    st.integers(0, 1000),
    st.integers(1, 600),
)
def test_subtracting_absences_leaves_exactly_the_uncovered_minutes(
    spans: list[tuple[int, int]], start: int, length: int
) -> None:
    absences = [
        Absence(starts_at=_BASE + timedelta(minutes=s), ends_at=_BASE + timedelta(minutes=s + n))
        for s, n in spans
    ]
    pieces = list(
        subtract_absences(
            _BASE + timedelta(minutes=start), _BASE + timedelta(minutes=start + length), absences
        )
    )
    free = {
        int((piece_start - _BASE).total_seconds() // 60) + i
        for piece_start, piece_end in pieces
        for i in range(int((piece_end - piece_start).total_seconds() // 60))
    }
    expected = {
        minute
        for minute in range(start, start + length)
        if not any(s <= minute < s + n for s, n in spans)
    }
    assert free == expected
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(pieces))


# --- The SLA clock stops through holidays and leave ---------------------------------------------

WEEKDAYS_9_TO_18 = WorkingHours(frozenset({1, 2, 3, 4, 5}), time(9), time(18))


def test_sla_skips_a_public_holiday_in_working_hours() -> None:
    zone = "Europe/Berlin"
    # Thursday 30 April 2026 17:30 + 60 min; Friday 1 May is Labour Day: due Monday 09:30.
    due = sla_due_at(
        local(zone, 2026, 4, 30, 17, 30),
        60,
        WEEKDAYS_9_TO_18,
        zone,
        holidays={date(2026, 5, 1)},
    )
    assert due == local(zone, 2026, 5, 4, 9, 30)


def test_sla_pauses_through_leave_across_dst() -> None:
    zone = "America/New_York"
    # Friday 30 Oct 2026 17:00 + 120 min, working 09-18 on weekdays, on leave Monday 2 November
    # until Tuesday 12:00 (after the fall-back on Sunday): 60 on Friday, 60 from Tuesday 12:00.
    off = leave(zone, (2026, 11, 2, 0), (2026, 11, 3, 12))
    due = sla_due_at(local(zone, 2026, 10, 30, 17, 0), 120, WEEKDAYS_9_TO_18, zone, absences=(off,))
    assert due == local(zone, 2026, 11, 3, 13, 0)
    assert due.astimezone(UTC) == utc(2026, 11, 3, 18, 0)  # EST, -5


def test_sla_without_working_hours_counts_every_hour_not_away() -> None:
    zone = "Australia/Sydney"
    off = leave(zone, (2026, 4, 4, 12), (2026, 4, 5, 12))  # 25 hours: the clock goes back
    start = local(zone, 2026, 4, 4, 11)
    due = sla_due_at(start, 120, None, zone, absences=(off,))
    assert due == local(zone, 2026, 4, 5, 13)
    assert due.astimezone(UTC) - start.astimezone(UTC) == timedelta(hours=27)
    # No hours, no time off: plain wall-clock minutes.
    assert sla_due_at(start, 120, None, zone) == start + timedelta(minutes=120)


def test_sla_on_a_holiday_with_no_hours_starts_the_next_local_day() -> None:
    zone = "Asia/Kolkata"
    start = local(zone, 2026, 1, 26, 10)
    due = sla_due_at(start, 30, None, zone, holidays={date(2026, 1, 26)})
    assert due == local(zone, 2026, 1, 27, 0, 30)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6000), st.integers(1, 900)), max_size=4),
    st.sets(st.integers(0, 6)),
    st.integers(0, 3000),
    st.integers(1, 1500),
)
def test_sla_due_is_exactly_minutes_of_available_time(
    spans: list[tuple[int, int]], holiday_offsets: set[int], start: int, minutes: int
) -> None:
    # UTC, whole days, minute granularity: count the available minutes one by one.
    absences = [
        Absence(starts_at=_BASE + timedelta(minutes=s), ends_at=_BASE + timedelta(minutes=s + n))
        for s, n in spans
    ]
    holidays = {date(2026, 1, 1) + timedelta(days=n) for n in holiday_offsets}
    begin = _BASE + timedelta(minutes=start)
    due = sla_due_at(begin, minutes, None, "UTC", holidays=holidays, absences=absences)

    def available(minute: int) -> bool:
        moment = _BASE + timedelta(minutes=minute)
        return moment.date() not in holidays and not any(s <= minute < s + n for s, n in spans)

    end = int((due - _BASE).total_seconds() // 60)
    assert due == _BASE + timedelta(minutes=end)
    assert sum(available(m) for m in range(start, end)) == minutes
    assert available(end - 1)


def test_a_calendars_custom_day_is_a_company_holiday_in_the_trace() -> None:
    days = {date(2026, 3, 3): Holiday("Offsite", custom=True), date(2026, 4, 3): "Good Friday"}
    berlin = rep(1, timezone="Europe/Berlin", holidays=days)
    assert rep_away_reason(berlin, utc(2026, 3, 3, 12)) == "company holiday: Offsite"
    assert rep_away_reason(berlin, utc(2026, 4, 3, 12)) == "public holiday: Good Friday"
    assert rep_away_reason(berlin, utc(2026, 4, 3, 12)) == Holiday("Good Friday").label


def test_a_wall_clock_time_in_the_spring_gap_names_no_moment() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    with pytest.raises(NonexistentLocalTime, match="does not exist in Europe/Berlin"):
        wall_clock_at(datetime(2026, 3, 29, 2, 30), berlin)  # noqa: DTZ001
    assert wall_clock_at(datetime(2026, 3, 29, 3, 0), berlin) == utc(2026, 3, 29, 1)  # noqa: DTZ001
    # The repeated autumn hour: the first time, in summer time.
    assert wall_clock_at(datetime(2026, 10, 25, 2, 30), berlin) == utc(2026, 10, 25, 0, 30)  # noqa: DTZ001
    with pytest.raises(NonexistentLocalTime, match="America/New_York"):
        wall_clock_at(datetime(2026, 3, 8, 2, 15), ZoneInfo("America/New_York"))  # noqa: DTZ001


@settings(max_examples=300, deadline=None)
@given(
    wall=st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2028, 12, 31)),  # noqa: DTZ001
    zone=st.sampled_from(ZONES),
)
def test_a_wall_clock_time_is_refused_or_reads_back_the_same(wall: datetime, zone: str) -> None:
    tz = ZoneInfo(zone)
    wall = wall.replace(second=0, microsecond=0, fold=0)
    try:
        moment = wall_clock_at(wall, tz)
    except NonexistentLocalTime:
        # Refused only in a gap: no moment of that day reads this wall-clock time.
        start = datetime.combine(wall.date(), time(), tzinfo=tz).astimezone(UTC)
        minutes = (start + timedelta(minutes=m) for m in range(-120, 26 * 60))
        assert all(m.astimezone(tz).replace(tzinfo=None) != wall for m in minutes)
        return
    assert moment.astimezone(tz).replace(tzinfo=None) == wall
