"""Time off in the rules-as-code file: reps' planned absences and the holiday calendars, written
(``absences_apply``, ``calendars_apply``) and exported (``absences_export``, ``calendars_export``)
for ``routing.rules_io``, which validates them with the rest of the file.

- A rep's ``absences``, when given, are the whole of their time off not yet over: the stored
  ones not yet over that the file does not list are deleted, the file's new ones created (an
  absence the file lists that is over by now is history and left alone). Each rep whose
  absences change is locked first, as ``rep_absence_save`` does.
- A calendar is upserted by name; its ``reps``, ``teams`` and ``days``, when given, replace
  the calendar's.
- Export lists each rep's absences not yet over, in the rep's time zone with its UTC offset,
  and every calendar by name with its reps, teams and days sorted, so export -> import ->
  export is identical.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any

from django.utils import timezone

from routing.decisions import sla_clocks_refresh
from routing.engine.availability import zone_named
from routing.timeoff.models import HolidayCalendar, HolidayCalendarDay, RepAbsence
from routing.timeoff.services import rep_lock_for_absences

Counts = dict[str, dict[str, int]]
Span = tuple[datetime, datetime, str]  # starts_at, ends_at (aware), note


def _tally(counts: Counts, section: str, key: str, number: int = 1) -> None:
    tally = counts.setdefault(section, {"created": 0, "updated": 0, "deleted": 0})
    tally[key] += number


def absences_apply(wanted: Mapping[int, Sequence[Span]], counts: Counts) -> None:
    """Make each rep's absences not yet over the file's (rep id -> its absences)."""
    now = timezone.now()
    for rep_id in sorted(wanted):
        spans = {(start, end): note for start, end, note in wanted[rep_id] if end > now}
        stored = {
            (absence.starts_at, absence.ends_at): absence
            for absence in RepAbsence.objects.filter(rep_id=rep_id, ends_at__gt=now)
        }
        gone = [absence.pk for key, absence in stored.items() if key not in spans]
        new = [key for key in spans if key not in stored]
        renamed = [
            absence
            for key, absence in stored.items()
            if key in spans and absence.note != spans[key]
        ]
        if not (gone or new or renamed):
            continue
        rep_lock_for_absences(rep_id=rep_id)
        RepAbsence.objects.filter(pk__in=gone).delete()
        for absence in renamed:
            absence.note = spans[(absence.starts_at, absence.ends_at)]
            absence.save(update_fields=["note"])
        RepAbsence.objects.bulk_create(
            RepAbsence(rep_id=rep_id, starts_at=start, ends_at=end, note=spans[(start, end)])
            for start, end in sorted(new)
        )
        if gone or new:
            sla_clocks_refresh(rep_ids=[rep_id], now=now)
        _tally(counts, "absences", "deleted", len(gone))
        _tally(counts, "absences", "updated", len(renamed))
        _tally(counts, "absences", "created", len(new))


def calendars_apply(
    entries: Iterable[tuple[str, dict[str, Any], dict[str, Any]]],
    rep_ids: Mapping[str, int],
    team_ids: Mapping[str, int],
    counts: Counts,
) -> None:
    """Upsert calendars (name, fields, refs: reps e-mails, teams names, days) by name."""
    for name, fields, refs in entries:
        calendar = HolidayCalendar.objects.filter(name=name).first()
        if calendar is None:
            calendar = HolidayCalendar.objects.create(name=name, **fields)
            _tally(counts, "holiday_calendars", "created")
            changed = False
        else:
            changed = any(getattr(calendar, key) != value for key, value in fields.items())
            if changed:
                for key, value in fields.items():
                    setattr(calendar, key, value)
                calendar.save()
        if "reps" in refs:
            wanted = {rep_ids[email.lower()] for email in refs["reps"]}
            if set(calendar.reps.values_list("id", flat=True)) != wanted:
                calendar.reps.set(wanted)
                changed = True
        if "teams" in refs:
            wanted = {team_ids[team] for team in refs["teams"]}
            if set(calendar.teams.values_list("id", flat=True)) != wanted:
                calendar.teams.set(wanted)
                changed = True
        if "days" in refs:
            days = dict(refs["days"])
            if dict(calendar.days.values_list("date", "name")) != days:
                calendar.days.all().delete()
                HolidayCalendarDay.objects.bulk_create(
                    HolidayCalendarDay(calendar=calendar, date=day, name=days[day])
                    for day in sorted(days)
                )
                changed = True
        if changed:
            _tally(counts, "holiday_calendars", "updated")


def calendars_prune(names: Iterable[str], counts: Counts) -> None:
    """Delete the calendars the file no longer names (no lead or rule needs one)."""
    gone = HolidayCalendar.objects.exclude(name__in=list(names))
    number = gone.count()
    if number:
        gone.delete()
        _tally(counts, "holiday_calendars", "deleted", number)


def _local_iso(moment: datetime, zone_name: str) -> str:
    zone = zone_named(zone_name)
    local = moment.astimezone(zone if zone is not None else UTC)
    return local.isoformat().replace("+00:00", "Z")


def absences_export(reps: Iterable[Any]) -> dict[int, list[dict[str, Any]]]:
    """Each rep's absences not yet over, as the file has them (rep id -> list)."""
    zones = {rep.id: rep.timezone or "UTC" for rep in reps}
    found: dict[int, list[dict[str, Any]]] = {rep_id: [] for rep_id in zones}
    for absence in RepAbsence.objects.filter(
        rep_id__in=list(zones), ends_at__gt=timezone.now()
    ).order_by("rep_id", "starts_at", "id"):
        zone = zones[absence.rep_id]
        found[absence.rep_id].append(
            {
                "from": _local_iso(absence.starts_at, zone),
                "to": _local_iso(absence.ends_at, zone),
                "note": absence.note,
            }
        )
    return found


def calendars_export(emails: Mapping[int, str], team_names: Mapping[int, str]) -> list[Any]:
    """Every holiday calendar as the file has it, by name."""
    calendars = HolidayCalendar.objects.prefetch_related("reps", "teams", "days").order_by("name")
    return [
        {
            "name": calendar.name,
            "country": calendar.country,
            "subdivision": calendar.subdivision,
            "reps": sorted((emails[rep.id] for rep in calendar.reps.all()), key=str.lower),
            "teams": sorted(team_names[team.id] for team in calendar.teams.all()),
            "days": [
                {"date": day.date.isoformat(), "name": day.name}
                for day in sorted(calendar.days.all(), key=lambda day: day.date)
            ],
        }
        for calendar in calendars
    ]


def parse_day(value: Any) -> date | None:
    """An ISO ``YYYY-MM-DD`` date, or None."""
    if not isinstance(value, str):
        return None
    try:
        return date.fromisoformat(value.strip())
    except ValueError:
        return None
