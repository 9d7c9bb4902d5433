"""Reps' live state recorded (routing.timeoff.state_history) and replayed as it was: every path
that changes ``active`` or ``out_of_office_until`` leaves a ``RepStateChange`` (database
triggers), and a replay of past leads, of a ruleset or of a draft, decides each lead with the
reps as they were when it arrived."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from routing.config_api.tokens import api_token_create
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigDraft
from routing.drafts.services import config_draft_create, config_draft_patch, draft_check
from routing.models import Assignment, Rep, RuleSet, RuleSetStatus
from routing.rules_io import rules_import
from routing.services import lead_process
from routing.timeoff.models import RepAbsence, RepAbsencePast, RepStateChange
from routing.timeoff.state_history import rep_state_history
from routing.versions import reps_deactivate, reps_set_out_of_office, ruleset_replay
from tests.leads.factories import LeadFactory
from tests.routing.factories import user_with_perms
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

BEN = "ben@example.com"


@pytest.fixture
def published() -> Any:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield RuleSet.objects.get(status=RuleSetStatus.PUBLISHED)
    clear_live_config_cache()


def _apart() -> None:
    # The triggers stamp changes with the database clock (SQLite: milliseconds): keep the
    # steps of a story apart so their order is unambiguous.
    time.sleep(0.01)


def _owners() -> dict[str, str]:
    return {
        str(a.lead.raw_payload["email"]): a.rep.email
        for a in Assignment.objects.filter(active=True).select_related("lead", "rep")
    }


def _route(*emails: str) -> None:
    for email in emails:
        lead = LeadFactory(raw_payload={"email": email})
        lead_process(lead_id=lead.id)


def _changes(rep: Rep) -> list[tuple[bool, bool]]:
    return [
        (c.active, c.out_of_office_until is not None)
        for c in RepStateChange.objects.filter(rep=rep).order_by("at", "id")
    ]


def test_every_path_that_changes_a_reps_state_is_recorded(published, client):
    ben = Rep.objects.get(email=BEN)
    assert _changes(ben) == [(True, False)]  # created by the import
    until = timezone.now() + timedelta(days=1)
    reps_set_out_of_office(reps=[ben], until=until)  # the bulk action's service
    ben.refresh_from_db()
    ben.out_of_office_until = None
    ben.save()  # the rep's form saves the model
    reps_deactivate(reps=[ben])  # the bulk action's service
    reps = [RULES["reps"][0], {**RULES["reps"][1], "active": True}]
    rules_import({**RULES, "reps": reps}, publish=False)  # an import
    secret = api_token_create(
        user=user_with_perms("sync", "roster"), name="hr", scopes="roster", actor="test"
    ).secret
    response = client.patch(
        f"/api/v1/config/roster/reps/{BEN}/",
        {"active": False},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )
    assert response.status_code == 200, response.content
    ben.refresh_from_db()
    ben.name = "Benjamin"
    ben.save()  # no change of state: nothing recorded
    assert _changes(ben) == [
        (True, False),
        (True, True),
        (True, False),
        (False, False),
        (True, False),
        (False, False),
    ]
    change = RepStateChange.objects.filter(rep=ben).order_by("at", "id")[1]
    assert change.out_of_office_until == until
    assert (change.was_active, change.was_out_of_office_until) == (True, None)


def test_the_state_at_a_moment_is_the_last_change_before_it_or_what_the_first_replaced(published):
    ben = Rep.objects.get(email=BEN)
    start = timezone.now()
    _apart()
    reps_deactivate(reps=[ben])
    _apart()
    middle = timezone.now()
    _apart()
    Rep.objects.filter(pk=ben.pk).update(active=True)
    _apart()
    history = rep_state_history(since=middle)
    assert history.at(ben.pk, start).active is True  # before the first change read: was
    assert history.at(ben.pk, middle).active is False
    assert history.at(ben.pk, timezone.now()).active is True
    assert history.at(Rep.objects.get(email="ana@example.com").pk, middle) is None  # as now


def test_a_replay_does_not_give_a_lead_to_a_rep_who_was_away_when_it_arrived(published):
    ben = Rep.objects.get(email=BEN)
    reps_set_out_of_office(reps=[ben], until=timezone.now() + timedelta(days=3))
    _apart()
    _route("x1@acme.com", "x2@acme.com")
    assert set(_owners().values()) == {"ana@example.com"}
    _apart()
    ben.refresh_from_db()
    ben.out_of_office_until = None
    ben.save()  # back now

    result = ruleset_replay(ruleset=published)
    assert result.considered == 2
    assert result.changed == 0, [(r.before.rep, r.after.rep) for r in result.rows]

    # A draft giving the team to Ben alone: he was away, so neither lead is his in its replay.
    draft = config_draft_create(actor="user:rita")
    config_draft_patch(
        draft_id=draft.pk,
        changes={"teams": {"EMEA SDR": {"strategy": "round_robin", "members": [{"rep": BEN}]}}},
        actor="user:rita",
    )
    check = draft_check(draft=ConfigDraft.objects.get(pk=draft.pk))
    assert check.considered == 2
    assert check.changed == 2
    assert all(row.after.rep != BEN for row in check.rows), [r.after for r in check.rows]


def test_a_replay_gives_a_lead_to_a_rep_who_was_there_and_is_away_now(published):
    _route("y1@acme.com", "y2@acme.com")
    assert sorted(_owners().values()) == ["ana@example.com", BEN]
    _apart()
    reps_deactivate(reps=[Rep.objects.get(email=BEN)])
    result = ruleset_replay(ruleset=published)
    assert result.changed == 0, [(r.before.rep, r.after.rep) for r in result.rows]


def test_a_replay_honours_a_planned_absence_that_covered_the_lead_and_has_ended(published):
    ben = Rep.objects.get(email=BEN)
    now = timezone.now()
    absence = RepAbsence.objects.create(
        rep=ben, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1)
    )
    _route("z1@acme.com", "z2@acme.com")
    assert set(_owners().values()) == {"ana@example.com"}
    # The leave ended early (RevOps shortened it): Ben is back now.
    RepAbsence.objects.filter(pk=absence.pk).update(ends_at=timezone.now())
    result = ruleset_replay(ruleset=published)
    assert result.changed == 0, [(r.before.rep, r.after.rep) for r in result.rows]


def test_a_replay_still_sees_a_leave_that_was_deleted_after_it_began(published):
    ben = Rep.objects.get(email=BEN)
    now = timezone.now()
    absence = RepAbsence.objects.create(
        rep=ben, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(days=1)
    )
    _route("w1@acme.com", "w2@acme.com")
    assert set(_owners().values()) == {"ana@example.com"}
    _apart()
    absence.delete()  # RevOps remove the leave under way (the form, a time-off file, the API)
    past = RepAbsencePast.objects.get(rep=ben)
    assert past.starts_at == absence.starts_at
    assert now < past.ends_at <= timezone.now()  # what had happened, not the planned end
    result = ruleset_replay(ruleset=published)
    assert result.changed == 0, [(r.before.rep, r.after.rep) for r in result.rows]
    # A leave deleted before it began leaves nothing behind.
    later = RepAbsence.objects.create(
        rep=ben, starts_at=now + timedelta(days=2), ends_at=now + timedelta(days=3)
    )
    later.delete()
    assert RepAbsencePast.objects.count() == 1


def _shift_leads_back(delta: timedelta) -> None:
    from leads.models import Lead

    for lead in Lead.objects.all():
        Lead.objects.filter(pk=lead.pk).update(
            received_at=lead.received_at - delta,
            processed_at=(lead.processed_at - delta) if lead.processed_at else None,
        )


def test_a_replay_asks_holidays_at_the_leads_arrival_not_at_the_replay(published):
    from zoneinfo import ZoneInfo

    from routing.timeoff.models import HolidayCalendar, HolidayCalendarDay

    berlin = ZoneInfo("Europe/Berlin")
    ben = Rep.objects.get(email=BEN)
    calendar = HolidayCalendar.objects.create(name="Company")
    calendar.reps.add(ben)
    day = HolidayCalendarDay.objects.create(
        calendar=calendar, date=timezone.now().astimezone(berlin).date(), name="Offsite"
    )
    clear_live_config_cache()
    _route("h1@acme.com", "h2@acme.com")
    assert set(_owners().values()) == {"ana@example.com"}  # Ben's company day
    # The story moved a day back: the leads came yesterday, Ben's day off was yesterday.
    _shift_leads_back(timedelta(days=1))
    HolidayCalendarDay.objects.filter(pk=day.pk).update(date=day.date - timedelta(days=1))
    clear_live_config_cache()
    result = ruleset_replay(ruleset=published)
    assert result.considered == 2
    assert result.changed == 0, [(r.before.rep, r.after.rep) for r in result.rows]

    # Ben's day off today instead: the leads that came yesterday could have been his.
    HolidayCalendarDay.objects.filter(pk=day.pk).update(date=day.date)
    clear_live_config_cache()
    result = ruleset_replay(ruleset=published)
    assert result.changed == 1, [(r.before.rep, r.after.rep) for r in result.rows]
    assert [row.after.rep for row in result.rows] == [BEN]


def test_a_replay_asks_working_hours_at_the_leads_arrival(published):
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from routing.models import Team

    Team.objects.filter(name="EMEA SDR").update(respect_working_hours=True)
    berlin = ZoneInfo("Europe/Berlin")
    now = timezone.now().astimezone(berlin)

    def window(around: datetime) -> dict[str, Any]:  # two hours about a local time, every day
        return {
            "days": [1, 2, 3, 4, 5, 6, 7],
            "start": f"{(around - timedelta(hours=1)):%H:%M}",
            "end": f"{(around + timedelta(hours=1)):%H:%M}",
        }

    Rep.objects.filter(email=BEN).update(working_hours=window(now + timedelta(hours=12)))
    clear_live_config_cache()
    _route("w1@acme.com", "w2@acme.com")
    assert set(_owners().values()) == {"ana@example.com"}  # Ben outside his hours
    # The leads came 12 hours ago, outside the hours Ben has now (which hold at this moment).
    _shift_leads_back(timedelta(hours=12))
    Rep.objects.filter(email=BEN).update(working_hours=window(now))
    clear_live_config_cache()
    result = ruleset_replay(ruleset=published)
    assert result.considered == 2
    assert result.changed == 0, [(r.before.rep, r.after.rep) for r in result.rows]
