"""Leads waiting long for their Meta fetch open an alert: an outage of the Graph API (or a
certificate nobody trusts) must not leave leads waiting unseen until their bound fails them.
A token problem has its own alert per source and is not counted twice."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from leads.models import Lead, Source
from leads.services import lead_ingest
from routing.fetch.meta import WAITING_SUBJECT, lead_meta_fetch, meta_fetch_waiting_check
from routing.monitoring.backlog import backlog_check
from routing.monitoring.models import Alert, AlertStatus
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


def _try(lead: Lead, capture: Any) -> str | None:
    Lead.objects.filter(id=lead.id).update(fetch_next_at=timezone.now())
    with capture(execute=True):
        return lead_meta_fetch(lead_id=lead.id)


def _age(lead: Lead, seconds: float) -> None:
    Lead.objects.filter(id=lead.id).update(received_at=timezone.now() - timedelta(seconds=seconds))


def _open() -> list[Alert]:
    return list(Alert.objects.filter(subject=WAITING_SUBJECT, status=AlertStatus.OPEN))


def test_leads_waiting_past_the_threshold_open_an_alert_that_resolves_once_fetched(
    meta_source, meta_graph: MetaGraphStandIn, sent, settings, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    settings.META_FETCH_ALERT_AFTER_SECONDS = 600
    lead = _parked(meta_source, meta_graph.add_lead(email="a@acme.de"), capture)
    meta_graph.fail_next(2)  # two tries fail, the third is answered
    assert _try(lead, capture) == "retry"
    assert meta_fetch_waiting_check() == 0  # young: no alert yet
    assert _open() == []
    _age(lead, 700)
    assert meta_fetch_waiting_check() == 1
    (alert,) = _open()
    assert alert.kind == "enrichment"
    assert "1 Meta Lead Ads lead" in alert.message
    assert "unexpected error" in alert.message  # the last try's note says why
    assert meta_graph.token not in alert.message + str(alert.data)
    # Still waiting: the same alert, refreshed, not a second one.
    assert _try(lead, capture) == "retry"
    backlog_check()  # beat's backlog check runs it
    assert len(_open()) == 1
    assert _try(lead, capture) == "done"
    assert meta_fetch_waiting_check() == 0
    alert.refresh_from_db()
    assert alert.status == AlertStatus.RESOLVED


def test_a_lead_waiting_for_a_new_token_is_the_token_alerts_not_this_one(
    meta_source, meta_graph: MetaGraphStandIn, sent, settings, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    settings.META_FETCH_ALERT_AFTER_SECONDS = 600
    lead = _parked(meta_source, meta_graph.add_lead(email="a@acme.de"), capture)
    meta_graph.expire_token()
    assert _try(lead, capture) == "waiting"
    _age(lead, 700)
    assert meta_fetch_waiting_check() == 0
    assert _open() == []
