"""The fetch stage over HTTPS, through httpx, against the Graph stand-in with a certificate of its
own: trusted through ``META_GRAPH_CA_BUNDLE``, it fetches; a certificate the bundle does not
trust is the Graph API unavailable (retried, the breaker counts it), never a failed lead."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.utils import timezone

from leads.models import FetchStatus, Lead, LeadStatus, Source
from leads.services import lead_ingest
from routing.fetch.meta import lead_meta_fetch
from routing.services import lead_process
from tests.leads.factories import SourceFactory
from tests.leads.meta_fetch.conftest import notification
from tests.routing.enrichment.conftest import sent
from tests.routing.factories import RepFactory, published_ruleset, team_with
from tests.support.meta_graph import MetaGraphStandIn, meta_graph_tls

pytestmark = pytest.mark.django_db
__all__ = ["meta_graph_tls", "sent"]


@pytest.fixture
def tls_source(meta_graph_tls: MetaGraphStandIn, settings: Any) -> Source:
    settings.META_GRAPH_TIMEOUT_SECONDS = 2
    settings.META_FETCH_BACKOFF_SECONDS = 0
    settings.META_BREAKER_FAILURES = 2
    settings.META_BREAKER_COOLDOWN_SECONDS = 0.5
    team = team_with([RepFactory(email="ana@example.com")])
    published_ruleset({"name": "Everyone", "action": {"type": "team", "team": team.name}})
    return SourceFactory(
        slug="meta-tls",
        kind="meta_lead_ads",
        kind_options={
            "page_access_token": meta_graph_tls.token,
            "graph_base_url": meta_graph_tls.url,
        },
    )


def _run(capture: Any, action: Any) -> Any:
    with capture(execute=True):
        return action()


def _parked(source: Source, leadgen_id: str, capture: Any) -> Lead:
    record = notification(leadgen_id)
    lead = Lead.objects.get(
        id=_run(capture, lambda: lead_ingest(source=source, record=record)).lead_id
    )
    _run(capture, lambda: lead_process(lead_id=lead.id))
    return lead


def test_an_untrusted_certificate_waits_as_unavailable_then_the_right_bundle_fetches(
    tls_source, meta_graph_tls, sent, settings, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    leadgen_id = meta_graph_tls.add_lead(work_email="ana@brandt.de", full_name="Ana Brandt")
    lead = _parked(tls_source, leadgen_id, capture)

    # No bundle: the system's CAs do not trust the stand-in's certificate.
    settings.META_GRAPH_CA_BUNDLE = ""
    for _ in range(3):  # more than the breaker's threshold: still waiting, never failed
        Lead.objects.filter(id=lead.id).update(fetch_next_at=timezone.now())
        outcome = _run(capture, lambda: lead_meta_fetch(lead_id=lead.id))
        lead.refresh_from_db()
        assert outcome in ("retry", "waiting"), outcome
        assert (lead.status, lead.fetch_status) == (LeadStatus.PROCESSING, FetchStatus.PENDING)
        assert lead.last_error == ""
    assert meta_graph_tls.requests == []  # nothing was sent over a connection we refused
    assert "breaker" in lead.fetch["note"]  # the third try found the breaker open
    tries = lead.fetch_attempts
    assert tries == 2

    # The bundle that trusts it: fetched over HTTPS, then routed.
    settings.META_GRAPH_CA_BUNDLE = meta_graph_tls.ca_file
    time.sleep(0.6)  # the breaker's cool-down: the next try is its probe
    Lead.objects.filter(id=lead.id).update(fetch_next_at=timezone.now())
    assert _run(capture, lambda: lead_meta_fetch(lead_id=lead.id)) == "done"
    assert _run(capture, lambda: lead_process(lead_id=lead.id)) == LeadStatus.ASSIGNED
    lead.refresh_from_db()
    assert lead.email == "ana@brandt.de"
    assert meta_graph_tls.requests[-1].token_ok


def test_the_certificate_refusal_is_in_the_leads_note(
    tls_source, meta_graph_tls, sent, settings, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    leadgen_id = meta_graph_tls.add_lead(work_email="ana@brandt.de")
    lead = _parked(tls_source, leadgen_id, capture)
    other = MetaGraphStandIn(tls=True)
    try:
        settings.META_GRAPH_CA_BUNDLE = other.ca_file  # another CA: not the stand-in's
        assert _run(capture, lambda: lead_meta_fetch(lead_id=lead.id)) == "retry"
    finally:
        other.close()
    lead.refresh_from_db()
    assert "certificate is not trusted" in lead.fetch["note"]
    assert meta_graph_tls.token not in str(lead.fetch)
