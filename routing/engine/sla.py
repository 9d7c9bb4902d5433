"""SLA due times counted in a rep's working hours (pure; no Django).

A team that respects working hours counts its SLA minutes only while the owner works: 60
minutes given at 17:30 to a rep working 09:00-18:00 fall due at 09:30 the next working day.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from routing.engine.types import WorkingHours

# How far ahead working windows are looked for before falling back to wall-clock minutes (a
# year and a bit: SLAs are bounded at 525,600 minutes, a year of wall-clock time).
_MAX_DAYS = 800


def _windows(
    hours: WorkingHours, zone: ZoneInfo, first: date
) -> Iterator[tuple[datetime, datetime]]:
    """The working windows, as aware datetimes in order, from the day before ``first`` on."""
    day = first - timedelta(days=1)  # an overnight window opened the day before
    for _ in range(_MAX_DAYS):
        if day.isoweekday() in hours.days:
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


def sla_due_at(
    start: datetime, minutes: int, hours: WorkingHours | None, zone_name: str
) -> datetime:
    """When ``minutes`` of working time after ``start`` have passed (wall clock without hours).

    Falls back to wall-clock minutes when the rep has no working days or an unknown time zone.
    """
    wall = start + timedelta(minutes=minutes)
    if hours is None or not hours.days:
        return wall
    try:
        zone = ZoneInfo(zone_name)
    except (KeyError, ValueError):
        return wall
    remaining = timedelta(minutes=minutes)
    cursor = start.astimezone(UTC)
    for window_start, window_end in _windows(hours, zone, start.astimezone(zone).date()):
        begin = max(window_start, cursor)
        if window_end <= begin:
            continue
        available = window_end - begin
        if remaining <= available:
            return begin + remaining
        remaining -= available
        cursor = window_end
    return wall
