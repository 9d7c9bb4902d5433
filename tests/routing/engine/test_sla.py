"""SLA due times in working hours (routing.engine.sla)."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.engine.sla import sla_due_at
from routing.engine.types import WorkingHours

BERLIN = ZoneInfo("Europe/Berlin")
WEEKDAYS_9_TO_18 = WorkingHours(frozenset({1, 2, 3, 4, 5}), time(9), time(18))


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=BERLIN)


def test_minutes_count_only_inside_working_hours() -> None:
    # Thursday 17:30 + 60 min: 30 today, 30 on Friday from 09:00.
    assert sla_due_at(at(2026, 3, 5, 17, 30), 60, WEEKDAYS_9_TO_18, "Europe/Berlin") == at(
        2026, 3, 6, 9, 30
    )
    # Friday 17:30 + 60 min: on to Monday 09:30.
    assert sla_due_at(at(2026, 3, 6, 17, 30), 60, WEEKDAYS_9_TO_18, "Europe/Berlin") == at(
        2026, 3, 9, 9, 30
    )
    # Saturday: the clock starts on Monday at 09:00.
    assert sla_due_at(at(2026, 3, 7, 12, 0), 15, WEEKDAYS_9_TO_18, "Europe/Berlin") == at(
        2026, 3, 9, 9, 15
    )
    # Inside the window: plain minutes.
    assert sla_due_at(at(2026, 3, 5, 10, 0), 45, WEEKDAYS_9_TO_18, "Europe/Berlin") == at(
        2026, 3, 5, 10, 45
    )


def test_overnight_windows_and_dst() -> None:
    nights = WorkingHours(frozenset({1, 2, 3, 4, 5, 6, 7}), time(22), time(6))
    # 05:30 is inside the window opened the evening before: 30 min then, 30 from 22:00.
    assert sla_due_at(at(2026, 3, 5, 5, 30), 60, nights, "Europe/Berlin") == at(2026, 3, 5, 22, 30)
    # Across the spring-forward night (29 March 2026, 02:00 -> 03:00 in Berlin) the window
    # 22:00-06:00 holds 7 hours, not 8.
    due = sla_due_at(at(2026, 3, 28, 22, 0), 8 * 60, nights, "Europe/Berlin")
    assert due == at(2026, 3, 29, 22, 0) + timedelta(hours=1)


def test_without_hours_or_days_it_is_wall_clock() -> None:
    start = at(2026, 3, 7, 12, 0)
    assert sla_due_at(start, 90, None, "Europe/Berlin") == start + timedelta(minutes=90)
    none = WorkingHours(frozenset(), time(9), time(17))
    assert sla_due_at(start, 90, none, "Europe/Berlin") == start + timedelta(minutes=90)
    assert sla_due_at(start, 90, WEEKDAYS_9_TO_18, "Not/AZone") == start + timedelta(minutes=90)


def test_whole_day_hours_not_starting_at_midnight_are_the_whole_day() -> None:
    """09:00-09:00 is the whole day (as eligibility reads it), not 09:00 to midnight."""
    every_day = WorkingHours(frozenset(range(1, 8)), time(9), time(9))
    wednesday_3am = datetime(2026, 3, 4, 3, 0, tzinfo=UTC)
    assert wednesday_3am.isoweekday() == 3
    due = sla_due_at(wednesday_3am, 60, every_day, "UTC")
    assert due == datetime(2026, 3, 4, 4, 0, tzinfo=UTC)
    # Weekdays only: Friday 23:30 + 60 min runs to midnight, then on to Monday 00:30.
    weekdays = WorkingHours(frozenset({1, 2, 3, 4, 5}), time(9), time(9))
    friday = datetime(2026, 3, 6, 23, 30, tzinfo=UTC)
    assert sla_due_at(friday, 60, weekdays, "UTC") == datetime(2026, 3, 9, 0, 30, tzinfo=UTC)


@settings(max_examples=80, deadline=None)
@given(
    start_minute=st.integers(0, 14 * 24 * 60),
    minutes=st.integers(1, 600),
    days=st.frozensets(st.integers(1, 7), min_size=1),
    start_hour=st.integers(0, 23),
    length=st.integers(0, 23),  # 0: start == end, the whole day
)
def test_the_working_time_between_start_and_due_is_exactly_the_sla(
    start_minute: int, minutes: int, days: frozenset[int], start_hour: int, length: int
) -> None:
    hours = WorkingHours(days, time(start_hour), time((start_hour + length) % 24))
    start = datetime(2026, 1, 5, tzinfo=UTC) + timedelta(minutes=start_minute)
    due = sla_due_at(start, minutes, hours, "UTC")
    assert due >= start + timedelta(minutes=minutes)
    # Count working minutes by walking the timeline in UTC (no DST in UTC).
    from routing.engine.strategies import within_working_hours

    worked = 0
    moment = start
    while moment < due:
        if within_working_hours(hours, moment):
            worked += 1
        moment += timedelta(minutes=1)
    assert worked == minutes
