"""Planned absences and holiday calendars in the rules-as-code file: export -> import -> export
identical (absences are live state, never exported), a file's absences only added (wall-clock
times in the rep's zone, as the roster API takes them), --prune, and every invalid entry
refused with its path, nothing written."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.configuration import configuration_import
from routing.models import Rep, Team
from routing.rules_io import RulesFileErrors, absence_fields_check, rules_export, rules_plan
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
    assert all("absences" not in rep for rep in exported["reps"])  # live state: see below
    assert exported["holiday_calendars"] == with_time_off()["holiday_calendars"]
    call_command("routing_export", "--output", str(tmp_path / "a.yaml"))
    first = (tmp_path / "a.yaml").read_bytes()
    call_command("routing_import", str(tmp_path / "a.yaml"), "--publish", "--prune")
    call_command("routing_export", "--output", str(tmp_path / "b.yaml"))
    assert (tmp_path / "b.yaml").read_bytes() == first
    assert RepAbsence.objects.filter(rep=ana).count() == 2
    # Into a database without the time off: the same document comes out.
    RepAbsence.objects.all().delete()
    HolidayCalendar.objects.all().delete()
    configuration_import(data=exported)
    assert json.dumps(rules_export()) == json.dumps(exported)


def test_an_exported_file_imported_with_publish_and_prune_keeps_leave_planned_since(
    tmp_path: Path,
) -> None:
    """The bug: the export wrote each rep's absences (``absences: []`` for a rep without
    leave), and an import replaced the rep's absences with the file's, so export -> (leave
    planned through the roster API) -> import --publish --prune wiped that leave."""
    from routing.config_api.roster import rep_absence_add

    configuration_import(data=example(), publish=True)
    call_command("routing_export", "--output", str(tmp_path / "a.yaml"))
    first = (tmp_path / "a.yaml").read_bytes()
    assert b"absences" not in first
    ben = Rep.objects.get(email="ben@example.com")
    start = timezone.now() + timedelta(days=10)
    rep_absence_add(
        rep_id=ben.pk, start=start, end=start + timedelta(days=5), note="Holiday", actor="hr"
    )
    call_command("routing_import", str(tmp_path / "a.yaml"), "--publish", "--prune")
    assert list(RepAbsence.objects.filter(rep=ben).values_list("note", flat=True)) == ["Holiday"]
    call_command("routing_export", "--output", str(tmp_path / "b.yaml"))
    assert (tmp_path / "b.yaml").read_bytes() == first


def test_a_files_absences_are_only_added_never_replacing_or_removing_leave() -> None:
    """A file that still carries ``absences`` (an older export) wipes nothing: its absences
    are added, one stored already is left as it is, the past is left alone."""
    configuration_import(data=with_time_off())
    ana = Rep.objects.get(email="ana@example.com")
    now = timezone.now()
    past = RepAbsence.objects.create(
        rep=ana, starts_at=now - timedelta(days=9), ends_at=now - timedelta(days=2)
    )
    stored = set(RepAbsence.objects.filter(rep=ana).values_list("pk", "starts_at", "note"))
    data = with_time_off()
    data["reps"][0]["absences"] = data["reps"][0]["absences"][1:]
    data["reps"][0]["absences"][0]["note"] = "Winter"  # the same span: left as it is
    data["reps"][1]["absences"] = []  # an older export's rep without leave
    result = configuration_import(data=data)
    assert "absences" not in result.counts
    assert set(RepAbsence.objects.filter(rep=ana).values_list("pk", "starts_at", "note")) == (
        stored
    )
    assert RepAbsence.objects.filter(pk=past.pk).exists()
    # A new one is added beside them.
    data["reps"][0]["absences"] = [
        {"from": f"{NEXT}-08-03T00:00:00+02:00", "to": f"{NEXT}-08-10T00:00:00+02:00"}
    ]
    assert configuration_import(data=data).counts["absences"] == {
        "created": 1,
        "updated": 0,
        "deleted": 0,
    }
    assert RepAbsence.objects.filter(rep=ana).count() == 4
    # A file without the key leaves a rep's absences alone too.
    data["reps"][0].pop("absences")
    assert "absences" not in configuration_import(data=data).counts
    assert RepAbsence.objects.filter(rep=ana).count() == 4


def test_a_files_absence_overlapping_stored_leave_is_refused_by_path_nothing_written() -> None:
    configuration_import(data=with_time_off())
    data = with_time_off()
    data["reps"][0]["absences"] = [
        {"from": f"{NEXT}-08-03T00:00:00+02:00", "to": f"{NEXT}-08-10T00:00:00+02:00"},
        {"from": f"{NEXT}-04-01T00:00:00+02:00", "to": f"{NEXT}-04-20T00:00:00+02:00"},
    ]
    data["teams"][0]["sla_minutes"] = 5
    before = list(RepAbsence.objects.values_list("pk", "starts_at", "ends_at", "note"))
    with pytest.raises(RulesFileErrors) as caught:
        configuration_import(data=data)
    assert [str(e) for e in caught.value.errors] == [
        f"reps[0].absences[1]: overlaps the rep's planned absence {NEXT}-03-26T17:00:00Z to "
        f"{NEXT}-04-06T07:00:00Z: a file adds absences, never changes or removes them (change "
        "that one with the roster API or in the admin)"
    ]
    assert list(RepAbsence.objects.values_list("pk", "starts_at", "ends_at", "note")) == before
    assert Team.objects.get(name="EMEA SDR").sla_minutes == 60


def test_a_files_absences_are_wall_clock_times_in_the_reps_zone_as_the_roster_takes_them() -> None:
    """The file took absences only with a UTC offset; the roster API takes wall-clock times in
    the rep's zone. Now both: the entry's time zone, else the stored rep's."""
    data = example()
    data["reps"][0]["absences"] = [  # ana, Europe/Berlin (the entry's time zone)
        {"from": f"{NEXT}-01-15T18:00:00", "to": f"{NEXT}-07-10T09:00:00"},  # +01:00, +02:00
        {"from": f"{NEXT}-08-01T02:00:00+02:00", "to": f"{NEXT}-08-02T00:00:00Z"},  # offsets
    ]
    configuration_import(data=data)
    ana = Rep.objects.get(email="ana@example.com")
    assert list(RepAbsence.objects.filter(rep=ana).values_list("starts_at", "ends_at")) == [
        (datetime(NEXT, 1, 15, 17, tzinfo=UTC), datetime(NEXT, 7, 10, 7, tzinfo=UTC)),
        (datetime(NEXT, 8, 1, tzinfo=UTC), datetime(NEXT, 8, 2, tzinfo=UTC)),
    ]
    # bob's entry leaves out his time zone: the stored one (America/New_York) is used.
    again = example()
    again["reps"][2].pop("timezone")
    again["reps"][2]["absences"] = [{"from": f"{NEXT}-07-01T09:00", "to": f"{NEXT}-07-01T17:00"}]
    configuration_import(data=again)
    bob = Rep.objects.get(email="bob@example.com")
    assert list(RepAbsence.objects.filter(rep=bob).values_list("starts_at", "ends_at")) == [
        (datetime(NEXT, 7, 1, 13, tzinfo=UTC), datetime(NEXT, 7, 1, 21, tzinfo=UTC)),
    ]
    # A time the clocks skip is refused, naming the key, as the roster API refuses it.
    skipped = example()
    spring = max(date(NEXT, 3, day) for day in range(25, 32) if date(NEXT, 3, day).weekday() == 6)
    skipped["reps"][0]["absences"] = [{"from": f"{spring}T02:30", "to": f"{NEXT}-04-10"}]
    with pytest.raises(RulesFileErrors) as caught:
        rules_plan(skipped)
    assert [e.path for e in caught.value.errors] == ["reps[0].absences[0].from"]
    with pytest.raises(RulesFileErrors) as roster:
        absence_fields_check(skipped["reps"][0]["absences"][0], zone=ZoneInfo("Europe/Berlin"))
    assert caught.value.errors[0].message == roster.value.errors[0].message


@settings(max_examples=60, deadline=None)
@given(
    moment=st.datetimes(  # naive: Hypothesis's bounds are
        min_value=datetime(2000, 1, 1),  # noqa: DTZ001
        max_value=datetime(2100, 1, 1),  # noqa: DTZ001
    ),
    zone=st.sampled_from(["Europe/Berlin", "America/New_York", "Asia/Kolkata", "UTC"]),
    offset=st.sampled_from([None, "Z", "+05:30", "-08:00"]),
)
def test_the_files_absence_times_decode_as_the_roster_apis(
    moment: datetime, zone: str, offset: str | None
) -> None:
    """Property: any date-time, with or without an offset, decodes in a file's rep entry as the
    roster API decodes it for that rep's zone (the same value, or the same error)."""
    text = moment.isoformat() + (offset or "")
    entry = {"from": text, "to": "2100-06-01T00:00:00Z"}
    data = {
        "reps": [{"email": "p@example.com", "name": "P", "timezone": zone, "absences": [entry]}],
        "ruleset": {"name": "R", "rules": []},
    }
    try:
        plan = rules_plan(data)
    except RulesFileErrors as exc:
        file_errors = [(e.path.removeprefix("reps[0].absences[0]."), e.message) for e in exc.errors]
        file_spans = None
    else:
        file_errors, file_spans = [], plan.sections["reps"][0].refs["absences"]
    try:
        roster = ([], [absence_fields_check(entry, zone=ZoneInfo(zone))])
    except RulesFileErrors as exc:
        roster = ([(e.path, e.message) for e in exc.errors], None)
    assert (file_errors, file_spans) == roster


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
