"""Write-backs of one lead to one CRM in order, on PostgreSQL, with two attempts running at once
in two threads (two workers): a reassignment's write-back waits while a stale attempt of the
previous assignment is in flight, the stale one re-checks its assignment before it writes and
writes nothing, and the attempt's lease covers every request it may make (review findings C1,
C2). The Salesforce stand-in answers the first request slowly so that the two overlap."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from leads.models import CrmLookupStatus, Lead
from routing import decisions
from routing.crm.limits import WRITE_REQUESTS_LONGEST
from routing.crm.lookup import clear_connection_cache, lead_crm_lookup
from routing.crm.models import CrmOwner
from routing.crm.salesforce import clear_token_cache
from routing.delivery.models import Delivery
from routing.delivery.services import delivery_attempt
from routing.models import Assignment
from routing.services import lead_process, lead_reassign
from tests.leads.factories import LeadFactory
from tests.routing.crm.orgs import salesforce_org
from tests.routing.enrichment.conftest import Sent, sent
from tests.support.crm_salesforce import SalesforceStandIn, salesforce_standin
from tests.support.processes import wait_until

__all__ = ["salesforce_standin", "sent"]

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SLOW = 4.0  # seconds the stale attempt's first request takes


@pytest.fixture
def org(salesforce_standin: SalesforceStandIn, settings: Any, sent: Sent) -> Iterator[dict]:
    settings.CRM_CA_BUNDLE = salesforce_standin.ca_file
    settings.DELIVERY_EMAIL_ENABLED = False
    decisions.clear_live_config_cache()
    clear_connection_cache()
    clear_token_cache()
    yield salesforce_org(salesforce_standin)
    clear_token_cache()
    decisions.clear_live_config_cache()


def _routed(email: str) -> Lead:
    lead = LeadFactory(raw_payload={"email": email, "last_name": "Race"})
    lead_process(lead_id=lead.id)
    lead.refresh_from_db()
    if lead.crm_status == CrmLookupStatus.PENDING:
        lead_crm_lookup(lead_id=lead.id)
        lead_process(lead_id=lead.id)
    return lead


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``fn`` in another thread, on its own database connection (another worker)."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # the test reads it
            result["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _due(delivery: Delivery) -> None:
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())


def test_a_stale_write_back_cannot_land_after_the_reassignments(org):
    sf = org["sf"]
    person = sf.add_lead(
        Email="race@acme.com", LastName="Race", Company="Acme", OwnerId=org["users"]["ops"]
    )
    lead = _routed("race@acme.com")
    first = Assignment.objects.get(lead=lead, active=True)
    stale = Delivery.objects.get(assignment=first, channel="crm")
    sf.reset_log()
    sf.delay_next(SLOW)  # the first write-back's first request (it reads the Lead) is slow
    thread, result = _in_thread(lambda: delivery_attempt(delivery_id=stale.pk))
    wait_until(lambda: Delivery.objects.filter(pk=stale.pk, attempts=1).exists(), timeout=SLOW / 2)
    time.sleep(0.5)  # it has sent its first request and waits for the answer

    other = org["ben"] if first.rep_id == org["ana"].pk else org["ana"]
    lead_reassign(lead_id=lead.id, rep_email=other.email, reason="cover", actor="manager")
    current = Assignment.objects.get(lead=lead, active=True)
    fresh = Delivery.objects.get(assignment=current, channel="crm")
    _due(fresh)
    sent_before = len(sf.requests)
    # The reassignment's write-back waits for the one in flight: deferred, nothing sent.
    assert delivery_attempt(delivery_id=fresh.pk) == "deferred"
    assert len(sf.requests) == sent_before
    fresh.refresh_from_db()
    assert fresh.attempts == 0  # not counted as an attempt
    assert fresh.next_attempt_at is not None
    assert fresh.next_attempt_at > timezone.now()

    thread.join(timeout=SLOW + 20)
    assert not thread.is_alive()
    # The stale one read the Lead, then found its assignment superseded: nothing written.
    assert result.get("value") == "cancelled", result
    stale.refresh_from_db()
    assert stale.status == "cancelled"
    assert "superseded" in stale.last_error
    assert [r.method for r in sf.requests if r.method == "PATCH"] == []

    _due(fresh)
    assert delivery_attempt(delivery_id=fresh.pk) == "delivered"
    owner = CrmOwner.objects.get(kind="salesforce", rep=other).owner_id
    patches = [r.body for r in sf.requests if r.method == "PATCH"]
    assert patches == [{"OwnerId": owner}]
    record = sf.record("Lead", person)
    assert record is not None
    assert record["OwnerId"] == owner


def test_a_crm_write_back_holds_its_delivery_for_every_request_it_may_make(org, settings):
    settings.CRM_TIMEOUT_SECONDS = 30.0
    settings.CRM_CALL_DEADLINE_SECONDS = 30.0
    settings.DELIVERY_LEASE_SECONDS = 60
    sf = org["sf"]
    lead = _routed("lease@fresh.io")
    delivery = Delivery.objects.get(assignment__lead=lead, channel="crm")
    sf.delay_next(SLOW / 2)
    started = timezone.now()
    thread, result = _in_thread(lambda: delivery_attempt(delivery_id=delivery.pk))
    wait_until(
        lambda: Delivery.objects.filter(pk=delivery.pk, attempts=1).exists(), timeout=SLOW / 2
    )
    held_until = Delivery.objects.get(pk=delivery.pk).next_attempt_at
    thread.join(timeout=SLOW + 20)
    assert result.get("value") == "delivered", result
    need = (max(WRITE_REQUESTS_LONGEST.values()) + 3) * 30.0
    assert held_until is not None
    assert held_until >= started + timedelta(seconds=need)
