"""The CRM sweeper: leads past their bounded wait go back to routing in bulk, whatever the rate
limit's budget; and a lookup is published again only when its message was used or lost, never
while it still waits in the queue."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from audit.models import Event, EventType
from leads.models import CrmLookupStatus, Lead, LeadStatus
from routing import decisions
from routing.crm.lookup import clear_connection_cache, crm_sweep_due
from routing.crm.models import CrmConnection
from routing.models import Assignment
from routing.services import lead_process
from tests.leads.factories import LeadFactory
from tests.routing.enrichment.conftest import Sent, sent
from tests.routing.factories import RepFactory, published_ruleset, team_with

__all__ = ["sent"]

pytestmark = pytest.mark.django_db

LOOKUP = "crm.lookup_lead"
ROUTE = "routing.process_lead"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    decisions.clear_live_config_cache()
    clear_connection_cache()


@pytest.fixture
def connection() -> CrmConnection:
    team = team_with([RepFactory()])
    published_ruleset({"name": "Everyone", "action": {"type": "team", "team": team.name}})
    # A budget of one lookup a minute: the sweep may send one lookup at most.
    return CrmConnection.objects.create(
        kind="hubspot", name="HubSpot", base_url="https://127.0.0.1:9", rate_per_minute=1, burst=1
    )


def _parked(n: int, capture: Any, prefix: str = "p") -> list[Lead]:
    leads = [
        LeadFactory(raw_payload={"email": f"{prefix}{i}@{prefix}company{i}.example"})
        for i in range(n)
    ]
    for lead in leads:
        with capture(execute=True):
            assert lead_process(lead_id=lead.id) == LeadStatus.PROCESSING
    return leads


def _age(leads: list[Lead], seconds: float) -> None:
    """As if parked ``seconds`` ago and due since."""
    then = timezone.now() - timedelta(seconds=seconds)
    Lead.objects.filter(id__in=[lead.id for lead in leads]).update(
        crm={"_since": then.isoformat()}, crm_parked_at=then, crm_next_at=then
    )


def _routed(sent: Sent) -> list[str]:
    return sent.ids(ROUTE) + sent.ids("routing.process_leads")


def test_leads_past_their_wait_go_back_to_routing_in_bulk_outside_the_budget(
    connection, sent: Sent, settings, django_capture_on_commit_callbacks
):
    settings.CRM_LOOKUP_MAX_WAIT_SECONDS = 120
    leads = _parked(5, django_capture_on_commit_callbacks)
    fresh = _parked(1, django_capture_on_commit_callbacks, prefix="fresh")[0]
    _age(leads, 121)
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        crm_sweep_due()
    for lead in leads:
        lead.refresh_from_db()
        assert lead.crm_status == CrmLookupStatus.FAILED
        assert lead.crm["hubspot"]["status"] == "failed"
        assert lead.crm["hubspot"]["reason"].startswith("no answer within 120 s")
        event = Event.objects.get(chain=str(lead.id), type=EventType.CRM_CHECKED)
        assert "no answer within 120 s" in event.data["summary"]
    assert sorted(_routed(sent)) == sorted(str(lead.id) for lead in leads)
    assert sent.ids(LOOKUP) == []  # none of the budget spent on a lead past its wait
    fresh.refresh_from_db()
    assert fresh.crm_status == CrmLookupStatus.PENDING  # still within its wait: untouched
    # Routed, the trace says why the CRM is missing.
    assert lead_process(lead_id=leads[0].id) == LeadStatus.ASSIGNED
    whys = [entry["why"] for entry in Assignment.objects.get(lead=leads[0]).trace]
    assert any(
        why.startswith("HubSpot unavailable for this lead: no answer within 120 s") for why in whys
    ), whys


def test_a_lookup_still_queued_is_not_sent_again(
    connection, sent: Sent, django_capture_on_commit_callbacks
):
    lead = _parked(1, django_capture_on_commit_callbacks)[0]
    assert sent.ids(LOOKUP) == [str(lead.id)]  # published when parked
    for _ in range(3):
        crm_sweep_due()  # due, but its message has not run yet
    assert sent.ids(LOOKUP) == [str(lead.id)]


def test_a_lookup_whose_message_ran_and_must_try_again_is_sent_when_due(
    connection, sent: Sent, django_capture_on_commit_callbacks
):
    lead = _parked(1, django_capture_on_commit_callbacks)[0]
    # Its message ran and the lookup was rescheduled (a wait for the rate limit).
    later = timezone.now() + timedelta(seconds=2)
    Lead.objects.filter(id=lead.id).update(crm_next_at=later)
    assert crm_sweep_due(now=later - timedelta(seconds=1)) == 0  # not due yet
    crm_sweep_due(now=later + timedelta(seconds=1))
    assert sent.ids(LOOKUP) == [str(lead.id)] * 2


def test_a_lookup_whose_message_was_lost_is_sent_again_after_the_redispatch_delay(
    connection, sent: Sent, settings, django_capture_on_commit_callbacks
):
    settings.CRM_REDISPATCH_SECONDS = 60
    lead = _parked(1, django_capture_on_commit_callbacks)[0]
    crm_sweep_due(now=timezone.now() + timedelta(seconds=30))
    assert sent.ids(LOOKUP) == [str(lead.id)]
    crm_sweep_due(now=timezone.now() + timedelta(seconds=61))
    assert sent.ids(LOOKUP) == [str(lead.id)] * 2
