"""A lead erased while a worker has yet to finish with it (review of issue 21).

Queued, or parked for its Meta fetch, its CRM lookup or the enrichment provider, then resumed:
the worker re-reads ``erased_at`` under the lead's row lock, writes nothing of the person back
(not the payload it read, not what a vendor answered) and ends the lead ``excluded``; nothing
retries it. On PostgreSQL, erasure races the workers on real threads and connections. Every
test searches the whole database for the person afterwards. (Each failed before the fix: the
worker normalised, enriched or stored the CRM's and Meta's answers about the erased person.)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from werkzeug import Request, Response

from audit.models import Event, EventType
from audit.subject_access import person_export
from leads import privacy
from leads.models import CrmLookupStatus, EnrichmentStatus, FetchStatus, Lead, LeadStatus
from leads.services import lead_ingest
from routing.crm.lookup import clear_connection_cache, crm_sweep_due, lead_crm_lookup
from routing.crm.models import CrmConnection
from routing.crm.secrets import secret_seal
from routing.decisions import clear_live_config_cache
from routing.enrichment import lead_enrich
from routing.enrichment.services import enrichment_sweep_due
from routing.erasure import is_erased, lead_person_erase, person_erase
from routing.fetch.meta import lead_meta_fetch, meta_fetch_sweep_due
from routing.models import Assignment
from routing.rules_io import rules_import
from routing.services import lead_process
from tests.audit.test_pages import manager
from tests.leads.factories import LeadFactory
from tests.leads.meta_fetch.conftest import meta_source, notification
from tests.routing.enrichment.conftest import Sent, http, sent
from tests.routing.test_erasure import _found_anywhere
from tests.routing.test_pipeline import RULES
from tests.support.crm_hubspot import HubSpotStandIn, hubspot_standin
from tests.support.meta_graph import MetaGraphStandIn, meta_graph

__all__ = ["http", "hubspot_standin", "meta_graph", "meta_source", "sent"]

EMAIL = "zebulon.quartermaine@quartzly.example"
PHONE = "+4930555123456"
FIRST, LAST, COMPANY = "Zebulon", "Quartermaine", "Quartzly Holdings"
# What the vendors answer about the person: it must not be stored once they are erased.
INDUSTRY, CITY = "Quartzite Polishing", "Quartzburg-on-Sea"
NEEDLES = [EMAIL, PHONE, FIRST, LAST, COMPANY, INDUSTRY, CITY]
PAYLOAD = {
    "email": EMAIL,
    "phone": PHONE,
    "first_name": FIRST,
    "last_name": LAST,
    "company": COMPANY,
}


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    privacy.cache_clear()
    clear_live_config_cache()
    clear_connection_cache()
    yield
    clear_connection_cache()
    clear_live_config_cache()
    privacy.cache_clear()


def _nothing_of_the_person_left() -> None:
    for needle in NEEDLES:
        assert _found_anywhere(needle) == [], needle


def _ended_erased(lead: Lead, stage: str) -> None:
    lead.refresh_from_db()
    assert is_erased(lead)
    assert lead.first_name == privacy.ERASED
    assert (lead.email, lead.phone, lead.company, lead.industry, lead.city) == ("", "", "", "", "")
    assert lead.status == LeadStatus.EXCLUDED
    assert lead.claimed_until is None
    assert (lead.enrichment_status, lead.crm_status, lead.fetch_status) == ("", "", "")
    assert (lead.enrichment, lead.crm, lead.fetch) == ({}, {}, {})
    assert not Assignment.objects.filter(lead=lead).exists()
    ended = Event.objects.filter(lead=lead, type=EventType.EXCLUDED).get()
    assert ended.data["reason"] == "its person was erased before it was routed"
    assert ended.data["stage"] == stage
    # Nothing retries it: not claimable by routing, nor due for any stage.
    assert lead_process(lead_id=lead.id) is None
    _nothing_of_the_person_left()


@pytest.mark.django_db
def test_a_lead_erased_while_queued_is_ended_without_its_person_and_stays_erased(
    client: Client,
) -> None:
    rules_import(RULES, publish=True)
    lead = LeadFactory(raw_payload=PAYLOAD)
    assert person_erase(email=EMAIL, actor="user:dpo", reason="request").leads == 1
    assert lead_process(lead_id=lead.id) == LeadStatus.EXCLUDED
    _ended_erased(lead, "routing")
    # The mark is the column, not the fields: processing did not lose it (it used to:
    # normalising the erased payload blanked "erased person", so is_erased said False).
    assert lead.normalized_at is None
    user = manager("mia")
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    client.force_login(user)
    document = client.get(f"/api/v1/leads/{lead.pk}/").json()
    assert document["erased_at"] == lead.erased_at.isoformat()
    assert document["fields"]["first_name"] == privacy.ERASED
    page = client.get(f"/history/{lead.pk}/").content.decode()
    assert "Person erased" in page
    exported = person_export(lead_ids=[lead.pk], actor="user:dpo")
    assert [entry["erased"] for entry in exported["leads"]] == [True]


@pytest.mark.django_db
def test_a_lead_erased_while_parked_for_enrichment_is_not_enriched_when_resumed(
    http: Any, sent: Sent, django_capture_on_commit_callbacks: Any
) -> None:
    rules_import(RULES, publish=True)
    http.expect_request("/enrich", method="POST").respond_with_json(
        {"industry": INDUSTRY, "city": CITY, "employees": 5000}
    )
    lead = LeadFactory(raw_payload=PAYLOAD)
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_process(lead_id=lead.id) == LeadStatus.PROCESSING  # parked
    assert Lead.objects.get(pk=lead.pk).enrichment_status == EnrichmentStatus.PENDING
    person_erase(email=EMAIL, actor="user:dpo", reason="request")

    with django_capture_on_commit_callbacks(execute=True):
        assert lead_enrich(lead_id=lead.id) == LeadStatus.EXCLUDED
    assert http.log == []  # the provider was not asked about an erased person
    _ended_erased(lead, "enrichment")
    assert enrichment_sweep_due() == 0
    assert lead_enrich(lead_id=lead.id) is None


@pytest.mark.django_db
def test_a_lead_erased_while_parked_for_its_crm_lookup_is_not_looked_up_when_resumed(
    hubspot_standin: HubSpotStandIn, settings: Any, sent: Sent, django_capture_on_commit_callbacks
) -> None:
    settings.CRM_CA_BUNDLE = hubspot_standin.ca_file
    hs = hubspot_standin
    hs.add_contact(email=EMAIL, firstname=FIRST, lastname=LAST)
    CrmConnection.objects.create(
        kind="hubspot",
        name="HubSpot",
        base_url=hs.url,
        secret_encrypted=secret_seal(hs.token),
        rate_per_minute=60_000,
        burst=100,
    )
    rules_import(RULES, publish=True)
    lead = LeadFactory(raw_payload=PAYLOAD)
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_process(lead_id=lead.id) == LeadStatus.PROCESSING  # parked for the CRM
    assert Lead.objects.get(pk=lead.pk).crm_status == CrmLookupStatus.PENDING
    hs.reset_log()
    person_erase(email=EMAIL, actor="user:dpo", reason="request")

    with django_capture_on_commit_callbacks(execute=True):
        assert lead_crm_lookup(lead_id=lead.id) == LeadStatus.EXCLUDED
    assert hs.requests == []  # the CRM was not asked about an erased person
    _ended_erased(lead, "crm lookup")
    assert crm_sweep_due() == 0


@pytest.mark.django_db
def test_a_lead_erased_while_parked_for_its_meta_fetch_is_not_fetched_when_resumed(
    meta_source: Any, meta_graph: MetaGraphStandIn, sent: Sent, django_capture_on_commit_callbacks
) -> None:
    leadgen_id = meta_graph.add_lead(
        work_email=EMAIL, full_name=f"{FIRST} {LAST}", company_name=COMPANY
    )
    with django_capture_on_commit_callbacks(execute=True):
        accepted = lead_ingest(source=meta_source, record=notification(leadgen_id))
    lead = Lead.objects.get(pk=accepted.lead_id)
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_process(lead_id=lead.id) == LeadStatus.PROCESSING  # parked for its fetch
    assert Lead.objects.get(pk=lead.pk).fetch_status == FetchStatus.PENDING
    # Its notification names no one: the person is erased by the lead (API, admin).
    assert lead_person_erase(lead_id=lead.pk, actor="user:dpo", reason="request").leads == 1

    with django_capture_on_commit_callbacks(execute=True):
        assert lead_meta_fetch(lead_id=lead.id) == "erased"
    assert meta_graph.requests == []  # Meta was not asked for an erased person
    _ended_erased(lead, "meta fetch")
    assert meta_fetch_sweep_due() == 0


# --- PostgreSQL: erasure and the workers at once, on real threads and connections ------------


def _in_a_thread(work: Any) -> Any:
    """Run ``work`` on its own thread (its own database connection); its result or error."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = work()
        except BaseException as exc:  # handed to the caller
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the erasure did not finish"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_erasure_while_the_provider_is_asked_drops_its_answer_on_postgresql(
    http: Any, sent: Sent, django_capture_on_commit_callbacks: Any
) -> None:
    """The enrichment worker has read the lead and waits for the provider; the erasure commits
    meanwhile (another connection); the answer about the person comes back after it."""
    rules_import(RULES, publish=True)
    lead = LeadFactory(raw_payload=PAYLOAD)
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_process(lead_id=lead.id) == LeadStatus.PROCESSING  # parked
    erased: list[Any] = []

    def provider(request: Request) -> Response:
        assert json.loads(request.data)["email"] == EMAIL  # read before the erasure
        erased.append(
            _in_a_thread(lambda: person_erase(email=EMAIL, actor="user:dpo", reason="request"))
        )
        body = {"industry": INDUSTRY, "city": CITY, "company": COMPANY, "employees": 5000}
        return Response(json.dumps(body), content_type="application/json")

    http.expect_request("/enrich", method="POST").respond_with_handler(provider)
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_enrich(lead_id=lead.id) == LeadStatus.EXCLUDED
    assert erased[0].leads == 1
    _ended_erased(lead, "enrichment")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_erasure_racing_the_routing_worker_leaves_nothing_of_the_person_on_postgresql() -> None:
    """Whichever takes the lead's lock first, routing or erasure, nothing personal survives:
    routed then erased, or erased then ended without routing."""
    rules_import(RULES, publish=True)
    outcomes = set()
    for _ in range(6):
        lead = LeadFactory(raw_payload=PAYLOAD)
        barrier = threading.Barrier(2)
        results: dict[str, Any] = {}

        def route(lead_id: Any = lead.id, barrier: Any = barrier, results: Any = results) -> None:
            barrier.wait()
            results["route"] = lead_process(lead_id=lead_id)

        def erase(barrier: Any = barrier, results: Any = results) -> None:
            barrier.wait()
            results["erase"] = person_erase(email=EMAIL, actor="user:dpo", reason="request")

        threads = [threading.Thread(target=_closing(work)) for work in (route, erase)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)
        assert results["erase"].leads == 1, results
        lead.refresh_from_db()
        assert is_erased(lead)
        assert lead.first_name == privacy.ERASED
        assert lead.status in (LeadStatus.ASSIGNED, LeadStatus.EXCLUDED), lead.status
        assert lead.claimed_until is None
        outcomes.add(lead.status)
        _nothing_of_the_person_left()
        assert Event.objects.filter(lead=lead, type=EventType.ERASED).count() == 1
    assert outcomes  # (which order won each round is up to the scheduler)


def _closing(work: Any) -> Any:
    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    return run
