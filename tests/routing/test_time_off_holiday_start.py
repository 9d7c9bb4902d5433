"""A holiday beginning makes a rep unavailable like a planned absence starting: the beat job that
handles absences re-routes the rep's untouched leads (or keeps them, per team), audited, once per
rep and day, retried after a failure (docs/revops.md, "When a rep becomes unavailable")."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from audit.models import Event, EventType
from routing.decisions import clear_live_config_cache
from routing.models import Assignment, Rep, Team
from routing.rules_io import rules_import
from routing.timeoff import services as timeoff_services
from routing.timeoff.models import HolidayCalendar, HolidayCalendarDay, RepHolidayStart
from routing.timeoff.services import holidays_start_due
from routing.timeoff.tasks import absences_start
from tests.routing.test_lead_actions import _assigned
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

BERLIN = ZoneInfo("Europe/Berlin")  # Ana's and Ben's zone in RULES


@pytest.fixture
def rules() -> Any:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield
    clear_live_config_cache()


def _anas_lead() -> Assignment:
    leads = [_assigned(f"p{i}@acme.com") for i in range(2)]  # ana, ben
    current = Assignment.objects.get(lead=leads[0], active=True)
    assert current.rep.email == "ana@example.com"
    return current


def _company_day(rep: Rep, day: Any, name: str = "Offsite") -> None:
    calendar = HolidayCalendar.objects.create(name="Company")
    calendar.reps.add(rep)
    HolidayCalendarDay.objects.create(calendar=calendar, date=day, name=name)


def _midnight(day: Any) -> datetime:
    return datetime.combine(day, datetime.min.time(), tzinfo=BERLIN)


def test_a_holiday_beginning_reroutes_the_reps_untouched_leads_once_and_audits(rules):
    current = _anas_lead()
    ana = current.rep
    # Today in Berlin (the re-route decides with the real clock, as the beat does).
    begun = timezone.now()
    day = begun.astimezone(BERLIN).date()
    _company_day(ana, day)

    assert holidays_start_due(now=_midnight(day) - timedelta(minutes=1)) == 0  # not yet
    assert Assignment.objects.get(pk=current.pk).active

    assert holidays_start_due(now=begun) == 1
    assert holidays_start_due(now=begun + timedelta(hours=3)) == 0  # each rep and day once
    moved = Assignment.objects.get(lead_id=current.lead_id, active=True)
    assert moved.rep.email == "ben@example.com"
    start = RepHolidayStart.objects.get()
    assert (start.rep_id, start.date, start.name) == (ana.pk, day, "company holiday: Offsite")
    event = Event.objects.get(type=EventType.CONFIG_CHANGED, data__action="reroute_away")
    assert "company holiday: Offsite" in event.data["reason"]
    assert Event.objects.filter(type=EventType.REASSIGNED, lead_id=current.lead_id).exists()


def test_a_team_that_keeps_leads_keeps_them_through_a_holiday(rules):
    current = _anas_lead()
    Team.objects.filter(pk=current.team_id).update(keep_leads_when_rep_away=True)
    clear_live_config_cache()
    day = (timezone.now() + timedelta(days=2)).astimezone(BERLIN).date()
    _company_day(current.rep, day)
    assert holidays_start_due(now=_midnight(day) + timedelta(minutes=1)) == 1
    assert Assignment.objects.get(lead_id=current.lead_id, active=True).pk == current.pk


def test_the_absence_beat_handles_holidays_and_a_failure_is_retried(rules, monkeypatch):
    current = _anas_lead()
    today = timezone.now().astimezone(BERLIN).date()
    _company_day(current.rep, today)
    real = timeoff_services.reps_away_reroute
    calls: list[str] = []

    def flaky(**kwargs: Any) -> Any:
        calls.append(kwargs["reason"])
        if len(calls) == 1:
            raise ConnectionError("broker down")
        return real(**kwargs)

    monkeypatch.setattr(timeoff_services, "reps_away_reroute", flaky)
    absences_start()  # the beat task: fails for Ana, nothing marked
    assert not RepHolidayStart.objects.exists()
    assert Assignment.objects.get(pk=current.pk).active
    absences_start()  # the next run
    assert RepHolidayStart.objects.get().rep_id == current.rep_id
    assert Assignment.objects.get(lead_id=current.lead_id, active=True).rep.email == (
        "ben@example.com"
    )


def test_a_public_holiday_of_a_teams_calendar_and_inactive_reps(rules):
    current = _anas_lead()
    ben = Rep.objects.get(email="ben@example.com")
    Rep.objects.filter(pk=ben.pk).update(active=False)
    calendar = HolidayCalendar.objects.create(name="Germany", country="DE")
    calendar.teams.add(Team.objects.get(pk=current.team_id))
    christmas = _midnight(date(timezone.now().year, 12, 25)) + timedelta(hours=8)
    # Ana (active) is handled; Ben (inactive) is skipped; her lead stays, nobody else is free.
    assert holidays_start_due(now=christmas) == 1
    assert RepHolidayStart.objects.get().name == "public holiday: Christmas Day"
