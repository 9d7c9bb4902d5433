"""A CRM owner on planned leave or on a holiday is not kept as the lead's owner: at the lookup
(routing), in a replay, at write-back and when the owner changes in the CRM, every path asks
``routing.timeoff.availability.rep_unavailable_reason`` (HubSpot stand-ins for the first two,
the Salesforce stand-in for the others)."""

from __future__ import annotations

from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from routing.crm.models import CrmOwner
from routing.delivery.models import Delivery
from routing.delivery.services import delivery_attempt
from routing.models import Assignment, AssignmentKind, Rep, RuleSet
from routing.services import lead_process
from routing.timeoff.models import HolidayCalendar, RepAbsence
from routing.versions import ruleset_replay
from tests.routing.crm.test_pipeline_findings import _found, _fresh, _lead, world
from tests.routing.crm.test_writeback_order import _due, _routed, org
from tests.routing.enrichment.conftest import sent
from tests.support.crm_salesforce import salesforce_standin

__all__ = ["_fresh", "org", "salesforce_standin", "sent", "world"]


def away(rep: Rep, how: str) -> str:
    """Make ``rep`` unavailable now by ``how``; the words the reason then holds."""
    now = timezone.now()
    if how == "leave":
        RepAbsence.objects.create(
            rep=rep, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(days=3)
        )
        return "on leave until"
    calendar = HolidayCalendar.objects.create(name=f"Company {rep.pk}")
    calendar.reps.add(rep)
    today = now.astimezone(ZoneInfo(rep.timezone or "UTC")).date()
    calendar.days.create(date=today, name="Offsite")
    return "company holiday: Offsite"


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["leave", "holiday"])
def test_a_crm_owner_away_is_noted_and_the_rules_decide(world, how):
    words = away(world["ana"], how)
    lead = _lead(_found("7001"))
    lead_process(lead_id=lead.id)
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.kind == AssignmentKind.INITIAL
    assert assignment.rep == world["ben"]
    notes = [
        entry["why"] for entry in assignment.trace if "owned in HubSpot by Ana" in entry["why"]
    ]
    assert len(notes) == 1
    assert words in notes[0]
    assert notes[0].endswith("routed by the rules")


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["leave", "holiday"])
def test_a_replay_does_not_keep_a_crm_owner_who_is_away_now(world, how):
    owned = _lead(_found("7001"))
    lead_process(lead_id=owned.id)
    assert Assignment.objects.get(lead=owned).rep == world["ana"]
    away(world["ana"], how)
    result = ruleset_replay(ruleset=RuleSet.objects.get(status="published"), limit=10)
    assert result.considered == 1
    assert result.changed == 1  # today Ana is away: the rules give it to Ben
    assert result.rows[0].after.rep == world["ben"].email


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["leave", "holiday"])
def test_an_owner_found_at_write_back_who_is_away_does_not_get_the_lead(org, how):
    sf = org["sf"]
    cover = Rep.objects.create(email="ops@example.com", name="Ops", timezone="Europe/Berlin")
    CrmOwner.objects.filter(kind="salesforce", email="ops@example.com").update(rep=cover)
    away(cover, how)
    lead = _routed("late@fresh.io")  # the lookup found nobody
    first = Assignment.objects.get(lead=lead, active=True)
    person = sf.add_lead(
        Email="late@fresh.io", LastName="Late", Company="Fresh", OwnerId=org["users"]["ops"]
    )
    delivery = Delivery.objects.get(assignment=first, channel="crm")
    _due(delivery)

    assert delivery_attempt(delivery_id=delivery.pk) == "delivered"

    assert Assignment.objects.get(lead=lead, active=True).pk == first.pk
    record = sf.record("Lead", person)
    assert record is not None
    assert record["OwnerId"] == CrmOwner.objects.get(kind="salesforce", rep=first.rep).owner_id
