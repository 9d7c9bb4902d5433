"""The fetch stage against the Graph stand-in: a lead its notification only names is parked,
fetched at Meta's pace and routed with its person; each failure mode waits, retries or fails
with a reason an operator can act on. Real services, a real HTTP server, no mocks of ours."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from audit.models import Event, EventType
from leads.models import FetchStatus, Lead, LeadStatus, Source
from leads.services import lead_ingest
from routing.fetch.meta import (
    FETCH_TASK,
    alert_subject,
    lead_meta_fetch,
    leads_meta_fetch_retry,
    meta_fetch_sweep_due,
)
from routing.monitoring.models import Alert, AlertStatus
from routing.services import lead_process
from tests.config.test_log_context import json_lines
from tests.leads.meta_fetch.conftest import notification
from tests.routing.enrichment.conftest import Sent
from tests.support.meta_graph import MetaGraphStandIn

pytestmark = pytest.mark.django_db
__all__ = ["json_lines"]


def _accept(source: Source, leadgen_id: str, capture: Any) -> Lead:
    with capture(execute=True):
        accepted = lead_ingest(source=source, record=notification(leadgen_id))
    return Lead.objects.get(id=accepted.lead_id)


def _due(lead: Lead) -> None:
    Lead.objects.filter(id=lead.id).update(fetch_next_at=timezone.now())


def _fetch(lead: Lead, capture: Any) -> str | None:
    with capture(execute=True):
        outcome = lead_meta_fetch(lead_id=lead.id)
    lead.refresh_from_db()
    return outcome


def _process(lead: Lead, capture: Any) -> str | None:
    with capture(execute=True):
        status = lead_process(lead_id=lead.id)
    lead.refresh_from_db()
    return status


def test_a_notified_lead_is_fetched_then_routed_with_its_person(
    meta_source, meta_graph: MetaGraphStandIn, sent: Sent, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    leadgen_id = meta_graph.add_lead(
        work_email="J.Muessig@Brandt-Spedition.de",
        full_name="Jürgen Müßig",
        phone_number="+49 30 1234567",
        company_name="Brandt Spedition GmbH",
        **{"how_many_trucks?": "51-200"},
    )
    lead = _accept(meta_source, leadgen_id, capture)
    assert _process(lead, capture) == LeadStatus.PROCESSING  # parked for its fetch
    assert lead.fetch_status == FetchStatus.PENDING
    assert lead.claimed_until is None
    assert sent.ids(FETCH_TASK) == [str(lead.id)]
    assert meta_graph.requests == []  # nothing fetched until the fetch task runs

    assert _fetch(lead, capture) == "done"
    assert lead.fetch_status == FetchStatus.DONE
    assert lead.fetch["lead"]["id"] == leadgen_id
    assert lead.fetch["lead"]["page_id"] == "230076207144371"
    assert sent.ids("routing.process_lead")[-1] == str(lead.id)  # handed back

    assert _process(lead, capture) == LeadStatus.ASSIGNED
    assert lead.email == "j.muessig@brandt-spedition.de"
    assert (lead.first_name, lead.last_name) == ("Jürgen", "Müßig")
    assert lead.phone == "+49301234567"
    assert lead.company == "Brandt Spedition GmbH"
    assert lead.custom["how_many_trucks?"] == "51-200"
    assert lead.custom["campaign_name"] == "Q1 DACH demo requests"
    assert lead.raw_payload == notification(leadgen_id)  # the payload as received stays
    assert meta_graph.lead_calls() == 1
    types = list(Event.objects.filter(lead=lead).order_by("seq").values_list("type", flat=True))
    assert types[:2] == [EventType.RECEIVED, EventType.ENRICHED]
    assert types[-1] == EventType.ASSIGNED
    fetched = Event.objects.filter(lead=lead, type=EventType.ENRICHED).order_by("seq").first()
    assert fetched is not None
    assert fetched.data["provider"] == "meta_lead_ads"
    assert lead.attempts == 1  # the fetch was part of the one routing attempt


def test_an_expired_token_opens_an_alert_and_the_lead_waits_until_a_new_token(
    meta_source, meta_graph, sent, django_capture_on_commit_callbacks, settings
):
    capture = django_capture_on_commit_callbacks
    leadgen_id = meta_graph.add_lead(email="ana@acme.de", full_name="Ana Acme")
    lead = _accept(meta_source, leadgen_id, capture)
    _process(lead, capture)
    meta_graph.expire_token()
    assert _fetch(lead, capture) == "waiting"
    assert lead.status == LeadStatus.PROCESSING
    assert lead.fetch_status == FetchStatus.PENDING
    assert "page access token" in lead.fetch["note"]
    assert "190" in lead.fetch["note"]
    assert lead.fetch_attempts == 0  # a credential problem is not the lead's try
    assert lead.fetch_next_at > timezone.now() + timedelta(
        seconds=settings.META_FETCH_AUTH_RETRY_SECONDS - 5
    )
    alert = Alert.objects.get(subject=alert_subject(meta_source), status=AlertStatus.OPEN)
    assert "page access token" in alert.message
    assert meta_graph.token not in alert.message + str(alert.data) + lead.fetch["note"]

    # Not due yet, and the token unchanged: the sweep sends nothing.
    assert meta_fetch_sweep_due() == 0
    # RevOps sets the new token: the sweep makes the waiting lead due at once.
    meta_source.kind_options = {
        **meta_source.kind_options,
        "page_access_token": meta_graph.new_token(),
    }
    meta_source.save()
    with capture(execute=True):
        assert meta_fetch_sweep_due() == 1
    assert _fetch(lead, capture) == "done"
    assert _process(lead, capture) == LeadStatus.ASSIGNED
    assert lead.email == "ana@acme.de"
    alert.refresh_from_db()
    assert alert.status == AlertStatus.RESOLVED


@pytest.mark.parametrize("code", [4, 17, 613, 80001])
def test_metas_rate_limit_pauses_every_fetch_for_its_estimated_time(
    meta_source, meta_graph, sent, django_capture_on_commit_callbacks, code
):
    capture = django_capture_on_commit_callbacks
    first = _accept(meta_source, meta_graph.add_lead(email="a@acme.de"), capture)
    second = _accept(meta_source, meta_graph.add_lead(email="b@acme.de"), capture)
    _process(first, capture)
    _process(second, capture)
    meta_graph.throttle_next(code=code, minutes=2)
    before = timezone.now()
    assert _fetch(first, capture) == "waiting"
    assert first.fetch_attempts == 0
    assert first.fetch_next_at >= before + timedelta(seconds=119)
    assert "rate limited by Meta" in first.fetch["note"]
    # The other lead does not ask Meta meanwhile: the shared budget is paused.
    calls = len(meta_graph.requests)
    assert _fetch(second, capture) == "waiting"
    assert len(meta_graph.requests) == calls
    assert "rate limit" in second.fetch["note"]


def test_5xx_and_slow_answers_are_retried_with_backoff_then_fetched(
    meta_source, meta_graph, sent, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    lead = _accept(meta_source, meta_graph.add_lead(email="a@acme.de"), capture)
    _process(lead, capture)
    meta_graph.fail_next()
    assert _fetch(lead, capture) == "retry"
    assert lead.fetch_attempts == 1
    assert "unexpected error" in lead.fetch["note"]
    _due(lead)
    meta_graph.slow_next(seconds=1.5)
    assert _fetch(lead, capture) == "retry"
    assert "no answer within" in lead.fetch["note"]
    _due(lead)
    meta_graph.bad_gateway_next()
    assert _fetch(lead, capture) == "retry"
    _due(lead)
    assert _fetch(lead, capture) == "done"
    assert _process(lead, capture) == LeadStatus.ASSIGNED


def test_a_lead_meta_does_not_know_fails_with_a_reason_and_an_operator_retries_it(
    meta_source, meta_graph, sent, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    lead = _accept(meta_source, "1300000000009999", capture)
    _process(lead, capture)
    assert _fetch(lead, capture) == "failed"
    assert lead.status == LeadStatus.FAILED
    assert lead.fetch_status == FetchStatus.FAILED
    assert "does not exist" in lead.last_error
    assert "100/33" in lead.last_error
    failed = Event.objects.get(lead=lead, type=EventType.FAILED)
    assert failed.data["stage"] == "meta_fetch"
    # Not silently dropped, not retried by itself: an operator retries it.
    meta_graph.add_lead("1300000000009999", email="late@acme.de")
    with capture(execute=True):
        assert leads_meta_fetch_retry(lead_ids=[lead.id], actor="user:revops") == 1
    lead.refresh_from_db()
    assert (lead.status, lead.fetch_status, lead.last_error) == (
        LeadStatus.PROCESSING,
        FetchStatus.PENDING,
        "",
    )
    assert sent.ids(FETCH_TASK)[-1] == str(lead.id)
    assert _fetch(lead, capture) == "done"
    assert _process(lead, capture) == LeadStatus.ASSIGNED
    assert lead.email == "late@acme.de"


def test_garbage_past_the_bound_fails_the_lead_with_the_last_reason(
    meta_source, meta_graph, sent, django_capture_on_commit_callbacks, settings
):
    capture = django_capture_on_commit_callbacks
    settings.META_FETCH_MAX_ATTEMPTS = 3
    lead = _accept(meta_source, meta_graph.add_lead(email="a@acme.de"), capture)
    _process(lead, capture)
    meta_graph.garbage_next(10)
    outcomes = []
    for _ in range(3):
        _due(lead)
        outcomes.append(_fetch(lead, capture))
    assert outcomes == ["retry", "retry", "failed"]
    assert lead.status == LeadStatus.FAILED
    assert "not JSON" in lead.last_error
    assert "try 3" in lead.last_error


def test_a_lead_waiting_longer_than_the_bound_fails(
    meta_source, meta_graph, sent, django_capture_on_commit_callbacks, settings
):
    capture = django_capture_on_commit_callbacks
    lead = _accept(meta_source, meta_graph.add_lead(email="a@acme.de"), capture)
    _process(lead, capture)
    long_ago = timezone.now() - timedelta(seconds=settings.META_FETCH_MAX_WAIT_SECONDS + 60)
    Lead.objects.filter(id=lead.id).update(fetch={**lead.fetch, "_since": long_ago.isoformat()})
    assert _fetch(lead, capture) == "failed"
    assert "not fetched from the Graph API within" in lead.last_error


def test_a_token_removed_after_acceptance_waits_with_an_alert(
    meta_source, meta_graph, sent, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    lead = _accept(meta_source, meta_graph.add_lead(email="a@acme.de"), capture)
    _process(lead, capture)
    meta_source.kind_options = {"verify_token": "vt-1", "graph_base_url": meta_graph.url}
    meta_source.save()
    assert _fetch(lead, capture) == "waiting"
    assert "none is set" in lead.fetch["note"]
    assert meta_graph.requests == []
    assert Alert.objects.filter(subject=alert_subject(meta_source), status="open").exists()


def test_a_lead_that_is_a_lead_already_is_not_fetched(
    meta_source, meta_graph, sent, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    with capture(execute=True):
        accepted = lead_ingest(
            source=meta_source,
            record={"id": "77", "field_data": [{"name": "email", "values": ["x@acme.de"]}]},
        )
    lead = Lead.objects.get(id=accepted.lead_id)
    assert _process(lead, capture) == LeadStatus.ASSIGNED
    assert lead.fetch_status == FetchStatus.NONE
    assert meta_graph.requests == []


def test_the_fetch_logs_with_its_lead_and_source(
    meta_source, meta_graph, sent, json_lines, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    lead = _accept(meta_source, "1300000000008888", capture)
    _process(lead, capture)
    assert _fetch(lead, capture) == "failed"
    lines = [line for line in json_lines() if "could not be fetched from Meta" in line["message"]]
    assert len(lines) == 1, json_lines()
    assert (lines[0]["lead_id"], lines[0]["source"]) == (str(lead.id), meta_source.slug)
