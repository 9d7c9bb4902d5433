"""SLA clocks and time off planned *after* the lead was assigned (docs/revops.md, "SLA clocks").

In a team that respects working hours, the clock counts only time the owner can work; leave or
a holiday that begins while it runs pauses it as one known at the assignment would have. Leave
planned later moves the due time at once (every path that writes absences); a holiday calendar
changed later is caught by the SLA check, which works the due time out again before it calls a
breach. A team that counts wall-clock minutes is not paused: its away rep's leads are re-routed.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from leads.models import Lead
from routing.decisions import clear_live_config_cache
from routing.models import Assignment, Rep, Team
from routing.monitoring.sla import sla_check
from routing.rules_io import rules_import
from routing.timeoff.models import HolidayCalendar, HolidayCalendarDay, RepAbsence
from routing.timeoff.services import rep_absence_cancel, rep_absence_save
from tests.routing.test_lead_actions import _assigned
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture
def rules() -> Any:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield
    clear_live_config_cache()


def _running_clock(
    *, assigned_at: datetime, minutes: int = 60, respect_hours: bool = True
) -> tuple[Lead, Assignment]:
    """Ana's lead, its clock started at ``assigned_at`` (no time off known then); her team keeps
    an away rep's leads, so the clock, not a re-route, is what is tested."""
    lead = _assigned("p0@acme.com")
    assignment = Assignment.objects.get(lead=lead, active=True)
    assert assignment.rep.email == "ana@example.com"
    Team.objects.filter(pk=assignment.team_id).update(
        respect_working_hours=respect_hours, keep_leads_when_rep_away=True
    )
    Rep.objects.filter(pk=assignment.rep_id).update(working_hours=None)
    Assignment.objects.filter(pk=assignment.pk).update(
        assigned_at=assigned_at,
        sla_minutes=minutes,
        sla_due_at=assigned_at + timedelta(minutes=minutes),
    )
    assignment.refresh_from_db()
    return lead, assignment


def test_leave_planned_while_the_clock_runs_pauses_it_and_cancelling_it_resumes(rules):
    now = timezone.now()
    _lead, assignment = _running_clock(assigned_at=now - timedelta(minutes=10))
    due = assignment.sla_due_at
    assert due is not None
    ana = assignment.rep
    # 30 of the 60 minutes pass before the leave, 30 are left when she is back.
    start, end = now + timedelta(minutes=20), now + timedelta(days=2)
    absence = rep_absence_save(
        absence=RepAbsence(rep=ana, starts_at=start, ends_at=end, note="Leave"), actor="test"
    )
    assignment.refresh_from_db()
    assert assignment.sla_due_at == end + timedelta(minutes=30)
    # The check at the old due time breaches nothing.
    assert sla_check(now=due + timedelta(minutes=1)).breached == 0
    assignment.refresh_from_db()
    assert assignment.sla_breached_at is None

    assert rep_absence_cancel(rep_id=ana.pk, absence_id=absence.pk, actor="test")
    assignment.refresh_from_db()
    assert assignment.sla_due_at == due
    assert sla_check(now=due + timedelta(minutes=1)).breached == 1


def test_leave_planned_by_an_import_pauses_the_clock_too(rules):
    now = timezone.now()
    _lead, assignment = _running_clock(assigned_at=now - timedelta(minutes=10))
    start, end = now + timedelta(minutes=20), now + timedelta(days=2)
    ana = {
        **RULES["reps"][0],
        "absences": [{"from": start.isoformat(), "to": end.isoformat(), "note": "Leave"}],
    }
    rules_import({**RULES, "reps": [ana, *RULES["reps"][1:]]}, publish=False)
    assert RepAbsence.objects.filter(rep=assignment.rep).count() == 1
    assignment.refresh_from_db()
    assert assignment.sla_due_at == end + timedelta(minutes=30)


def test_a_holiday_added_while_the_clock_runs_pauses_it_at_the_check(rules):
    # Assigned at 23:30 Berlin on a day, due at 00:30 on the next, which becomes a company day.
    day = (timezone.now() + timedelta(days=3)).astimezone(BERLIN).date()
    midnight = datetime.combine(day, datetime.min.time(), tzinfo=BERLIN)
    _lead, assignment = _running_clock(assigned_at=midnight - timedelta(minutes=30))
    due = assignment.sla_due_at
    assert due == midnight + timedelta(minutes=30)
    calendar = HolidayCalendar.objects.create(name="Company")
    calendar.reps.add(assignment.rep)
    HolidayCalendarDay.objects.create(calendar=calendar, date=day, name="Offsite")

    assert sla_check(now=due + timedelta(minutes=1)).breached == 0
    assignment.refresh_from_db()
    assert assignment.sla_breached_at is None
    # 30 minutes before the holiday, 30 after it: 00:30 the day after.
    after = datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=BERLIN)
    assert assignment.sla_due_at == after + timedelta(minutes=30)
    assert sla_check(now=after + timedelta(minutes=31)).breached == 1


def test_a_wall_clock_team_is_not_paused(rules):
    now = timezone.now()
    _lead, assignment = _running_clock(assigned_at=now - timedelta(minutes=10), respect_hours=False)
    due = assignment.sla_due_at
    assert due is not None
    rep_absence_save(
        absence=RepAbsence(
            rep=assignment.rep,
            starts_at=now + timedelta(minutes=20),
            ends_at=now + timedelta(days=2),
        ),
        actor="test",
    )
    assignment.refresh_from_db()
    assert assignment.sla_due_at == due
    assert sla_check(now=due + timedelta(minutes=1)).breached == 1


def test_leave_planned_on_the_reps_admin_page_pauses_the_clock(rules, admin_client):
    now = timezone.now()
    _lead, assignment = _running_clock(assigned_at=now - timedelta(minutes=10))
    ana = assignment.rep
    # Whole minutes in Berlin, as the form takes them.
    start = (now + timedelta(minutes=30)).astimezone(BERLIN).replace(second=0, microsecond=0)
    end = (now + timedelta(days=2)).astimezone(BERLIN).replace(second=0, microsecond=0)
    url = f"/admin/routing/rep/{ana.pk}/change/"
    form = admin_client.get(url).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k not in ("user",)}
    data.update(
        {
            "active": "on",
            "working_hours": "",
            "absences-TOTAL_FORMS": "1",
            "absences-INITIAL_FORMS": "0",
            "absences-MIN_NUM_FORMS": "0",
            "absences-MAX_NUM_FORMS": "1000",
            "absences-0-starts_local": f"{start:%Y-%m-%d %H:%M}",
            "absences-0-ends_local": f"{end:%Y-%m-%d %H:%M}",
            "absences-0-note": "",
            "absences-0-rep": str(ana.pk),
        }
    )
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.content[:3000]
    assert RepAbsence.objects.filter(rep=ana).count() == 1
    assignment.refresh_from_db()
    elapsed = start - assignment.assigned_at
    assert assignment.sla_due_at == end + (timedelta(minutes=60) - elapsed)


def test_a_holiday_added_while_the_clock_runs_moves_the_warning_too(rules, settings):
    """The warning follows the clock the check breaches by: not before the old due time."""
    from routing.monitoring.models import SlaWarning
    from routing.monitoring.sla_warning import sla_warn

    settings.SLA_WARNING_MINUTES = 15
    day = (timezone.now() + timedelta(days=3)).astimezone(BERLIN).date()
    midnight = datetime.combine(day, datetime.min.time(), tzinfo=BERLIN)
    _lead, assignment = _running_clock(assigned_at=midnight - timedelta(minutes=30))
    due = assignment.sla_due_at
    calendar = HolidayCalendar.objects.create(name="Company")
    calendar.reps.add(assignment.rep)
    HolidayCalendarDay.objects.create(calendar=calendar, date=day, name="Offsite")

    assert sla_warn(now=due - timedelta(minutes=10)) == 0  # the old due time warns nobody
    assignment.refresh_from_db()
    after = datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=BERLIN)
    assert assignment.sla_due_at == after + timedelta(minutes=30)
    assert not SlaWarning.objects.exists()
    assert sla_warn(now=after + timedelta(minutes=20)) == 1  # 10 minutes before the new one
    warning = SlaWarning.objects.get()
    assert warning.sla_due_at == after + timedelta(minutes=30)


def test_a_wall_clock_teams_warning_is_not_moved(rules, settings):
    from routing.monitoring.sla_warning import sla_warn

    settings.SLA_WARNING_MINUTES = 15
    day = (timezone.now() + timedelta(days=3)).astimezone(BERLIN).date()
    midnight = datetime.combine(day, datetime.min.time(), tzinfo=BERLIN)
    _lead, assignment = _running_clock(
        assigned_at=midnight - timedelta(minutes=30), respect_hours=False
    )
    calendar = HolidayCalendar.objects.create(name="Company")
    calendar.reps.add(assignment.rep)
    HolidayCalendarDay.objects.create(calendar=calendar, date=day, name="Offsite")
    assert sla_warn(now=assignment.sla_due_at - timedelta(minutes=10)) == 1
