"""Real worker processes drain the enrichment queue at the shared rate, retrying failures."""

from __future__ import annotations

import threading
import time

import pytest
from django.db.models import Count
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from leads.models import Lead
from routing.enrichment import enrichment_sweep_due
from routing.enrichment.services import enrichment_enqueue
from tests.routing.enrichment.conftest import parked_lead
from tests.support.processes import celery_worker, wait_until

pytestmark = [
    pytest.mark.worker,
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

RATE_PER_MINUTE = 120  # two a second
BURST = 2
LEADS = 12
FAILING_FIRST = 3


@pytest.fixture
def provider():
    """A threaded local provider: the first calls answer 500, then it enriches."""
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    calls: list[float] = []
    lock = threading.Lock()

    def handle(request: Request) -> Response:
        with lock:
            calls.append(time.time())
            failing = len(calls) <= FAILING_FIRST
        if failing:
            return Response("down", status=500)
        return Response('{"industry": "Retail", "employees": 40}', mimetype="application/json")

    server.expect_request("/enrich", method="POST").respond_with_handler(handle)
    server.start()
    try:
        yield server, calls
    finally:
        server.clear()
        server.stop()


def test_two_worker_processes_enrich_every_lead_within_the_shared_rate(provider):
    server, calls = provider
    env = {
        "ENRICHMENT_HTTP_URL": server.url_for("/enrich"),
        "ENRICHMENT_HTTP_RATE_PER_MINUTE": str(RATE_PER_MINUTE),
        "ENRICHMENT_HTTP_BURST": str(BURST),
        "ENRICHMENT_HTTP_TIMEOUT_SECONDS": "2",
        "ENRICHMENT_HTTP_BACKOFF_SECONDS": "0.5",
        "ENRICHMENT_BREAKER_FAILURES": "10",
    }
    leads = [parked_lead(industry="", employees=None) for _ in range(LEADS)]
    with (
        celery_worker(concurrency=1, queues=["enrichment"], extra_env=env) as one,
        celery_worker(concurrency=1, queues=["enrichment"], extra_env=env) as two,
    ):
        assert enrichment_enqueue([lead.id for lead in leads]) == LEADS

        def all_finished() -> bool:
            enrichment_sweep_due()  # what beat does: retries and waiting leads are re-sent
            return not Lead.objects.filter(enrichment_status="pending").exists()

        wait_until(
            all_finished,
            timeout=120,
            interval=0.5,
            message=lambda: f"leads still pending:\n{one.text()[-3000:]}\n{two.text()[-3000:]}",
        )
    statuses = dict(
        Lead.objects.values_list("enrichment_status").annotate(n=Count("id")).order_by()
    )
    assert statuses == {"done": LEADS}
    assert set(Lead.objects.values_list("industry", "employees")) == {("Retail", 40)}
    retried = Lead.objects.filter(enrichment_attempts__gt=1).count()
    assert retried >= 1  # the 500s were retried, not fatal
    assert len(calls) == LEADS + FAILING_FIRST
    # Both workers took part, and together they kept to the shared budget.
    assert "enrichment.enrich_lead[" in one.text()  # a task line, not the startup list
    assert "enrichment.enrich_lead[" in two.text()
    calls.sort()
    per_second = RATE_PER_MINUTE / 60
    for i, first in enumerate(calls):
        in_window = sum(1 for t in calls[i:] if t < first + 1.0)
        assert in_window <= BURST + per_second + 1, (in_window, calls)
    assert calls[-1] - calls[0] >= (len(calls) - BURST) / per_second - 1.5


BATCH_RATE_PER_MINUTE = 600  # ten a second
BATCH_BURST = 4
BATCH_LEADS = 40
BATCH_CONCURRENCY = 8


@pytest.fixture
def slow_provider():
    """A threaded local provider answering after 200 ms, counting the calls it serves at once."""
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    calls: list[float] = []
    state = {"in_flight": 0, "max_in_flight": 0}
    lock = threading.Lock()

    def handle(request: Request) -> Response:
        with lock:
            calls.append(time.time())
            state["in_flight"] += 1
            state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        try:
            time.sleep(0.2)
            return Response('{"industry": "Retail"}', mimetype="application/json")
        finally:
            with lock:
                state["in_flight"] -= 1

    server.expect_request("/enrich", method="POST").respond_with_handler(handle)
    server.start()
    try:
        yield server, calls, state
    finally:
        server.clear()
        server.stop()


def test_two_worker_processes_batch_their_calls_and_never_exceed_the_shared_rate(slow_provider):
    """Two plain prefork processes (concurrency 1), each task a batch with calls in flight
    together: the calls overlap, and in any second no more went out than the bucket allows."""
    server, calls, state = slow_provider
    env = {
        "ENRICHMENT_HTTP_URL": server.url_for("/enrich"),
        "ENRICHMENT_HTTP_RATE_PER_MINUTE": str(BATCH_RATE_PER_MINUTE),
        "ENRICHMENT_HTTP_BURST": str(BATCH_BURST),
        "ENRICHMENT_HTTP_TIMEOUT_SECONDS": "2",
        "ENRICHMENT_HTTP_CONCURRENCY": str(BATCH_CONCURRENCY),
        "ENRICHMENT_BATCH_SIZE": "16",
    }
    leads = [parked_lead(industry="") for _ in range(BATCH_LEADS)]
    with (
        celery_worker(concurrency=1, queues=["enrichment"], extra_env=env, name="a") as one,
        celery_worker(concurrency=1, queues=["enrichment"], extra_env=env, name="b") as two,
    ):
        assert enrichment_enqueue([lead.id for lead in leads]) == BATCH_LEADS

        def all_finished() -> bool:
            enrichment_sweep_due()  # what beat does: leads that waited for a token are re-sent
            return not Lead.objects.filter(enrichment_status="pending").exists()

        wait_until(
            all_finished,
            timeout=120,
            interval=0.5,
            message=lambda: f"leads still pending:\n{one.text()[-3000:]}\n{two.text()[-3000:]}",
        )
    assert Lead.objects.filter(enrichment_status="done", industry="Retail").count() == BATCH_LEADS
    assert len(calls) == BATCH_LEADS  # every lead called once: no double claim across processes
    assert 1 < state["max_in_flight"] <= 2 * BATCH_CONCURRENCY
    calls.sort()
    per_second = BATCH_RATE_PER_MINUTE / 60
    for i, first in enumerate(calls):
        in_window = sum(1 for t in calls[i:] if t < first + 1.0)
        # The bucket allows burst + rate x 1 s; one more for the time a call takes to arrive.
        assert in_window <= BATCH_BURST + per_second + 1, (in_window, calls)
    assert calls[-1] - calls[0] >= (len(calls) - BATCH_BURST) / per_second - 1.0
