"""Deliveries run on the I/O worker (Procfile ``io``: a threads pool), many in flight at once.

A webhook receiver answering in 500 ms would take one prefork process 20 x 0.5 s for 20
deliveries; one I/O worker process, started with the queues and pool the Procfile gives it,
has them in flight together. Real ``celery`` worker, PostgreSQL and Redis, a local receiver
that counts the requests it is serving at once and checks each one's signature.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import transaction

from config.celery import app
from routing.delivery.models import Delivery, DeliveryStatus, WebhookEndpoint
from routing.delivery.services import deliveries_schedule
from routing.models import Assignment
from tests.routing.delivery.conftest import verify_standard_webhook
from tests.support.processes import ROOT, celery_worker, wait_until

pytestmark = [
    pytest.mark.worker,
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

DELIVERIES = 20
ANSWER_SECONDS = 0.5


def procfile_io_worker() -> tuple[list[str], str, int]:
    """The queues, pool and default concurrency of the Procfile's ``io`` process."""
    line = next(
        line for line in (ROOT / "Procfile").read_text().splitlines() if line.startswith("io:")
    )
    queues = re.search(r"--queues (\S+)", line)
    pool = re.search(r"--pool (\S+)", line)
    concurrency = re.search(r"--concurrency \$\{IO_WORKER_CONCURRENCY:-(\d+)\}", line)
    assert queues, line
    assert pool, line
    assert concurrency, line
    return queues.group(1).split(","), pool.group(1), int(concurrency.group(1))


class Receiver:
    """A threaded webhook receiver on loopback: 200 after ``ANSWER_SECONDS`` to every POST."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.received: list[tuple[str, dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"] or 0))
                with receiver.lock:
                    receiver.in_flight += 1
                    receiver.max_in_flight = max(receiver.max_in_flight, receiver.in_flight)
                    receiver.received.append((self.path, dict(self.headers), body))
                try:
                    time.sleep(ANSWER_SECONDS)
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with receiver.lock:
                        receiver.in_flight -= 1

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    try:
        yield made
    finally:
        made.close()


def test_twenty_deliveries_are_in_flight_together_on_the_io_worker(
    assignment: Assignment, receiver: Receiver, settings: Any
) -> None:
    settings.DELIVERY_ALLOW_PRIVATE_URLS = True
    settings.DELIVERY_EMAIL_ENABLED = False
    endpoints = []
    for i in range(DELIVERIES):
        endpoint = WebhookEndpoint(name=f"Receiver {i}", url=receiver.url(f"/hook/{i}"))
        endpoint.full_clean()
        endpoint.save()
        endpoints.append(endpoint)
    queues, pool, concurrency = procfile_io_worker()
    assert pool == "threads"
    extra_env = {"DELIVERY_ALLOW_PRIVATE_URLS": "1", "DELIVERY_EMAIL_ENABLED": "false"}
    app.control.purge()  # messages earlier tests left in the shared broker
    with celery_worker(
        concurrency=concurrency, queues=queues, pool=pool, extra_env=extra_env
    ) as worker:
        started = time.monotonic()
        with transaction.atomic():
            rows = deliveries_schedule(assignment=assignment)
        assert len(rows) == DELIVERIES

        def delivered() -> int:
            return Delivery.objects.filter(status=DeliveryStatus.DELIVERED).count()

        wait_until(
            lambda: delivered() == DELIVERIES,
            timeout=60,
            message=lambda: f"{delivered()} of {DELIVERIES} delivered:\n{worker.text()[-3000:]}",
        )
        took = time.monotonic() - started
    print(f"{DELIVERIES} deliveries in {took:.1f} s, {receiver.max_in_flight} at once")
    assert len(receiver.received) == DELIVERIES  # each once
    assert {path for path, _, _ in receiver.received} == {f"/hook/{i}" for i in range(20)}
    secrets = {f"/hook/{i}": endpoint.secret for i, endpoint in enumerate(endpoints)}
    for path, headers, body in receiver.received:
        verify_standard_webhook(secret=secrets[path], headers=headers, body=body)
    # One after the other this is 10 s; together, a fraction of it.
    assert took < DELIVERIES * ANSWER_SECONDS / 3, took
    assert receiver.max_in_flight >= 8, receiver.max_in_flight
