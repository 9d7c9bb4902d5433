"""The I/O worker (Procfile ``io``): one process, a threads pool, many outside calls in flight.

Real ``celery -A config worker --pool threads`` processes on PostgreSQL and Redis, and a local
enrichment provider that counts the calls it is serving at once. What must hold with many calls
in flight per process: the calls really overlap (a prefork worker of concurrency 1, the negative
control, never has two); the vendor's rate limit is per vendor, not per thread; and a worker
killed with calls in flight loses no lead and applies no outcome twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db.models import Count

from audit.models import Event, EventType
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
    pytest.mark.reliability,
    pytest.mark.django_db(transaction=True),
]


class Provider:
    """A threaded enrichment provider on loopback: answers each POST after ``delay`` seconds
    (or, while ``hold`` is cleared, once it is set), counting the calls in flight."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.hold = threading.Event()
        self.hold.set()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.starts: list[float] = []
        self.emails: Counter[str] = Counter()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)))
                with provider.lock:
                    provider.in_flight += 1
                    provider.max_in_flight = max(provider.max_in_flight, provider.in_flight)
                    provider.starts.append(time.time())
                    provider.emails[str(body.get("email"))] += 1
                try:
                    provider.hold.wait(60)
                    time.sleep(provider.delay)
                    answer = json.dumps({"industry": "Retail", "employees": 40}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the caller is gone (the killed worker): nothing to answer
                finally:
                    with provider.lock:
                        provider.in_flight -= 1

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/enrich"

    def close(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def provider() -> Iterator[Provider]:
    made = Provider()
    try:
        yield made
    finally:
        made.close()


def _env(provider: Provider, **extra: str) -> dict[str, str]:
    return {
        "ENRICHMENT_HTTP_URL": provider.url,
        "ENRICHMENT_HTTP_RATE_PER_MINUTE": "60000",
        "ENRICHMENT_HTTP_BURST": "100",
        "ENRICHMENT_HTTP_TIMEOUT_SECONDS": "5",
        "ENRICHMENT_BREAKER_FAILURES": "50",
        **extra,
    }


def _finish_all(timeout: float, *workers: object) -> None:
    def all_finished() -> bool:
        enrichment_sweep_due()  # what beat does: waiting, retried and lost tries are re-sent
        return not Lead.objects.filter(enrichment_status="pending").exists()

    wait_until(
        all_finished,
        timeout=timeout,
        interval=0.5,
        message=lambda: "leads still pending:\n" + "\n".join(w.text()[-3000:] for w in workers),  # type: ignore[attr-defined]
    )


def _enriched_events_per_lead() -> Counter[str]:
    rows = Event.objects.filter(type=EventType.ENRICHED).values_list("lead_id", flat=True)
    return Counter(str(lead_id) for lead_id in rows)


@pytest.mark.parametrize(
    ("pool", "concurrency", "leads", "batch"),
    [("threads", 12, 24, 1), ("prefork", 1, 24, 32), ("prefork", 1, 4, 1)],
    ids=["io-worker-threads", "prefork-1-batches", "negative-control-prefork-1-no-batch"],
)
def test_one_io_worker_process_has_many_calls_in_flight(provider, pool, concurrency, leads, batch):
    provider.delay = 0.5
    parked = [
        parked_lead(industry="", employees=None, email=f"p{i}@acme.com") for i in range(leads)
    ]
    env = _env(provider, ENRICHMENT_BATCH_SIZE=str(batch), ENRICHMENT_HTTP_CONCURRENCY="12")
    with celery_worker(
        concurrency=concurrency, queues=["enrichment"], pool=pool, extra_env=env
    ) as worker:
        started = time.monotonic()
        assert enrichment_enqueue([lead.id for lead in parked]) == leads
        _finish_all(120, worker)
        took = time.monotonic() - started
    statuses = dict(
        Lead.objects.values_list("enrichment_status").annotate(n=Count("id")).order_by()
    )
    assert statuses == {"done": leads}
    assert set(Lead.objects.values_list("industry", "employees")) == {("Retail", 40)}
    assert sum(provider.emails.values()) == leads  # one call per lead, none repeated
    assert set(_enriched_events_per_lead().values()) == {1}
    print(f"{pool} x{concurrency}: {leads} leads in {took:.1f} s, {provider.max_in_flight} at once")
    if pool == "threads" or batch > 1:
        # Twelve threads of one process, or one task's batch with twelve calls at once, half a
        # second an answer: far more than one call at once (not all twelve: on a loaded machine
        # the first messages may be taken one by one).
        assert provider.max_in_flight >= 6, provider.max_in_flight
        assert provider.max_in_flight <= 12, provider.max_in_flight
        assert took < leads * provider.delay / 2, took
    else:
        assert provider.max_in_flight == 1  # what batches replace: one call a process


RATE_PER_MINUTE = 120  # two a second
BURST = 2


def test_the_vendor_rate_limit_holds_with_many_calls_in_flight(provider):
    """Sixteen threads in each of two I/O worker processes, 14 leads at once: the shared bucket
    lets no more than burst + rate calls reach the vendor in any second."""
    provider.delay = 0.05
    leads = 14
    env = _env(
        provider,
        ENRICHMENT_HTTP_RATE_PER_MINUTE=str(RATE_PER_MINUTE),
        ENRICHMENT_HTTP_BURST=str(BURST),
    )
    parked = [
        parked_lead(industry="", employees=None, email=f"p{i}@acme.com") for i in range(leads)
    ]
    with (
        celery_worker(
            concurrency=16, queues=["enrichment"], pool="threads", extra_env=env, name="a"
        ) as one,
        celery_worker(
            concurrency=16, queues=["enrichment"], pool="threads", extra_env=env, name="b"
        ) as two,
    ):
        assert enrichment_enqueue([lead.id for lead in parked]) == leads
        _finish_all(120, one, two)
    assert Lead.objects.filter(enrichment_status="done").count() == leads
    assert sum(provider.emails.values()) == leads
    calls = sorted(provider.starts)
    per_second = RATE_PER_MINUTE / 60
    for i, first in enumerate(calls):
        in_window = sum(1 for t in calls[i:] if t < first + 1.0)
        assert in_window <= BURST + per_second + 1, (in_window, calls)
    assert calls[-1] - calls[0] >= (len(calls) - BURST) / per_second - 1.5


def test_an_io_worker_killed_with_calls_in_flight_loses_no_lead_and_applies_none_twice(provider):
    """SIGKILL of the whole I/O worker while ten calls wait on the provider: nothing of those
    tries is written; once their claims expire (ENRICHMENT_LEASE_SECONDS) the sweeper re-sends
    them, a new worker finishes each lead once, and each try counts as an attempt."""
    leads = 10
    env = _env(provider, ENRICHMENT_LEASE_SECONDS="4")
    parked = [
        parked_lead(industry="", employees=None, email=f"p{i}@acme.com") for i in range(leads)
    ]
    provider.hold.clear()  # every call waits until the worker is dead
    with celery_worker(
        concurrency=leads, queues=["enrichment"], pool="threads", extra_env=env, name="doomed"
    ) as doomed:
        assert enrichment_enqueue([lead.id for lead in parked]) == leads
        wait_until(
            lambda: provider.in_flight == leads,
            timeout=60,
            message=lambda: f"only {provider.in_flight} calls in flight:\n{doomed.text()[-3000:]}",
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(doomed.popen.pid, signal.SIGKILL)
        doomed.popen.wait(10)
    provider.hold.set()  # the answers now go to a dead socket
    # Nothing was written by the dead tries: every lead still pending, claimed, unfinished.
    assert Lead.objects.filter(enrichment_status="pending").count() == leads
    assert not _enriched_events_per_lead()
    with celery_worker(
        concurrency=8, queues=["enrichment"], pool="threads", extra_env=env, name="heir"
    ) as heir:
        _finish_all(120, heir)
    assert Lead.objects.filter(enrichment_status="done").count() == leads
    assert set(Lead.objects.values_list("industry", "employees")) == {("Retail", 40)}
    assert set(_enriched_events_per_lead().values()) == {1}
    assert len(_enriched_events_per_lead()) == leads
    assert set(provider.emails.values()) == {2}  # the lost try, then the one that finished
    assert set(Lead.objects.values_list("enrichment_attempts", flat=True)) == {2}


def test_the_procfile_layout_enriches_then_routes_every_lead_once(provider):
    """A routing worker (prefork, routing/delivery/maintenance) and the I/O worker (threads,
    enrichment/crm), as `make run` and compose start them: each lead accepted is parked for
    the provider, enriched on the I/O worker, handed back and assigned once, in rotation."""
    from leads.services import lead_ingest_batch
    from routing.models import Assignment
    from routing.rules_io import rules_import
    from tests.leads.factories import SourceFactory
    from tests.routing.test_pipeline_workers import _rules

    provider.delay = 0.3
    leads = 24
    rules_import(_rules(4), publish=True)
    source = SourceFactory(slug="io-layout")
    env = _env(provider)
    with (
        celery_worker(
            concurrency=1,
            queues=["routing.realtime", "maintenance", "delivery", "routing", "routing.bulk"],
            extra_env=env,
            name="cpu",
        ) as cpu,
        celery_worker(
            concurrency=12,
            queues=["enrichment.realtime", "crm.realtime", "enrichment", "crm"],
            pool="threads",
            extra_env=env,
            name="io",
        ) as io,
    ):
        records = [{"email": f"lead{i}@corp{i}.example", "country": "DE"} for i in range(leads)]
        outcomes = lead_ingest_batch(source=source, records=records)
        ids = [outcome.lead_id for outcome in outcomes]  # type: ignore[union-attr]
        wait_until(
            lambda: Lead.objects.filter(id__in=ids, status="assigned").count() == leads,
            timeout=120,
            interval=0.5,
            message=lambda: f"not all assigned:\n{cpu.text()[-3000:]}\n{io.text()[-3000:]}",
        )
    assert Lead.objects.filter(id__in=ids, enrichment_status="done", industry="Retail").count() == (
        leads
    )
    assert Assignment.objects.filter(lead_id__in=ids).count() == leads
    per_rep = Counter(Assignment.objects.filter(lead_id__in=ids).values_list("rep_id", flat=True))
    assert sorted(per_rep.values()) == [leads // 4] * 4  # the rotation exact
    assert set(_enriched_events_per_lead().values()) == {1}
    assert sum(provider.emails.values()) == leads
    assert provider.max_in_flight >= 2  # the calls overlapped on the I/O worker
    assert "enrichment.enrich_lead[" in io.text()
    assert "enrichment.enrich_lead[" not in cpu.text()
