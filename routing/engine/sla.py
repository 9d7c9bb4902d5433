"""SLA due times counted in a rep's working hours (pure; no Django).

A team that respects working hours counts its SLA minutes only while the owner works: 60
minutes given at 17:30 to a rep working 09:00-18:00 fall due at 09:30 the next working day.
The rep's holidays (a window belongs to the local day it starts on) and planned absences are
not working time either: the clock stops through them, and a rep without working hours but
with time off counts every hour they are not away.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from routing.engine.availability import subtract_absences
from routing.engine.types import Absence, WorkingHours

_ALL_DAY = WorkingHours(days=frozenset(range(1, 8)), start=time(0), end=time(0))

# How far ahead working windows are looked for before falling back to wall-clock minutes (a
# year and a bit: SLAs are bounded at 525,600 minutes, a year of wall-clock time).
_MAX_DAYS = 800


def _windows(
    hours: WorkingHours, zone: ZoneInfo, first: date, holidays: Collection[date] = ()
) -> Iterator[tuple[datetime, datetime]]:
    """The working windows, as aware datetimes in order, from the day before ``first`` on."""
    day = first - timedelta(days=1)  # an overnight window opened the day before
    for _ in range(_MAX_DAYS):
        if day.isoweekday() in hours.days and day not in holidays:
            start = datetime.combine(day, hours.start, tzinfo=zone)
            if hours.start < hours.end:
                end = datetime.combine(day, hours.end, tzinfo=zone)
            elif hours.start == hours.end:  # the whole day, midnight to midnight, whatever time
                start = datetime.combine(day, time(0), tzinfo=zone)
                end = datetime.combine(day + timedelta(days=1), time(0), tzinfo=zone)
            else:  # overnight: ends the next day
                end = datetime.combine(day + timedelta(days=1), hours.end, tzinfo=zone)
            # In UTC: arithmetic on datetimes sharing a zone ignores DST changes between them.
            start_utc, end_utc = start.astimezone(UTC), end.astimezone(UTC)
            if end_utc > start_utc:
                yield start_utc, end_utc
        day += timedelta(days=1)


def _available(
    windows: Iterator[tuple[datetime, datetime]], absences: Sequence[Absence]
) -> Iterator[tuple[datetime, datetime]]:
    for window_start, window_end in windows:
        yield from subtract_absences(window_start, window_end, absences)


def sla_due_at(
    start: datetime,
    minutes: int,
    hours: WorkingHours | None,
    zone_name: str,
    *,
    holidays: Collection[date] = (),
    absences: Sequence[Absence] = (),
) -> datetime:
    """When ``minutes`` of working time after ``start`` have passed (wall clock without hours).

    Working time is inside the working hours (every hour when there are none), not on one of
    ``holidays`` (local dates) and not inside one of ``absences``. Falls back to wall-clock
    minutes when the rep has no working days, no hours and no time off, or an unknown zone.
    """
    wall = start + timedelta(minutes=minutes)
    if hours is None:
        if not holidays and not absences:
            return wall
        hours = _ALL_DAY
    if not hours.days:
        return wall
    try:
        zone = ZoneInfo(zone_name)
    except (KeyError, ValueError):
        return wall
    remaining = timedelta(minutes=minutes)
    cursor = start.astimezone(UTC)
    windows = _windows(hours, zone, start.astimezone(zone).date(), holidays)
    ordered = sorted(absences, key=lambda absence: absence.starts_at)
    for window_start, window_end in _available(windows, ordered):
        begin = max(window_start, cursor)
        if window_end <= begin:
            continue
        available = window_end - begin
        if remaining <= available:
            return begin + remaining
        remaining -= available
        cursor = window_end
    return wall
