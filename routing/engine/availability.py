"""Whether a rep is away at a moment: planned time off and holidays (pure; no Django).

A rep is away at ``t`` exactly when ``t`` falls inside one of their absences (start inclusive,
end exclusive) or when ``t``'s date *in the rep's time zone* is one of their holidays. The
reasons read as the decision trace shows them: "on leave until 2026-12-28 09:00 CET
(Europe/Berlin)", "public holiday: Christmas Day", "company holiday: Offsite" (a calendar's
custom day).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from routing.engine.types import Absence, Holiday, RepState


@functools.lru_cache(maxsize=512)
def zone_named(name: str) -> ZoneInfo | None:
    """The IANA zone called ``name``, or None when there is none."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def absence_end_at(absences: Iterable[Absence], moment: datetime) -> datetime | None:
    """When the leave that covers ``moment`` ends, or None when no absence covers it.

    Absences that meet or overlap are one leave: the end returned is that of the last of them,
    so "on leave until" names the day the rep is really back.
    """
    ordered = sorted(absences, key=lambda absence: absence.starts_at)
    end: datetime | None = None
    for absence in ordered:
        if end is None:
            if absence.covers(moment):
                end = absence.ends_at
        elif absence.starts_at <= end:
            end = max(end, absence.ends_at)
        else:
            break
    return end


def holiday_at(rep: RepState, moment: datetime) -> Holiday | None:
    """The rep's holiday on ``moment``'s local date, or None (unknown zone: UTC)."""
    if not rep.holidays:
        return None
    zone = zone_named(rep.timezone)
    local = moment.astimezone(zone if zone is not None else UTC)
    found = rep.holidays.get(local.date())
    if found is None or isinstance(found, Holiday):
        return found
    return Holiday(name=found)


class NonexistentLocalTime(ValueError):
    """A wall-clock time that a zone skips (the spring DST gap)."""


def wall_clock_at(wall: datetime, zone: ZoneInfo) -> datetime:
    """The moment (in UTC) a naive wall-clock time names in ``zone``.

    A time in the spring DST gap (e.g. 2026-03-29 02:30 in Europe/Berlin) names no moment:
    ``NonexistentLocalTime`` says so. A time the autumn change repeats is taken the first time
    it happens (before the clocks go back), always.
    """
    aware = wall.replace(tzinfo=zone, fold=0)
    back = aware.astimezone(UTC).astimezone(zone)
    if back.replace(tzinfo=None) != wall.replace(tzinfo=None, fold=0):
        raise NonexistentLocalTime(
            f"{wall:%Y-%m-%d %H:%M} does not exist in {zone.key}: the clocks jump forward over "
            f"it (the same moment reads {back:%H:%M %Z}). Enter a time that exists."
        )
    # In UTC: an aware time in a repeated hour never compares equal to another zone's (PEP 495).
    return aware.astimezone(UTC)


def _local_label(moment: datetime, zone_name: str) -> str:
    zone = zone_named(zone_name)
    if zone is None:
        return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
    local = moment.astimezone(zone)
    return f"{local:%Y-%m-%d %H:%M} {local.tzname()} ({zone_name})"


def rep_away_reason(rep: RepState, moment: datetime) -> str | None:
    """Why the rep is away at ``moment`` (leave, then holiday), or None when they are not."""
    end = absence_end_at(rep.absences, moment)
    if end is not None:
        return f"on leave until {_local_label(end, rep.timezone)}"
    holiday = holiday_at(rep, moment)
    if holiday is not None:
        return holiday.label
    return None


def subtract_absences(
    start: datetime, end: datetime, absences: Sequence[Absence]
) -> Iterator[tuple[datetime, datetime]]:
    """The parts of ``[start, end)`` no absence covers, in order."""
    cursor = start
    for absence in sorted(absences, key=lambda absence: absence.starts_at):
        if absence.ends_at <= cursor:
            continue
        if absence.starts_at >= end:
            break
        if absence.starts_at > cursor:
            yield cursor, absence.starts_at
        cursor = max(cursor, absence.ends_at)
        if cursor >= end:
            return
    if cursor < end:
        yield cursor, end
