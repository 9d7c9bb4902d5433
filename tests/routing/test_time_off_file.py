"""Planned absences and holiday calendars in the rules-as-code file: export -> import -> export
identical (across a DST change), an import's absences replacing the rep's not yet over, --prune,
and every invalid entry refused with its path, nothing written."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from routing.configuration import configuration_import
from routing.models import Rep
from routing.rules_io import RulesFileErrors, rules_export
from routing.timeoff.models import HolidayCalendar, RepAbsence
from tests.routing.test_rules_io import example, row_counts

pytestmark = pytest.mark.django_db

NEXT = timezone.now().year + 1


def with_time_off(**changes: Any) -> dict[str, Any]:
    data = example()
    data["reps"][0]["absences"] = [  # ana, Europe/Berlin: over the spring DST change
        {"from": f"{NEXT}-03-26T18:00:00+01:00", "to": f"{NEXT}-04-06T09:00:00+02:00", "note": ""},
        {
            "from": f"{NEXT}-12-21T00:00:00+01:00",
            "to": f"{NEXT + 1}-01-04T00:00:00+01:00",
            "note": "Winter break",
        },
    ]
    data["holiday_calendars"] = [
        {
            "name": "Bavaria",
            "country": "DE",
            "subdivision": "BY",
            "reps": ["ana@example.com"],
            "teams": ["EMEA SDR"],
            "days": [{"date": f"{NEXT}-03-03", "name": "Offsite"}],
        },
        {"name": "Company", "country": "", "subdivision": "", "reps": [], "teams": [], "days": []},
    ]
    data.update(changes)
    return data


def test_time_off_export_import_export_is_identical(tmp_path: Path) -> None:
    configuration_import(data=with_time_off(), publish=True)
    ana = Rep.objects.get(email="ana@example.com")
    spans = list(RepAbsence.objects.filter(rep=ana).values_list("starts_at", "ends_at", "note"))
    assert spans[0] == (
        datetime(NEXT, 3, 26, 17, tzinfo=UTC),
        datetime(NEXT, 4, 6, 7, tzinfo=UTC),
        "",
    )
    bavaria = HolidayCalendar.objects.get(name="Bavaria")
    assert list(bavaria.reps.values_list("email", flat=True)) == ["ana@example.com"]
    assert list(bavaria.teams.values_list("name", flat=True)) == ["EMEA SDR"]
    assert list(bavaria.days.values_list("date", "name")) == [(date(NEXT, 3, 3), "Offsite")]

    exported = rules_export()
    assert exported["reps"][0]["absences"] == with_time_off()["reps"][0]["absences"]
    assert exported["reps"][1]["absences"] == []
    assert exported["holiday_calendars"] == with_time_off()["holiday_calendars"]
    call_command("routing_export", "--output", str(tmp_path / "a.yaml"))
    first = (tmp_path / "a.yaml").read_bytes()
    call_command("routing_import", str(tmp_path / "a.yaml"), "--prune")
    call_command("routing_export", "--output", str(tmp_path / "b.yaml"))
    assert (tmp_path / "b.yaml").read_bytes() == first
    # Into a database without the time off: the same document comes out.
    RepAbsence.objects.all().delete()
    HolidayCalendar.objects.all().delete()
    configuration_import(data=exported)
    assert json.dumps(rules_export()) == json.dumps(exported)


def test_a_files_absences_replace_the_reps_not_yet_over_and_leave_the_past() -> None:
    configuration_import(data=with_time_off())
    ana = Rep.objects.get(email="ana@example.com")
    now = timezone.now()
    past = RepAbsence.objects.create(
        rep=ana, starts_at=now - timedelta(days=9), ends_at=now - timedelta(days=2)
    )
    data = with_time_off()
    data["reps"][0]["absences"] = data["reps"][0]["absences"][1:]
    data["reps"][0]["absences"][0]["note"] = "Winter"
    result = configuration_import(data=data)
    assert result.counts["absences"] == {"created": 0, "updated": 1, "deleted": 1}
    notes = list(RepAbsence.objects.filter(rep=ana).order_by("starts_at").values_list("pk", "note"))
    assert notes[0] == (past.pk, "")
    assert [note for _pk, note in notes[1:]] == ["Winter"]
    # A file without the key leaves a rep's absences alone; the same file again changes nothing.
    data["reps"][0].pop("absences")
    assert "absences" not in configuration_import(data=data).counts
    assert RepAbsence.objects.filter(rep=ana).count() == 2


def test_prune_deletes_the_calendars_the_file_no_longer_names() -> None:
    configuration_import(data=with_time_off())
    data = with_time_off()
    data["holiday_calendars"] = data["holiday_calendars"][:1]
    configuration_import(data=data, prune=True)
    assert list(HolidayCalendar.objects.values_list("name", flat=True)) == ["Bavaria"]


def test_invalid_time_off_is_refused_with_paths_and_nothing_written() -> None:
    data = with_time_off()
    data["reps"][0]["absences"] = [
        {"from": "2027-13-01", "to": f"{NEXT}-01-02T00:00:00Z"},
        {"from": f"{NEXT}-05-02T00:00:00Z", "to": f"{NEXT}-05-01T00:00:00Z"},
        {"from": f"{NEXT}-06-01T00:00:00Z", "to": f"{NEXT}-06-10T00:00:00Z"},
        {"from": f"{NEXT}-06-05T00:00:00Z", "to": f"{NEXT}-06-12T00:00:00Z", "why": "x"},
        {"to": f"{NEXT}-07-01T00:00:00Z"},
    ]
    data["reps"][1]["absences"] = "soon"
    data["holiday_calendars"] = [
        {"name": "X", "country": "XX"},
        {"name": "Y", "subdivision": "BY"},
        {"name": "Z", "country": "DE", "subdivision": "ZZ"},
        {
            "name": "W",
            "reps": ["nobody@example.com"],
            "teams": ["Nobody"],
            "days": [
                {"date": "03/03/2027", "name": "Offsite"},
                {"date": f"{NEXT}-03-03", "name": ""},
                {"date": f"{NEXT}-04-01", "name": "A"},
                {"date": f"{NEXT}-04-01", "name": "B"},
            ],
        },
        {"name": "V"},
        {"name": "V"},
    ]
    before = row_counts()
    absences, calendars = RepAbsence.objects.count(), HolidayCalendar.objects.count()
    with pytest.raises(RulesFileErrors) as caught:
        configuration_import(data=data)
    errors = [str(e) for e in caught.value.errors]
    expected = [
        "reps[0].absences[0].from: must be an ISO 8601 date-time with a UTC offset",
        "reps[0].absences[1].to: must be after from (the end is exclusive)",
        "reps[0].absences[3]: overlaps reps[0].absences[2]: make one absence that covers both",
        'reps[0].absences[3].why: unknown key "why"',
        "reps[0].absences[4].from: is required",
        "reps[1].absences: must be a list of {from, to, note}",
        'holiday_calendars[0].country: "XX" is no country the holidays package knows',
        "holiday_calendars[1].subdivision: a subdivision needs a country",
        'holiday_calendars[2].subdivision: DE has no subdivision "ZZ"',
        'holiday_calendars[3].reps[0]: unknown rep "nobody@example.com"',
        'holiday_calendars[3].teams[0]: unknown team "Nobody"',
        "holiday_calendars[3].days[0].date: must be a date YYYY-MM-DD",
        "holiday_calendars[3].days[1].name: must be non-empty text",
        f"holiday_calendars[3].days[3].date: {NEXT}-04-01 is already a day of it",
        'holiday_calendars[5]: duplicate "V" (also holiday_calendars[4])',
    ]
    for start in expected:
        assert any(error.startswith(start) for error in errors), (start, errors)
    assert row_counts() == before
    assert (RepAbsence.objects.count(), HolidayCalendar.objects.count()) == (absences, calendars)
