"""The lead's page (/history/<id>/) says in words where a Meta fetch stands: waiting and why
(an expired token, Meta unreachable), or failed with the reason; the page token never shows."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from leads.models import Lead, LeadStatus, Source
from leads.services import lead_ingest
from routing.fetch.meta import lead_meta_fetch
from routing.services import lead_process
from tests.leads.meta_fetch.conftest import notification
from tests.support.meta_graph import MetaGraphStandIn

pytestmark = pytest.mark.django_db


def _parked(source: Source, leadgen_id: str, capture: Any) -> Lead:
    with capture(execute=True):
        accepted = lead_ingest(source=source, record=notification(leadgen_id))
    with capture(execute=True):
        lead_process(lead_id=accepted.lead_id)
    return Lead.objects.get(id=accepted.lead_id)


def _fetched(lead: Lead, capture: Any) -> Lead:
    with capture(execute=True):
        lead_meta_fetch(lead_id=lead.id)
    lead.refresh_from_db()
    return lead


def _page(lead: Lead) -> str:
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw-boss-123"))
    response = client.get(f"/history/{lead.id}/")
    assert response.status_code == 200
    return response.content.decode()


def _section(html: str) -> str:
    start = html.index('id="fetch"')
    return html[start : html.index("</section>", start)]


def test_a_fetch_waiting_for_a_new_token_says_so(
    meta_source, meta_graph: MetaGraphStandIn, sent, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    lead = _parked(meta_source, meta_graph.add_lead(email="a@acme.de"), capture)
    meta_graph.expire_token()
    lead = _fetched(lead, capture)
    html = _page(lead)
    fetch = _section(html)
    assert "Meta Lead Ads" in fetch
    assert "Waiting" in fetch
    assert "page access token" in fetch
    assert "Session has expired" in fetch
    assert meta_graph.token not in html


def test_a_fetch_waiting_for_meta_says_why_and_when(
    meta_source, meta_graph: MetaGraphStandIn, sent, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    lead = _parked(meta_source, meta_graph.add_lead(email="a@acme.de"), capture)
    meta_graph.fail_next()
    lead = _fetched(lead, capture)
    fetch = _section(_page(lead))
    assert "Waiting" in fetch
    assert "unexpected error" in fetch
    assert "1 try" in fetch
    assert "next try" in fetch


def test_a_failed_fetch_shows_its_last_error_in_words(
    meta_source, meta_graph: MetaGraphStandIn, sent, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    lead = _parked(meta_source, "1300000000009999", capture)
    lead = _fetched(lead, capture)
    assert lead.status == LeadStatus.FAILED
    html = _page(lead)
    fetch = _section(html)
    assert "Could not be fetched" in fetch
    assert "does not exist" in fetch
    assert "Fetch from Meta again" in fetch  # what an operator does about it
    assert meta_graph.token not in html


def test_a_token_in_a_stored_note_is_never_shown(
    meta_source, meta_graph: MetaGraphStandIn, sent, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    lead = _parked(meta_source, meta_graph.add_lead(email="a@acme.de"), capture)
    token = meta_graph.token
    # A note written by an older version, or a vendor message that echoed the request.
    leaked = f"GET /v21.0/1?access_token={token}&fields=id failed; token {token}"
    Lead.objects.filter(id=lead.id).update(
        fetch={**lead.fetch, "note": leaked}, last_error=f"Meta Lead Ads: {leaked}"
    )
    html = _page(lead)
    assert token not in html
    assert "[redacted]" in _section(html)
