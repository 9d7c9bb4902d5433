"""Issue 23, item 4: a lead nobody can take is retried at a growing, capped interval, its
timeline gets one event per change of state (not two per retry), and the lead keeps the count."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from audit.models import Event
from leads.models import Lead, LeadStatus
from routing.decisions import clear_live_config_cache
from routing.monitoring.unassigned import unassigned_retry
from routing.rules_io import rules_import
from routing.services import lead_process, lead_reroute
from tests.leads.factories import LeadFactory
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)


@pytest.fixture(autouse=True)
def _intervals(settings: Any) -> None:
    settings.UNASSIGNED_RETRY_SECONDS = 300
    settings.UNASSIGNED_RETRY_MAX_SECONDS = 2400
    clear_live_config_cache()  # no ruleset published: every lead stays unassigned


def _types(lead: Lead) -> list[str]:
    return list(Event.objects.filter(lead=lead).order_by("seq").values_list("type", flat=True))


def _retry_when_due(lead: Lead) -> None:
    """Run the beat job just before the lead is due (nothing), then when due, then the worker."""
    lead.refresh_from_db()
    due = lead.unassigned_retry_at
    assert due is not None
    assert unassigned_retry(now=due - SECOND) == 0
    assert unassigned_retry(now=due) == 1
    lead.refresh_from_db()
    assert lead.status == LeadStatus.RECEIVED
    lead_process(lead_id=lead.id)
    lead.refresh_from_db()


def test_retries_grow_to_a_cap_with_one_event_and_the_count_on_the_lead() -> None:
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=lead.id) == LeadStatus.UNASSIGNED
    lead.refresh_from_db()
    assert lead.unassigned_retries == 0
    assert lead.processed_at is not None
    assert lead.unassigned_retry_at == lead.processed_at + timedelta(seconds=300)

    waits = []
    for _ in range(6):
        _retry_when_due(lead)
        assert lead.status == LeadStatus.UNASSIGNED
        assert lead.unassigned_retry_at is not None
        assert lead.processed_at is not None
        waits.append((lead.unassigned_retry_at - lead.processed_at).total_seconds())
    assert waits == [600, 1200, 2400, 2400, 2400, 2400]
    assert lead.unassigned_retries == 6
    # Still unassigned after six retries: one event for becoming unassigned, none per retry.
    assert _types(lead) == ["received", "unassigned"]

    # A rep can take it now: the next retry assigns it, one event for that change.
    rules_import(RULES, publish=True)
    clear_live_config_cache()
    _retry_when_due(lead)
    assert lead.status == LeadStatus.ASSIGNED
    assert lead.unassigned_retry_at is None
    assert lead.unassigned_retries == 7  # kept: how many retries it took
    assert _types(lead) == ["received", "unassigned", "assigned"]
    assigned = Event.objects.get(lead=lead, type="assigned")
    assert assigned.data["unassigned_retries"] == 7
    assert unassigned_retry(now=lead.processed_at + timedelta(days=1)) == 0
    clear_live_config_cache()


def test_a_reroute_by_a_person_is_on_the_timeline_and_starts_the_intervals_again() -> None:
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    lead_process(lead_id=lead.id)
    for _ in range(3):
        _retry_when_due(lead)
    assert lead.unassigned_retries == 3
    lead_reroute(lead_id=lead.id, actor="mia")
    assert lead_process(lead_id=lead.id) == LeadStatus.UNASSIGNED
    lead.refresh_from_db()
    # Asked for by a person: the request and its outcome are both on the timeline.
    assert _types(lead) == ["received", "unassigned", "reroute_requested", "unassigned"]
    assert lead.unassigned_retries == 0
    assert lead.unassigned_retry_at == lead.processed_at + timedelta(seconds=300)


def test_a_lead_unassigned_before_the_upgrade_is_retried_on_the_old_schedule() -> None:
    """Leads left unassigned by an older version have no next retry time: due 5 minutes after
    their last routing, as before, and silently retried like any other."""
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    lead_process(lead_id=lead.id)
    Lead.objects.filter(pk=lead.pk).update(unassigned_retry_at=None)
    lead.refresh_from_db()
    assert lead.processed_at is not None
    assert unassigned_retry(now=lead.processed_at + timedelta(seconds=299)) == 0
    assert unassigned_retry(now=lead.processed_at + timedelta(seconds=300)) == 1
    assert lead_process(lead_id=lead.id) == LeadStatus.UNASSIGNED
    lead.refresh_from_db()
    assert lead.unassigned_retries == 1
    assert _types(lead) == ["received", "unassigned"]
