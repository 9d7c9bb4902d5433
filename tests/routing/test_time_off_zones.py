"""Planned absences and holidays across DST changes and local midnights in several zones
(whole-hour, half-hour and 45-minute offsets, northern and southern DST): an absence entered in
the rep's own time as "from day D 00:00 to day D+2 00:00" covers exactly those local days,
however many hours that is in UTC; the rep is available the minute before and the minute it
ends, away from its first minute (``reps_available`` reads the database as routing does), the
beat job sees it start at the local midnight, and the trace names the local end. A holiday is
the whole local day, whatever the UTC date."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from routing.engine import Holiday, RepState, rep_is_eligible
from routing.models import Rep
from routing.timeoff.admin import RepAbsenceForm
from routing.timeoff.facts import time_off_facts
from routing.timeoff.models import RepAbsence
from routing.timeoff.services import absences_start_due, reps_available

pytestmark = pytest.mark.django_db

# (zone, the month of its DST change (None: no DST), the absence's length in hours: two local
# days around the change). The year is next year's, so the absence is always in the future.
CASES = [
    ("Europe/Berlin", 3, 47),  # clocks forward on the last Sunday of March
    ("Europe/Berlin", 10, 49),  # back on the last Sunday of October
    ("America/New_York", 3, 47),  # forward on the second Sunday of March
    ("America/New_York", 11, 49),  # back on the first Sunday of November
    ("Asia/Kolkata", None, 48),  # +05:30, no DST
    ("Asia/Kathmandu", None, 48),  # +05:45, no DST
    ("Pacific/Chatham", 4, 49),  # +13:45 -> +12:45 on the first Sunday of April (03:45 -> 02:45)
    ("Pacific/Chatham", 9, 47),  # +12:45 -> +13:45 on the last Sunday of September
]


def _first_day(zone: ZoneInfo, month: int | None) -> date:
    """The day of ``zone``'s DST change in ``month`` of next year (or 27 March)."""
    year = timezone.now().year + 1
    if month is None:
        return date(year, 3, 27)
    day = date(year, month, 1)
    while day.month == month:
        before = datetime(day.year, day.month, day.day, tzinfo=zone).utcoffset()
        after = datetime.combine(day + timedelta(days=1), datetime.min.time(), zone).utcoffset()
        if before != after:
            return day
        day += timedelta(days=1)
    raise AssertionError(f"no DST change in {zone.key} in month {month} of {year}")


@pytest.mark.parametrize(("zone_name", "month", "hours"), CASES)
def test_an_absence_covers_its_local_days_exactly(zone_name: str, month: int | None, hours: int):
    zone = ZoneInfo(zone_name)
    rep = Rep.objects.create(email="r@example.com", name="R", timezone=zone_name)
    start_day = _first_day(zone, month)
    end_day = start_day + timedelta(days=2)
    form = RepAbsenceForm(
        data={"starts_local": f"{start_day} 00:00", "ends_local": f"{end_day} 00:00", "note": ""},
        rep=rep,
        instance=RepAbsence(rep=rep),
    )
    assert form.is_valid(), form.errors
    absence = form.save()
    starts = datetime(start_day.year, start_day.month, start_day.day, tzinfo=zone)
    ends = datetime(end_day.year, end_day.month, end_day.day, tzinfo=zone)
    assert absence.starts_at == starts.astimezone(UTC)
    assert absence.ends_at == ends.astimezone(UTC)
    assert absence.ends_at - absence.starts_at == timedelta(hours=hours)

    minute = timedelta(minutes=1)
    for moment, available in (
        (absence.starts_at - minute, True),  # 23:59 the evening before, local
        (absence.starts_at, False),  # local midnight: on leave
        (absence.starts_at + timedelta(hours=hours // 2), False),
        (absence.ends_at - minute, False),  # 23:59 on the last day
        (absence.ends_at, True),  # back at the local midnight it ends
    ):
        assert (reps_available(rep_ids=[rep.pk], now=moment) == {rep.pk}) is available, (
            moment.astimezone(zone),
            available,
        )

    inside = absence.starts_at + timedelta(hours=1)
    off = time_off_facts(now=inside, team_members={})[rep.pk]
    state = RepState(
        id=rep.pk, email=rep.email, name="R", timezone=zone_name, absences=off.absences
    )
    eligible, why = rep_is_eligible(state, None, inside)
    assert not eligible
    local_end = ends.astimezone(zone)
    assert why == f"on leave until {local_end:%Y-%m-%d %H:%M} {local_end.tzname()} ({zone_name})"

    # The beat job sees it start at the local midnight, not at a UTC one.
    assert absences_start_due(now=absence.starts_at - minute) == 0
    assert absences_start_due(now=absence.starts_at) == 1


@pytest.mark.parametrize(
    "zone_name",
    ["Europe/Berlin", "America/New_York", "Asia/Kolkata", "Asia/Kathmandu", "Pacific/Chatham"],
)
def test_a_holiday_is_the_whole_local_day_whatever_the_utc_date(zone_name: str) -> None:
    zone = ZoneInfo(zone_name)
    day = date(2027, 3, 28)  # a DST change in Berlin; none elsewhere that day
    state = RepState(
        id=1, email="r@example.com", name="R", timezone=zone_name, holidays={day: Holiday("Off")}
    )
    first = datetime(2027, 3, 28, tzinfo=zone)
    after = datetime(2027, 3, 29, tzinfo=zone)
    minute = timedelta(minutes=1)
    assert rep_is_eligible(state, None, first - minute)[0]
    assert not rep_is_eligible(state, None, first)[0]
    assert not rep_is_eligible(state, None, after - minute)[0]
    assert rep_is_eligible(state, None, after)[0]
