"""The CRM stages at the vendor's documented pace, with the connection's default budget, against
a stand-in that enforces that pace: nothing the vendor would refuse is sent."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from leads.models import CrmLookupStatus, Lead
from routing import decisions
from routing.crm.hubspot import clear_account_cache
from routing.crm.lookup import clear_connection_cache, lead_crm_lookup
from routing.crm.models import CrmConnection
from routing.crm.secrets import secret_seal
from routing.enrichment.store import redis_client
from routing.services import lead_process
from tests.leads.factories import LeadFactory
from tests.routing.factories import RepFactory, published_ruleset, team_with
from tests.support.crm_hubspot import HubSpotStandIn

pytestmark = [pytest.mark.django_db, pytest.mark.redis]


@pytest.fixture
def hubspot_enforcing(settings: Any) -> Iterator[HubSpotStandIn]:
    if redis_client() is None:
        pytest.skip("needs Redis (REDIS_URL): the shared token bucket")
    decisions.clear_live_config_cache()
    clear_connection_cache()
    clear_account_cache()
    hs = HubSpotStandIn(enforce_rate_limits=True).start()
    settings.CRM_CA_BUNDLE = hs.ca_file
    settings.CRM_LOOKUP_BACKOFF_SECONDS = 0
    try:
        yield hs
    finally:
        hs.close()
        clear_account_cache()
        decisions.clear_live_config_cache()


def _searches(hs: HubSpotStandIn) -> list[Any]:
    return [r for r in hs.requests if r.path.rstrip("/").endswith("/search")]


def _max_in_a_second(times: list[float]) -> int:
    times = sorted(times)
    best, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] >= 1.0:
            start += 1
        best = max(best, end - start + 1)
    return best


def test_lookups_at_hubspots_default_budget_stay_within_five_searches_a_second(
    hubspot_enforcing: HubSpotStandIn,
):
    """HubSpot allows 5 search requests a second per account; a token bucket lets burst +
    rate through in one second, so the defaults must keep that sum within 5."""
    hs = hubspot_enforcing
    CrmConnection.objects.create(
        kind="hubspot",
        name="HubSpot",
        base_url=hs.url,
        secret_encrypted=secret_seal(hs.token),
        writeback_enabled=False,
        touches_enabled=False,
    )  # rate_per_minute and burst left empty: HubSpot's defaults
    team = team_with([RepFactory()])
    published_ruleset({"name": "Everyone", "action": {"type": "team", "team": team.name}})
    leads = [LeadFactory(raw_payload={"email": f"p{i}@company{i}.example"}) for i in range(8)]
    for lead in leads:
        lead_process(lead_id=lead.id)  # parked for the lookup (its message is not sent)
    pending = {lead.id for lead in leads}
    deadline = time.monotonic() + 25
    while pending and time.monotonic() < deadline:
        for lead_id in sorted(pending):
            if lead_crm_lookup(lead_id=lead_id) in ("done", "failed"):
                pending.discard(lead_id)
        time.sleep(0.02)
    statuses = list(Lead.objects.filter(id__in=[x.id for x in leads]).values_list("crm_status"))
    assert statuses == [(CrmLookupStatus.DONE,)] * 8
    searches = _searches(hs)
    assert len(searches) == 16  # a contact and a company search per lead
    assert [r.status for r in searches if r.status == 429] == []
    assert _max_in_a_second([r.at for r in searches]) <= 5
