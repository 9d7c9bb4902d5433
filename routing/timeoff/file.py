"""Time off in the rules-as-code file: reps' planned absences and the holiday calendars, written
(``absences_apply``, ``calendars_apply``) and exported (``calendars_export``; absences never are)
for ``routing.rules_io``, which validates them with the rest of the file.

- A rep's ``absences``, when given, are added to their planned leave, never replace it: an
  absence the file lists that is stored already (the same span) or over by now is left alone,
  one that overlaps a stored absence with another span refuses the import (by path), and no
  stored absence is ever changed or deleted by a file. Planned leave is live state, managed
  through the roster API and the admin; an import of an older export that still lists
  absences wipes nothing. Each rep whose absences change is locked first, as
  ``rep_absence_save`` does.
- A calendar is upserted by name; its ``reps``, ``teams`` and ``days``, when given, replace
  the calendar's.
- Export never lists absences (live state), and lists every calendar by name with its reps,
  teams and days sorted, so export -> import -> export is identical.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any

from django.utils import timezone

from routing.decisions import sla_clocks_refresh
from routing.timeoff.models import HolidayCalendar, HolidayCalendarDay, RepAbsence
from routing.timeoff.services import rep_lock_for_absences

Counts = dict[str, dict[str, int]]
Span = tuple[datetime, datetime, str]  # starts_at, ends_at (aware), note


def _tally(counts: Counts, section: str, key: str, number: int = 1) -> None:
    tally = counts.setdefault(section, {"created": 0, "updated": 0, "deleted": 0})
    tally[key] += number


def absences_apply(wanted: Mapping[int, Sequence[tuple[Span, str]]], counts: Counts) -> None:
    """Add each rep's absences the file lists (rep id -> [(absence, its path in the file)]).

    Additive: an absence already over is history and skipped, one stored with the same span is
    left as it is, and nothing stored is ever changed or deleted. One that overlaps a stored
    absence with another span refuses the import (RulesFileErrors, by path; the caller's
    transaction writes nothing then): leave planned or changed since through the roster API or
    the admin wins over an older file."""
    from routing.rules_io import RuleError, RulesFileErrors

    now = timezone.now()
    errors: list[RuleError] = []
    for rep_id in sorted(wanted):
        stored = list(RepAbsence.objects.filter(rep_id=rep_id, ends_at__gt=now))
        spans = {(a.starts_at, a.ends_at) for a in stored}
        new: list[Span] = []
        for (start, end, note), path in wanted[rep_id]:
            if end <= now or (start, end) in spans:
                continue
            clash = next((a for a in stored if a.starts_at < end and a.ends_at > start), None)
            if clash is not None:
                errors.append(
                    RuleError(
                        path,
                        f"overlaps the rep's planned absence {_utc(clash.starts_at)} to "
                        f"{_utc(clash.ends_at)}: a file adds absences, never changes or removes "
                        "them (change that one with the roster API or in the admin)",
                    )
                )
                continue
            new.append((start, end, note))
        if errors or not new:
            continue
        rep_lock_for_absences(rep_id=rep_id)
        RepAbsence.objects.bulk_create(
            RepAbsence(rep_id=rep_id, starts_at=start, ends_at=end, note=note)
            for start, end, note in sorted(new)
        )
        sla_clocks_refresh(rep_ids=[rep_id], now=now)
        _tally(counts, "absences", "created", len(new))
    if errors:
        raise RulesFileErrors(errors)


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


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
