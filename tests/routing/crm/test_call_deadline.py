"""Every CRM request has a total deadline (``CRM_CALL_DEADLINE_SECONDS``), not only a per-read
timeout: a CRM that sends its answer a byte at a time, status line first, gets each read an
answer in time and would hold an I/O worker thread for as long as it keeps sending.

The real clients (hubspot-api-client on urllib3, simple-salesforce on requests) against the
stand-ins, told to trickle; then a lead whose lookup meets a trickling CRM goes on its normal
retry path and is routed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from leads.models import CrmLookupStatus, LeadStatus
from routing import decisions
from routing.crm.base import CrmError, CrmSettings
from routing.crm.hubspot import HubSpotClient, clear_account_cache
from routing.crm.lookup import clear_connection_cache, lead_crm_lookup
from routing.crm.models import CrmConnection
from routing.crm.salesforce import SalesforceClient, clear_token_cache
from routing.crm.secrets import secret_seal
from routing.models import Assignment
from routing.services import lead_process
from tests.leads.factories import LeadFactory
from tests.routing.enrichment.conftest import sent
from tests.routing.factories import RepFactory, published_ruleset, team_with
from tests.support.crm_hubspot import HubSpotStandIn, hubspot_standin
from tests.support.crm_salesforce import SalesforceStandIn, salesforce_standin

__all__ = ["hubspot_standin", "salesforce_standin", "sent"]

READ_TIMEOUT = 3.0  # each read gets a byte every TRICKLE s: this never fires
DEADLINE = 1.5
TRICKLE = 0.25
SLACK = 1.5  # the watchdog's wake-up, the TLS close, a loaded 2-core machine


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    clear_account_cache()
    clear_token_cache()
    clear_connection_cache()
    decisions.clear_live_config_cache()
    yield
    clear_account_cache()
    clear_token_cache()
    decisions.clear_live_config_cache()


def _hubspot(hs: HubSpotStandIn) -> HubSpotClient:
    return HubSpotClient(
        CrmSettings(
            kind="hubspot",
            base_url=hs.url,
            secret=hs.token,
            timeout_seconds=READ_TIMEOUT,
            deadline_seconds=DEADLINE,
            ca_bundle=hs.ca_file,
            connection_id=1,
        )
    )


def _salesforce(sf: SalesforceStandIn) -> SalesforceClient:
    return SalesforceClient(
        CrmSettings(
            kind="salesforce",
            base_url=sf.url,
            secret=sf.client_secret,
            options={"auth_flow": "client_credentials", "client_id": sf.client_id},
            timeout_seconds=READ_TIMEOUT,
            deadline_seconds=DEADLINE,
            ca_bundle=sf.ca_file,
            connection_id=1,
        )
    )


def _fails_within_the_deadline(call: Any) -> CrmError:
    started = time.monotonic()
    with pytest.raises(CrmError) as caught:
        call()
    took = time.monotonic() - started
    assert took < DEADLINE + SLACK, f"took {took:.1f} s"
    assert took >= DEADLINE - 0.1
    assert caught.value.kind == "unavailable"
    return caught.value


def test_hubspot_trickling_its_answer_is_cut_at_the_deadline(hubspot_standin):
    client = _hubspot(hubspot_standin)
    hubspot_standin.trickle_next(1, every=TRICKLE)
    error = _fails_within_the_deadline(lambda: client.find_person("ann@acme.com"))
    assert f"within {DEADLINE:g} s" in str(error)
    # The connection it cut is not reused broken: the next call works.
    assert client.find_person("ann@acme.com") is None


def test_salesforce_trickling_a_query_is_cut_at_the_deadline(salesforce_standin):
    client = _salesforce(salesforce_standin)
    client.users()  # the token first, so the trickle hits the query
    salesforce_standin.trickle_next(1, every=TRICKLE)
    error = _fails_within_the_deadline(lambda: client.find_person("ann@acme.com"))
    assert "timed out" in str(error)
    assert client.find_person("ann@acme.com") is None


def test_salesforce_trickling_its_token_answer_is_cut_at_the_deadline(salesforce_standin):
    client = _salesforce(salesforce_standin)
    salesforce_standin.trickle_next(1, every=TRICKLE)
    error = _fails_within_the_deadline(client.users)
    assert "token request timed out" in str(error)


def test_a_slow_but_steady_answer_within_the_deadline_is_kept(hubspot_standin):
    hubspot_standin.set_delay(0.5)
    assert _hubspot(hubspot_standin).find_person("ann@acme.com") is None


@pytest.mark.django_db
def test_a_lead_whose_lookup_meets_a_trickling_crm_is_retried_and_routed(
    hubspot_standin, settings, django_capture_on_commit_callbacks
):
    """The lookup fails within the deadline like any outage: the lead stays parked with a
    next try, the next try works, and it is routed once, with the CRM's answer."""
    settings.CRM_CA_BUNDLE = hubspot_standin.ca_file
    settings.CRM_LOOKUP_BACKOFF_SECONDS = 0
    settings.CRM_TIMEOUT_SECONDS = READ_TIMEOUT
    settings.CRM_CALL_DEADLINE_SECONDS = DEADLINE
    hs = hubspot_standin
    owner = hs.add_owner("ana@example.com", "Ana", "A")
    ana = RepFactory(email="ana@example.com", name="Ana")
    team = team_with([ana, RepFactory(email="ben@example.com", name="Ben")])
    connection = CrmConnection.objects.create(
        kind="hubspot",
        name="HubSpot",
        base_url=hs.url,
        secret_encrypted=secret_seal(hs.token),
        rate_per_minute=60_000,
        burst=100,
    )
    from routing.crm.roster import crm_roster_sync

    crm_roster_sync(connection, create_reps=False)
    published_ruleset(
        {"name": "Named accounts", "action": {"type": "account_owner"}},
        {"name": "Everyone", "action": {"type": "team", "team": team.name}},
    )
    hs.add_contact(email="pat@acme.com", hubspot_owner_id=owner)
    lead = LeadFactory(raw_payload={"email": "pat@acme.com"})
    with django_capture_on_commit_callbacks(execute=True):
        lead_process(lead_id=lead.id)
    lead.refresh_from_db()
    assert lead.crm_status == CrmLookupStatus.PENDING

    hs.trickle_next(1, every=TRICKLE)
    started = time.monotonic()
    with django_capture_on_commit_callbacks(execute=True):
        outcome = lead_crm_lookup(lead_id=lead.id)
    assert time.monotonic() - started < DEADLINE + SLACK + 1
    assert outcome == "retry"
    lead.refresh_from_db()
    assert lead.crm_status == CrmLookupStatus.PENDING
    assert lead.crm_next_at is not None
    assert not Assignment.objects.filter(lead=lead).exists()

    with django_capture_on_commit_callbacks(execute=True):
        assert lead_crm_lookup(lead_id=lead.id) == "done"
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.rep_id == ana.pk
