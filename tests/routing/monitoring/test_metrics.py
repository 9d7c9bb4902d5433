"""/metrics: Prometheus text whose values agree with the database; token or network access."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from audit.models import EventType
from audit.services import event_record
from leads.models import Lead, LeadStatus
from routing.monitoring.metrics import COLLECTOR
from tests.leads.factories import LeadFactory, SourceFactory
from tests.routing.factories import AssignmentFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_metrics() -> Iterator[None]:
    COLLECTOR.clear()
    yield
    COLLECTOR.clear()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as (name, sorted labels) -> value; parsing fails on invalid text."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def scrape(client: Client, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return samples(response.content.decode())


def test_processed_is_a_counter_that_never_goes_down(client: Client, settings: Any) -> None:
    """It was the leads' current status: re-routing an unassigned lead made it go down (1 -> 0),
    which Prometheus reads as a counter reset."""
    from routing.services import lead_process, lead_reroute

    settings.ENQUEUE_IN_BACKGROUND = False
    lead = LeadFactory()
    lead_process(lead_id=lead.id)  # no ruleset: unassigned

    def processed(status: str) -> float:
        COLLECTOR.clear()
        got = scrape(client)
        return got[("leadrouter_leads_processed_total", (("status", status),))]

    assert processed("unassigned") == 1
    lead_reroute(lead_id=lead.id, actor="user:m")
    lead_process(lead_id=lead.id)
    assert processed("unassigned") == 2


def test_values_agree_with_the_database(client: Client) -> None:
    now = timezone.now()
    web = SourceFactory(slug="webinar")
    form = SourceFactory(slug="form")
    for _ in range(3):
        assigned = LeadFactory(source=web, status=LeadStatus.ASSIGNED)
        event_record(type=EventType.ASSIGNED, lead=assigned, data={"kind": "initial"})
    unassigned = LeadFactory(source=form, status=LeadStatus.UNASSIGNED)
    event_record(type=EventType.UNASSIGNED, lead=unassigned)
    LeadFactory(source=form, status=LeadStatus.RECEIVED, received_at=now - timedelta(seconds=90))
    LeadFactory(source=form, status=LeadStatus.RECEIVED, received_at=now - timedelta(seconds=30))
    # Time to assign: 0.2 s, 4 s and 45 s.
    for lead, delay in zip(Lead.objects.filter(source=web), (0.2, 4, 45), strict=True):
        AssignmentFactory(lead=lead, assigned_at=lead.received_at + timedelta(seconds=delay))
    lead = Lead.objects.filter(source=web).first()
    assert lead is not None
    for _ in range(2):
        event_record(type=EventType.SLA_BREACHED, lead=lead)
    event_record(type=EventType.DELIVERY_FAILED, lead=lead)

    got = scrape(client)
    assert got[("leadrouter_leads_received_total", (("source", "webinar"),))] == 3
    assert got[("leadrouter_leads_received_total", (("source", "form"),))] == 3
    assert got[("leadrouter_leads_processed_total", (("status", "assigned"),))] == 3
    assert got[("leadrouter_leads_processed_total", (("status", "unassigned"),))] == 1
    assert ("leadrouter_leads_processed_total", (("status", "received"),)) not in got
    assert got[("leadrouter_backlog_leads", ())] == 2
    assert got[("leadrouter_backlog_oldest_seconds", ())] == pytest.approx(90, abs=5)
    assert got[("leadrouter_sla_breaches_total", ())] == 2
    assert got[("leadrouter_delivery_failures_total", ())] == 1
    bucket = "leadrouter_time_to_assign_seconds_bucket"
    assert got[(bucket, (("le", "0.5"),))] == 1
    assert got[(bucket, (("le", "5.0"),))] == 2
    assert got[(bucket, (("le", "30.0"),))] == 2
    assert got[(bucket, (("le", "60.0"),))] == 3
    assert got[(bucket, (("le", "+Inf"),))] == 3
    assert got[("leadrouter_time_to_assign_seconds_count", ())] == 3
    assert got[("leadrouter_time_to_assign_seconds_sum", ())] == pytest.approx(49.2, abs=0.01)


def test_values_are_cached_for_a_few_seconds_then_refreshed(client: Client, settings: Any) -> None:
    settings.METRICS_CACHE_SECONDS = 60
    LeadFactory()
    assert scrape(client)[("leadrouter_backlog_leads", ())] == 1
    LeadFactory()
    assert scrape(client)[("leadrouter_backlog_leads", ())] == 1
    settings.METRICS_CACHE_SECONDS = 0
    assert scrape(client)[("leadrouter_backlog_leads", ())] == 2


def test_a_token_or_an_allowed_network_is_required(client: Client, settings: Any) -> None:
    settings.METRICS_ALLOWED_NETWORKS = []
    settings.METRICS_TOKEN = ""
    response = client.get("/metrics")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"

    settings.METRICS_TOKEN = "s3cret-token"
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert response["WWW-Authenticate"].startswith("Bearer")
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope")
    assert wrong.status_code == 401
    scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-token")

    settings.METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.1").status_code == 401
    # A wrong token is refused even from an allowed network.
    assert (
        client.get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer x").status_code
        == 401
    )


def test_post_is_refused_as_json(client: Client) -> None:
    response = client.post("/metrics")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_the_grafana_dashboard_uses_only_series_that_metrics_serves(client: Client) -> None:
    import json
    import re
    from pathlib import Path

    dashboard = json.loads(
        (Path(__file__).resolve().parents[3] / "docs" / "grafana-dashboard.json").read_text()
    )
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"leadrouter_[a-z_]+", target["expr"])
    }
    from routing.models import QueueHeartbeat
    from routing.monitoring.backlog import backlog_check

    LeadFactory()
    QueueHeartbeat.objects.create(queue="routing", last_seen_at=timezone.now())
    backlog_check()  # caches the broker queue lengths /metrics shows
    served = {name for name, _labels in scrape(client)}
    assert used
    assert used <= served, used - served


def test_the_prometheus_alert_rules_use_only_series_that_metrics_serves(client: Client) -> None:
    import re
    from pathlib import Path

    import yaml

    from routing.models import QueueHeartbeat

    rules = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "docs" / "prometheus-alerts.yml").read_text()
    )
    exprs = {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}
    assert {"LeadRouterDown", "LeadRouterQueueNotDrained", "LeadRouterBacklog"} <= set(exprs)
    assert "> 180" in exprs["LeadRouterQueueNotDrained"]
    used = {name for expr in exprs.values() for name in re.findall(r"leadrouter_[a-z_]+", expr)}
    QueueHeartbeat.objects.create(queue="routing", last_seen_at=timezone.now())
    served = {name for name, _labels in scrape(client)}
    assert used
    assert used <= served, used - served


def test_a_non_ascii_token_is_refused_not_a_500(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = "s3cret"
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer zoë")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


def test_mail_has_a_timeout(settings: Any) -> None:
    from django.conf import settings as live

    assert 0 < live.EMAIL_TIMEOUT <= 30


def test_backlog_oldest_counts_from_when_a_retried_lead_was_queued_again(client: Client) -> None:
    from routing.services import lead_reroute

    now = timezone.now()
    lead = LeadFactory(status=LeadStatus.UNASSIGNED, received_at=now - timedelta(hours=2))
    lead_reroute(lead_id=lead.id, actor="system")
    got = scrape(client)
    assert got[("leadrouter_backlog_leads", ())] == 1
    assert got[("leadrouter_backlog_oldest_seconds", ())] < 60


def test_behind_a_proxy_the_loopback_allowlist_is_not_trusted(
    client: Client, settings: Any
) -> None:
    """A same-host reverse proxy makes every request, from anywhere, come from 127.0.0.1: the
    default loopback allowlist served /metrics to the whole internet."""
    settings.METRICS_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    settings.BEHIND_TLS_PROXY = True
    settings.METRICS_TOKEN = ""
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 403
    assert "METRICS_TOKEN" in response.json()["error"]["message"]
    settings.METRICS_TOKEN = "s3cret-token"
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 401
    scrape(client, REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer s3cret-token")
    settings.BEHIND_TLS_PROXY = False
    settings.METRICS_TOKEN = ""
    scrape(client, REMOTE_ADDR="127.0.0.1")


def test_each_lane_has_its_backlog_and_oldest_wait(client: Client) -> None:
    now = timezone.now()
    LeadFactory(lane="bulk", received_at=now - timedelta(seconds=120))
    LeadFactory(lane="bulk", received_at=now - timedelta(seconds=10))
    LeadFactory(lane="realtime", received_at=now - timedelta(seconds=5))
    LeadFactory(lane="realtime", status=LeadStatus.ASSIGNED, received_at=now - timedelta(hours=1))
    got = scrape(client)
    assert got[("leadrouter_lane_backlog_leads", (("lane", "bulk"),))] == 2
    assert got[("leadrouter_lane_backlog_leads", (("lane", "realtime"),))] == 1
    assert got[("leadrouter_lane_backlog_leads", (("lane", "normal"),))] == 0
    oldest = "leadrouter_lane_backlog_oldest_seconds"
    assert got[(oldest, (("lane", "bulk"),))] == pytest.approx(120, abs=5)
    assert got[(oldest, (("lane", "realtime"),))] == pytest.approx(5, abs=5)
    assert got[(oldest, (("lane", "normal"),))] == 0
