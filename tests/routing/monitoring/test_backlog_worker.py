"""Real processes: a stopped worker ends in one backlog alert; a draining worker clears it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Count, Max
from django.test import Client
from django.utils import timezone
from pytest_httpserver import HTTPServer

from audit.models import Event, EventType
from config.celery import app as celery_app
from leads.models import Lead, LeadStatus
from leads.services import broker_breaker, lead_ingest
from routing.models import Assignment
from routing.monitoring.backlog import backlog_check, backlog_measure
from routing.monitoring.counters import counters_refresh
from routing.monitoring.metrics import COLLECTOR
from routing.monitoring.models import Alert, AlertKind, AlertStatus, MetricsState
from tests.leads.factories import SourceFactory
from tests.routing.factories import make_rep, published_ruleset, team_with
from tests.routing.monitoring.conftest import hook_bodies
from tests.routing.monitoring.test_metrics import scrape
from tests.support.processes import celery_worker, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _drained() -> bool:
    report = backlog_measure()
    waiting = Lead.objects.filter(status__in=(LeadStatus.RECEIVED, LeadStatus.PROCESSING))
    return not waiting.exists() and not any(report.queue_lengths.values())


def test_a_stopped_worker_opens_one_backlog_alert_and_a_draining_worker_resolves_it(
    settings: Any, alert_hook: HTTPServer
) -> None:
    broker_breaker.reset()
    # Messages earlier tests left in the shared broker (a beat test's maintenance.check_backlog)
    # would have the worker run the check itself and resolve the alert out of this test's sight.
    celery_app.control.purge()
    settings.BACKLOG_ALERT_DEPTH = 10
    team = team_with([make_rep(), make_rep()])
    published_ruleset({"name": "all", "action": {"type": "team", "team": team.name}})
    source = SourceFactory(slug="webinar")
    # Leads keep arriving while no worker runs: they wait in `received` and in the queue.
    for i in range(25):
        lead_ingest(source=source, record={"email": f"visitor{i}@example.com"})
    first = backlog_check()
    second = backlog_check()
    assert first.received == 25
    assert second.problems, "the backlog was not noticed"
    assert any("25 leads waiting" in problem for problem in second.problems)
    backlog = Alert.objects.filter(kind=AlertKind.BACKLOG)
    assert backlog.count() == 1
    assert backlog.get().status == AlertStatus.OPEN
    assert len(hook_bodies(alert_hook)) == 1

    settle = timedelta(seconds=settings.METRICS_SETTLE_SECONDS)
    with celery_worker(concurrency=2) as worker:
        # The counters' marks are refreshed while two worker processes write events and
        # assignments: observations taken mid-burst, settled later by a moved clock.
        def refreshed_while_draining() -> bool:
            counters_refresh()
            return _drained()

        wait_until(
            refreshed_while_draining,
            timeout=120,
            message=lambda: f"the worker did not drain:\n{worker.text()[-4000:]}",
        )
    report = backlog_check()
    assert report.received == 0
    assert not report.problems
    alert = backlog.get()
    assert alert.status == AlertStatus.RESOLVED
    texts = [body["text"] for body in hook_bodies(alert_hook)]
    assert len(texts) == 2
    assert "resolved" in texts[1]
    assert Lead.objects.filter(status=LeadStatus.ASSIGNED).count() == 25

    # Move the clock past the settle period (twice: the last observation settles too), so the
    # marks move past every row the workers wrote and the totals come from the stored state.
    later = timezone.now() + settle + timedelta(seconds=1)
    counters_refresh(now=later)
    counters_refresh(now=later + settle + timedelta(seconds=1))
    state = MetricsState.objects.get().data
    assert state["events_upto"] == Event.objects.aggregate(m=Max("id"))["m"]
    assert state["assignments_upto"] == Assignment.objects.aggregate(m=Max("id"))["m"]
    assert state["totals"]["assign_count"] == 25
    # /metrics, computed from the database, agrees with what the worker processes wrote.
    COLLECTOR.clear()
    got = scrape(Client())
    assert got[("leadrouter_leads_received_total", (("source", "webinar"),))] == 25
    assert got[("leadrouter_leads_processed_total", (("status", "assigned"),))] == 25
    assert got[("leadrouter_backlog_leads", ())] == 0
    assert got[("leadrouter_time_to_assign_seconds_count", ())] == 25
    assert got[("leadrouter_time_to_assign_seconds_bucket", (("le", "+Inf"),))] == 25
    waited = sum(
        (a.assigned_at - a.lead.received_at).total_seconds()
        for a in Assignment.objects.select_related("lead")
    )
    assert got[("leadrouter_time_to_assign_seconds_sum", ())] == pytest.approx(waited, rel=1e-3)
    assert got[("leadrouter_alerts_open", (("kind", "backlog"),))] == 0
    # Every counter equals COUNT(*) over the database.
    events = Event.objects.values("type").annotate(n=Count("id"))
    by_type = {row["type"]: row["n"] for row in events}
    assert got[("leadrouter_leads_received_total", (("source", "webinar"),))] == (
        Lead.objects.filter(source=source).count()
    )
    assert got[("leadrouter_leads_processed_total", (("status", "assigned"),))] == by_type.get(
        EventType.ASSIGNED, 0
    )
    assert got[("leadrouter_reassignments_total", ())] == by_type.get(EventType.REASSIGNED, 0)
    assert got[("leadrouter_sla_breaches_total", ())] == by_type.get(EventType.SLA_BREACHED, 0)
    assert got[("leadrouter_time_to_assign_seconds_count", ())] == Assignment.objects.count()
