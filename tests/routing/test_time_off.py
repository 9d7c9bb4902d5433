"""Time off on the database: absence validation, holiday calendars by country, and re-routing
an unavailable rep's untouched leads from the rep's form, an absence starting and the job."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError
from django.db import OperationalError
from django.utils import timezone

from routing import services as routing_services
from routing.admin_jobs import admin_job_run
from routing.decisions import clear_live_config_cache
from routing.engine import Holiday, RepState, rep_is_eligible
from routing.models import AdminJob, AdminJobStatus, Assignment, Rep, Team
from routing.rules_io import rules_import
from routing.timeoff.admin import RepAbsenceForm
from routing.timeoff.facts import calendar_days, time_off_facts
from routing.timeoff.models import HolidayCalendar, RepAbsence
from routing.timeoff.services import absences_start_due, reps_available, reps_away_reroute
from tests.routing.test_lead_actions import _assigned
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db


@pytest.fixture
def rules():
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield
    clear_live_config_cache()


def test_an_absence_must_end_after_it_starts_and_not_overlap():
    rep = Rep.objects.create(email="a@example.com", name="A", timezone="Europe/Berlin")
    now = timezone.now()
    with pytest.raises(ValidationError, match="end after"):
        RepAbsence(
            rep=rep, starts_at=now + timedelta(days=2), ends_at=now + timedelta(days=1)
        ).clean()
    with pytest.raises(ValidationError, match="already over"):
        RepAbsence(
            rep=rep, starts_at=now - timedelta(days=2), ends_at=now - timedelta(days=1)
        ).clean()
    RepAbsence.objects.create(
        rep=rep, starts_at=now + timedelta(days=1), ends_at=now + timedelta(days=5)
    )
    with pytest.raises(ValidationError, match="overlaps"):
        RepAbsence(
            rep=rep, starts_at=now + timedelta(days=4), ends_at=now + timedelta(days=8)
        ).clean()
    RepAbsence(rep=rep, starts_at=now + timedelta(days=5), ends_at=now + timedelta(days=8)).clean()


def test_holiday_calendars_by_country_and_subdivision():
    bavaria = calendar_days("DE", "BY", [], [2026])
    assert bavaria[date(2026, 1, 6)] == Holiday("Epiphany")  # Bavaria, not Berlin
    assert date(2026, 1, 6) not in calendar_days("DE", "BE", [], [2026])
    assert calendar_days("US", "", [], [2026])[date(2026, 7, 4)] == Holiday("Independence Day")
    assert Holiday("Republic Day") in calendar_days("IN", "", [], [2026]).values()
    custom = calendar_days("AU", "NSW", [(date(2026, 3, 2), "Offsite")], [2026])
    assert custom[date(2026, 3, 2)] == Holiday("Offsite", custom=True)
    with pytest.raises(ValidationError, match="subdivision"):
        HolidayCalendar(name="x", country="DE", subdivision="ZZ").clean()
    with pytest.raises(ValidationError, match="country"):
        HolidayCalendar(name="y", country="XX").clean()


def test_a_teams_calendar_is_its_members_holidays():
    ana = Rep.objects.create(email="ana@example.com", name="Ana", timezone="Europe/Berlin")
    team = Team.objects.create(name="DACH")
    calendar = HolidayCalendar.objects.create(name="Germany", country="DE")
    calendar.teams.add(team)
    now = timezone.now()
    facts = time_off_facts(now=now, team_members={team.id: [ana.id]})
    assert facts[ana.id].holidays[date(now.year, 12, 25)] == Holiday("Christmas Day")


def test_an_absence_starting_reroutes_the_reps_untouched_leads(rules):
    leads = [_assigned(f"p{i}@acme.com") for i in range(2)]  # ana, ben
    ana = Rep.objects.get(email="ana@example.com")
    later = timezone.now()
    now = later - timedelta(minutes=2)
    absence = RepAbsence.objects.create(
        rep=ana, starts_at=now + timedelta(minutes=1), ends_at=now + timedelta(days=3)
    )
    assert absences_start_due(now=now) == 0  # not yet
    assert reps_available(rep_ids=[ana.pk], now=now) == {ana.pk}
    assert reps_available(rep_ids=[ana.pk], now=later) == set()
    assert absences_start_due(now=later) == 1
    assert absences_start_due(now=later) == 0  # each absence once
    moved = Assignment.objects.get(lead=leads[0], active=True)
    assert moved.rep.email == "ben@example.com"
    absence.refresh_from_db()
    assert absence.started_handled_at == later


def test_a_team_that_keeps_leads_keeps_them(rules):
    lead = _assigned("p0@acme.com")
    current = Assignment.objects.get(lead=lead, active=True)
    Team.objects.filter(pk=current.team_id).update(keep_leads_when_rep_away=True)
    Rep.objects.filter(pk=current.rep_id).update(active=False)
    clear_live_config_cache()
    report = reps_away_reroute(rep_ids=[current.rep_id], actor="system", reason="away")
    assert (report.moved, report.kept, report.job) == (0, 0, None)
    assert Assignment.objects.get(lead=lead, active=True).rep_id == current.rep_id


def test_many_leads_become_a_job_with_progress(rules, settings, django_capture_on_commit_callbacks):
    settings.REROUTE_INLINE_MAX_LEADS = 1
    leads = [_assigned(f"p{i}@acme.com") for i in range(6)]
    ana = Rep.objects.get(email="ana@example.com")
    Rep.objects.filter(pk=ana.pk).update(active=False)
    with django_capture_on_commit_callbacks(execute=False):
        report = reps_away_reroute(rep_ids=[ana.pk], actor="user:rita", reason="Ana deactivated")
    assert report.job is not None
    assert report.job.progress_total == 3
    admin_job_run(job_id=report.job.pk)
    job = AdminJob.objects.get(pk=report.job.pk)
    assert job.status == AdminJobStatus.DONE
    assert job.result == {"moved": 3, "kept": 0}
    assert not Assignment.objects.filter(lead__in=leads, active=True, rep=ana).exists()


def test_the_reps_own_form_reroutes_when_it_deactivates(rules, admin_client):
    leads = [_assigned(f"p{i}@acme.com") for i in range(2)]
    ana = Rep.objects.get(email="ana@example.com")
    url = f"/admin/routing/rep/{ana.pk}/change/"
    page = admin_client.get(url)
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k not in ("user",)}
    data.update(
        {
            "active": "",
            "absences-TOTAL_FORMS": "0",
            "absences-INITIAL_FORMS": "0",
            "absences-MIN_NUM_FORMS": "0",
            "absences-MAX_NUM_FORMS": "1000",
            "working_hours": "",
        }
    )
    response = admin_client.post(url, data, follow=True)
    assert response.status_code == 200, response.content[:2000]
    assert "routed to someone else" in response.content.decode()
    assert Assignment.objects.get(lead=leads[0], active=True).rep.email == "ben@example.com"


def test_a_custom_day_is_called_a_company_holiday_not_a_public_one():
    ana = Rep.objects.create(email="ana@example.com", name="Ana", timezone="Europe/Berlin")
    calendar = HolidayCalendar.objects.create(name="Germany", country="DE")
    calendar.reps.add(ana)
    now = timezone.now()
    offsite = date(now.year + 1, 3, 3)
    calendar.days.create(date=offsite, name="Offsite")
    facts = time_off_facts(now=now, team_members={})[ana.id]
    state = RepState(
        id=ana.id, email=ana.email, name=ana.name, timezone=ana.timezone, holidays=facts.holidays
    )
    noon = datetime.combine(offsite, time(12), tzinfo=ZoneInfo("Europe/Berlin"))
    assert rep_is_eligible(state, None, noon) == (False, "company holiday: Offsite")
    christmas = datetime.combine(date(now.year + 1, 12, 25), time(12), tzinfo=UTC)
    assert rep_is_eligible(state, None, christmas) == (False, "public holiday: Christmas Day")


def test_an_absence_whose_reroute_fails_is_retried_by_the_next_run(rules, monkeypatch):
    lead = _assigned("p0@acme.com")  # ana's
    ana = Rep.objects.get(email="ana@example.com")
    now = timezone.now()
    absence = RepAbsence.objects.create(
        rep=ana, starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(days=3)
    )
    real = routing_services.rep_reroute_open_leads
    calls = []

    def fails_once(**kwargs):
        calls.append(kwargs["rep_id"])
        if len(calls) == 1:
            raise OperationalError("lock timeout")  # a transient database error, once
        return real(**kwargs)

    monkeypatch.setattr(routing_services, "rep_reroute_open_leads", fails_once)
    assert absences_start_due(now=now) == 0
    absence.refresh_from_db()
    assert absence.started_handled_at is None  # not handled: the next run tries again
    assert Assignment.objects.get(lead=lead, active=True).rep_id == ana.pk
    assert absences_start_due(now=now) == 1
    assert Assignment.objects.get(lead=lead, active=True).rep.email == "ben@example.com"
    absence.refresh_from_db()
    assert absence.started_handled_at == now
    assert absences_start_due(now=now) == 0
    assert calls == [ana.pk, ana.pk]


def test_a_wall_clock_time_in_a_dst_gap_is_refused_with_a_clear_message():
    ana = Rep.objects.create(email="ana@example.com", name="Ana", timezone="Europe/Berlin")
    # 28 March 2027: Berlin's clocks jump from 02:00 to 03:00; 02:30 never happens.
    form = RepAbsenceForm(
        data={"starts_local": "2027-03-28 02:30", "ends_local": "2027-03-30 09:00", "note": ""},
        rep=ana,
        instance=RepAbsence(rep=ana),
    )
    assert not form.is_valid()
    assert form.errors["starts_local"] == [
        "2027-03-28 02:30 does not exist in Europe/Berlin: the clocks jump forward over it "
        "(the same moment reads 03:30 CEST). Enter a time that exists."
    ]
    # The autumn hour that happens twice is taken the first time (summer time), deterministically.
    form = RepAbsenceForm(
        data={"starts_local": "2027-10-31 02:30", "ends_local": "2027-11-02 09:00", "note": ""},
        rep=ana,
        instance=RepAbsence(rep=ana),
    )
    assert form.is_valid(), form.errors
    assert form.instance.starts_at.astimezone(UTC) == datetime(2027, 10, 31, 0, 30, tzinfo=UTC)


def test_a_calendar_the_holidays_package_no_longer_knows_does_not_stop_routing(rules, caplog):
    """A calendar saved when its subdivision was valid, then refused by the ``holidays`` package
    (an upgrade that renamed or dropped it raises NotImplementedError): routing goes on with the
    calendar's custom days only, and the error is logged, never raised into every decision."""
    ana = Rep.objects.get(email="ana@example.com")
    calendar = HolidayCalendar.objects.create(name="Gone", country="DE", subdivision="ZZ")
    calendar.reps.add(ana)
    now = timezone.now()
    offsite = date(now.year + 1, 3, 3)
    calendar.days.create(date=offsite, name="Offsite")
    facts = time_off_facts(now=now, team_members={})[ana.id]
    assert facts.holidays == {offsite: Holiday("Offsite", custom=True)}
    assert "holiday calendar" in caplog.text
    assert "ZZ" in caplog.text
    clear_live_config_cache()
    lead = _assigned("p9@acme.com")
    assert Assignment.objects.filter(lead=lead, active=True).exists()
