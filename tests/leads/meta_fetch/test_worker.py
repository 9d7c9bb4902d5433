"""Real worker processes on PostgreSQL and Redis with the Meta fetch stage, against the Graph
stand-in over HTTPS: leadgen notifications posted to the kickoff are accepted, fetched by a worker
on the ``enrichment`` queue and routed by one on ``routing``; then the Graph API unreachable,
slow, rate limiting (codes 4, 17, 32, 613) and refusing an expired token (190), then back. What
beat does (the fetch sweeper) the test does itself, on a short loop, so that the timing is the
test's."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from django.db.models import Count
from django.test import Client

from audit.models import Event, EventType
from leads.models import FetchStatus, Lead, LeadStatus, Source
from routing.fetch.meta import alert_subject, meta_fetch_sweep_due
from routing.models import Assignment
from routing.monitoring.models import Alert, AlertStatus
from tests.leads.factories import SourceFactory
from tests.leads.meta_fetch.conftest import notification
from tests.routing.factories import RepFactory, published_ruleset, team_with
from tests.support.meta_graph import MetaGraphStandIn, meta_graph_tls
from tests.support.processes import ManagedProcess, celery_worker, wait_until

__all__ = ["meta_graph_tls"]

pytestmark = [
    pytest.mark.worker,
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

# Every lane's routing and enrichment queues (leads.lanes): a notification with several leads is
# a batch (the bulk lane), one with a single lead a form fill (realtime).
QUEUES = [
    "routing.realtime",
    "enrichment.realtime",
    "routing",
    "enrichment",
    "routing.bulk",
]
SLUG = "meta-ads"


@pytest.fixture
def source(meta_graph_tls: MetaGraphStandIn, settings: Any) -> Source:
    """A Meta source with the stand-in's token and address, and rules that route everyone."""
    # The sweeper runs here (as beat would): its batch is spread over its interval.
    settings.META_FETCH_SWEEP_INTERVAL_SECONDS = 1.0
    settings.META_GRAPH_RATE_PER_MINUTE = 600
    team = team_with([RepFactory(email="ana@example.com"), RepFactory(email="ben@example.com")])
    published_ruleset({"name": "Everyone", "action": {"type": "team", "team": team.name}})
    return SourceFactory(
        slug=SLUG,
        kind="meta_lead_ads",
        kind_options={
            "verify_token": "vt-1",
            "page_access_token": meta_graph_tls.token,
            "graph_base_url": meta_graph_tls.url,
        },
    )


def _env(graph: MetaGraphStandIn, **extra: str) -> dict[str, str]:
    return {
        "META_GRAPH_CA_BUNDLE": graph.ca_file,
        "META_GRAPH_TIMEOUT_SECONDS": "1",
        "META_GRAPH_RATE_PER_MINUTE": "600",
        "META_FETCH_BACKOFF_SECONDS": "0.5",
        "META_FETCH_AUTH_RETRY_SECONDS": "2",
        "META_BREAKER_FAILURES": "3",
        "META_BREAKER_COOLDOWN_SECONDS": "2",
        "META_FETCH_MAX_ATTEMPTS": "30",
        **extra,
    }


def _notify(client: Client, graph: MetaGraphStandIn, n: int, tag: str) -> list[str]:
    """``n`` new leads on the stand-in, announced in one leadgen notification to the kickoff."""
    ids = [
        graph.add_lead(
            work_email=f"{tag}{i}@brandt-{tag}{i}.de",
            full_name=f"Jana {tag.title()}{i}",
            company_name="Brandt Spedition GmbH",
        )
        for i in range(n)
    ]
    response = client.post(
        f"/api/v1/intake/{SLUG}/",
        json.dumps(notification(*ids)),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer token-{SLUG}",
    )
    assert response.status_code == 202, response.content
    return ids


def _states() -> dict[tuple[str, str], int]:
    rows = Lead.objects.values_list("status", "fetch_status").annotate(n=Count("id")).order_by()
    return {(status, fetch): n for status, fetch, n in rows}


def _all_assigned(total: int) -> bool:
    meta_fetch_sweep_due()  # what beat runs every META_FETCH_SWEEP_INTERVAL_SECONDS
    return Lead.objects.filter(status=LeadStatus.ASSIGNED).count() == total


def _routed_or_visibly_waiting() -> list[str]:
    """The leads that are neither routed nor waiting for their fetch with a note saying why."""
    wrong = []
    for lead in Lead.objects.all():
        if lead.status == LeadStatus.ASSIGNED:
            continue
        fetch = lead.fetch if isinstance(lead.fetch, dict) else {}
        waiting = (
            lead.status in (LeadStatus.RECEIVED, LeadStatus.PROCESSING)
            and lead.fetch_status in (FetchStatus.NONE, FetchStatus.PENDING, FetchStatus.DONE)
            and (lead.fetch_status != FetchStatus.PENDING or bool(fetch.get("note")))
        )
        if not waiting:
            wrong.append(f"{lead.pk} {lead.status} {lead.fetch_status} {lead.last_error} {fetch}")
    return wrong


def _output(worker: ManagedProcess) -> str:
    return worker.text()[-4000:]


def test_notified_leads_are_fetched_by_a_worker_and_routed(source, meta_graph_tls):
    graph = meta_graph_tls
    client = Client()
    with celery_worker(concurrency=2, queues=QUEUES, extra_env=_env(graph)) as worker:
        first = _notify(client, graph, 3, "one")
        second = _notify(client, graph, 1, "two")
        wait_until(
            lambda: _all_assigned(4),
            timeout=90,
            interval=0.5,
            message=lambda: f"{_states()} {_output(worker)}",
        )
    assert Lead.objects.count() == 4
    for leadgen_id in [*first, *second]:
        lead = Lead.objects.get(idempotency_key=leadgen_id)
        assert lead.fetch_status == FetchStatus.DONE
        assert lead.email.endswith(".de")
        assert lead.company == "Brandt Spedition GmbH"
        assert lead.raw_payload["entry"][0]["changes"][0]["value"]["leadgen_id"] == leadgen_id
        types = list(Event.objects.filter(lead=lead).order_by("seq").values_list("type", flat=True))
        assert types.count(EventType.ENRICHED) == 1
        assert types[-1] == EventType.ASSIGNED
    assert Assignment.objects.filter(active=True).count() == 4
    fetched = Counter(r.path.rsplit("/", 1)[-1] for r in graph.requests if r.status == 200)
    assert set(fetched) == {*first, *second}
    assert all(r.token_ok for r in graph.requests)


def test_the_graph_down_slow_throttling_and_an_expired_token_then_back_lose_nothing(
    source, meta_graph_tls
):
    graph = meta_graph_tls
    client = Client()
    posted: list[str] = []
    with celery_worker(concurrency=2, queues=QUEUES, extra_env=_env(graph)) as worker:
        # Down: connections refused. The leads wait, none is failed, the breaker opens.
        graph.down()
        posted += _notify(client, graph, 3, "down")

        def each_tried_and_the_breaker_open() -> bool:
            meta_fetch_sweep_due()
            tried = Lead.objects.filter(fetch_status=FetchStatus.PENDING, fetch__has_key="note")
            return tried.count() == 3 and "breaker opened" in worker.text()

        wait_until(
            each_tried_and_the_breaker_open,
            timeout=60,
            interval=0.5,
            message=lambda: (
                f"{list(Lead.objects.values_list('fetch', flat=True))} {_output(worker)}"
            ),
        )
        assert _routed_or_visibly_waiting() == []
        assert not Lead.objects.filter(status=LeadStatus.ASSIGNED).exists()

        # Back, but slow (past the timeout), then rate limiting with each of Meta's codes.
        graph.up()
        graph.slow_next(2, seconds=1.5)
        for code in (4, 17, 32, 613):
            graph.throttle_next(code=code, minutes=0)
        posted += _notify(client, graph, 2, "slow")
        violations: list[str] = []

        def routed_meanwhile_every_other_waiting() -> bool:
            violations.extend(_routed_or_visibly_waiting())
            return _all_assigned(5)

        wait_until(
            routed_meanwhile_every_other_waiting,
            timeout=120,
            interval=0.5,
            message=lambda: f"{_states()} {violations[-5:]} {_output(worker)}",
        )
        assert violations == []
        assert {4, 17, 32, 613} <= set(graph.error_codes)  # each throttle was answered

        # The token expires: new leads wait for a new one, one alert says so.
        graph.expire_token()
        posted += _notify(client, graph, 2, "expired")
        wait_until(
            lambda: (
                meta_fetch_sweep_due(),
                Alert.objects.filter(
                    subject=alert_subject(source), status=AlertStatus.OPEN
                ).exists(),
            )[1],
            timeout=60,
            interval=0.5,
            message=lambda: _output(worker),
        )
        waiting = Lead.objects.exclude(status=LeadStatus.ASSIGNED)
        assert waiting.count() == 2
        assert _routed_or_visibly_waiting() == []
        wait_until(
            lambda: all(
                "page access token" in str((lead.fetch or {}).get("note"))
                for lead in Lead.objects.exclude(status=LeadStatus.ASSIGNED)
            ),
            timeout=30,
            interval=0.5,
            message=lambda: str(list(waiting.values_list("fetch", flat=True))),
        )

        # RevOps sets a new token: the waiting leads are fetched and routed, the alert resolves.
        source.kind_options = {**source.kind_options, "page_access_token": graph.new_token()}
        source.save()
        wait_until(
            lambda: _all_assigned(7),
            timeout=90,
            interval=0.5,
            message=lambda: f"{_states()} {_output(worker)}",
        )
    assert 190 in graph.error_codes
    alerts = list(Alert.objects.filter(subject=alert_subject(source)).values_list("status"))
    assert alerts == [(AlertStatus.RESOLVED,)], alerts
    # Nothing lost, nothing twice: one lead per leadgen id, each fetched and assigned once.
    assert sorted(Lead.objects.values_list("idempotency_key", flat=True)) == sorted(posted)
    assert Assignment.objects.count() == len(posted)
    assert not Lead.objects.exclude(fetch_status=FetchStatus.DONE).exists()
    enriched = Counter(
        Event.objects.filter(type=EventType.ENRICHED).values_list("lead_id", flat=True)
    )
    assert set(enriched.values()) == {1}
    assert len(enriched) == len(posted)
    tokens = json.dumps(list(Lead.objects.values_list("fetch", flat=True)))
    tokens += json.dumps(list(Alert.objects.values_list("message", "data")))
    assert graph.token not in tokens
