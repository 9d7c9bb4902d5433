"""Outside calls in flight together: the drain with a slow enrichment vendor, before and after the
I/O worker, each as a ratio to the same layout's drain with an instant vendor (issue 18).

    .venv/bin/python -m bench.io_pool [--leads 400] [--enrich-ms 200] [--io-concurrency 32]

Needs PostgreSQL and Redis (BENCH_DATABASE_URL, default a fresh `leadrouter_io_bench` on
localhost; BENCH_REDIS_URL, default database 8 of the local Redis, flushed). It recreates and
migrates the database, imports `bench.pipeline`'s configuration (one round-robin team of 10
reps, one rule), points the HTTP enrichment provider at a stand-in in this process (a threaded
HTTP server on loopback answering every POST with a JSON object after the delay of the run; one
thread per connection, so a slow answer delays only its caller, like a vendor's API) with a
budget high enough never to throttle, and measures two layouts, each with a 0 ms answer and
then a ``--enrich-ms`` answer:

- **before**: 2 `celery -A config worker --concurrency 1` processes consuming every queue, as
  the peer benchmark ran LeadRouter: an enrichment call holds a routing process;
- **after**: the Procfile's layout, 2 such processes on routing, delivery and maintenance plus
  one I/O worker (`--pool threads --concurrency N`) on enrichment and crm.

Each run accepts ``--leads`` new leads through the batch intake service (500 a batch) and
times from the first batch stored to every lead final (assigned, after its enrichment): the
drain. Beat does not run; the enrichment sweeper runs in a thread every 10 s, as beat would.
Reported: each drain, its ratio to the 0 ms drain of the same layout, the most calls the
stand-in served at once, and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.pipeline import _document
from bench.route_lead import recreate_database

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ALL_QUEUES = (
    "routing.realtime,enrichment.realtime,crm.realtime,maintenance,delivery,"
    "routing,enrichment,crm,routing.bulk"
)


class StandIn:
    """An enrichment vendor on loopback whose answer delay can change between runs."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.lock = threading.Lock()
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with stand_in.lock:
                    stand_in.calls += 1
                    stand_in.in_flight += 1
                    stand_in.max_in_flight = max(stand_in.max_in_flight, stand_in.in_flight)
                try:
                    if stand_in.delay:
                        time.sleep(stand_in.delay)
                    lead = json.loads(raw or b"{}")
                    domain = str(lead.get("domain") or "")
                    answer = {"company": f"Company of {domain}", "industry": "Software"}
                    body = json.dumps({**answer, "employees": 250}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                finally:
                    with stand_in.lock:
                        stand_in.in_flight -= 1

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/enrich"

    def reset(self, delay: float) -> None:
        with self.lock:
            self.delay = delay
            self.calls = 0
            self.max_in_flight = self.in_flight


def _worker(
    name: str, queues: str, env: dict[str, str], log_dir: Path, *, pool: str, concurrency: int
) -> subprocess.Popen[bytes]:
    log = log_dir / f"{name}.log"
    args = [str(BIN / "celery"), "-A", "config", "worker", "--queues", queues]
    args += ["--pool", pool, "--concurrency", str(concurrency), "--loglevel", "WARNING"]
    args += ["--hostname", f"{name}@%h", "--without-mingle", "--without-gossip"]
    return subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--leads", type=int, default=400, help="leads per run")
    parser.add_argument("--enrich-ms", type=float, default=200.0)
    parser.add_argument("--io-concurrency", type=int, default=32)
    parser.add_argument("--layouts", default="before,after")
    args, _others = parser.parse_known_args()

    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_io_bench"
    )
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/8")
    var_dir = tempfile.mkdtemp(prefix="leadrouter-io-bench-")
    stand_in = StandIn()
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "CACHE_URL": redis_url,
            "LEADROUTER_VAR_DIR": var_dir,
            "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
            "LOG_LEVEL": "WARNING",
            "EMAIL_URL": "dummymail://",
            "DELIVERY_EMAIL_ENABLED": "false",
            "ENQUEUE_IN_BACKGROUND": "false",
            "SOURCE_CACHE_SECONDS": "0",
            "ENRICHMENT_HTTP_URL": stand_in.url,
            "ENRICHMENT_HTTP_RATE_PER_MINUTE": "1000000",
            "ENRICHMENT_HTTP_BURST": "10000",
        }
    )
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    recreate_database(database_url)
    subprocess.run(
        [str(BIN / "python"), "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=dict(os.environ),
        check=True,
    )

    import django

    django.setup()

    from django.db import connection

    from config.celery import app as celery_app
    from leads.models import Lead, LeadStatus, Source
    from leads.services import lead_ingest_batch
    from routing.enrichment import enrichment_sweep_due
    from routing.rules_io import rules_import

    rules_import(_document(), publish=True)
    source = Source.objects.create(slug="bench", name="Bench", rate_limit_per_minute=10**6)
    final = (
        LeadStatus.ASSIGNED,
        LeadStatus.DUPLICATE,
        LeadStatus.EXCLUDED,
        LeadStatus.UNASSIGNED,
        LeadStatus.FAILED,
    )
    stop_sweeping = threading.Event()

    def sweep() -> None:
        while not stop_sweeping.wait(10):
            with contextlib.suppress(Exception):
                enrichment_sweep_due()
        connection.close()

    threading.Thread(target=sweep, daemon=True).start()

    def drain(tag: str, delay_ms: float) -> dict[str, Any]:
        stand_in.reset(delay_ms / 1000)
        records = [
            {"email": f"{tag}-{i}@corp{i}.example", "country": "DE"} for i in range(args.leads)
        ]
        started = time.perf_counter()
        ids: set[uuid.UUID] = set()
        for b in range(0, len(records), 500):
            for outcome in lead_ingest_batch(source=source, records=records[b : b + 500]):
                ids.add(outcome.lead_id)  # type: ignore[union-attr]
        deadline = time.monotonic() + max(600.0, args.leads * delay_ms / 1000)
        while time.monotonic() < deadline:
            if Lead.objects.filter(id__in=ids, status__in=final).count() == len(ids):
                break
            time.sleep(0.1)
        else:
            raise SystemExit(f"{tag}: not every lead was final in time (see {var_dir})")
        took = time.perf_counter() - started
        enriched = Lead.objects.filter(id__in=ids, enrichment_status="done").count()
        assigned = Lead.objects.filter(id__in=ids, status=LeadStatus.ASSIGNED).count()
        return {
            "seconds": took,
            "calls": stand_in.calls,
            "max_in_flight": stand_in.max_in_flight,
            "enriched": enriched,
            "assigned": assigned,
            "load": os.getloadavg()[0],
        }

    results: dict[str, dict[float, dict[str, Any]]] = {}
    log_dir = Path(var_dir)
    for layout in args.layouts.split(","):
        env = dict(os.environ)
        if layout == "before":
            procs = [
                _worker(f"before-{i}", ALL_QUEUES, env, log_dir, pool="prefork", concurrency=1)
                for i in range(2)
            ]
        else:
            procs = [
                _worker(
                    f"after-{i}",
                    "routing.realtime,maintenance,routing,routing.bulk",
                    env,
                    log_dir,
                    pool="prefork",
                    concurrency=1,
                )
                for i in range(2)
            ]
            procs.append(
                _worker(
                    "after-io",
                    "enrichment.realtime,crm.realtime,enrichment,crm,delivery",
                    env,
                    log_dir,
                    pool="threads",
                    concurrency=args.io_concurrency,
                )
            )
        try:
            deadline = time.monotonic() + 90
            while len(celery_app.control.ping(timeout=1.0) or []) < len(procs):
                if time.monotonic() > deadline:
                    raise SystemExit(f"workers did not start; see {log_dir}")
            results[layout] = {}
            for delay_ms in (0.0, args.enrich_ms):
                results[layout][delay_ms] = drain(f"{layout}{int(delay_ms)}", delay_ms)
                print(layout, delay_ms, results[layout][delay_ms], flush=True)
        finally:
            _stop(procs)
    stop_sweeping.set()

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, PostgreSQL {pg}, Redis broker; {args.leads} leads a run; "
        f"I/O worker: threads x{args.io_concurrency}\n"
    )
    print(
        "| layout | answer | drain s | leads/s | ratio to the 0 ms drain | calls at once (max) "
        "| enriched / assigned | load (1 min) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for layout, runs in results.items():
        base = runs[0.0]["seconds"]
        for delay_ms, run in runs.items():
            print(
                f"| {layout} | {delay_ms:.0f} ms | {run['seconds']:.1f} | "
                f"{args.leads / run['seconds']:.1f} | {run['seconds'] / base:.2f} | "
                f"{run['max_in_flight']} | {run['enriched']} / {run['assigned']} | "
                f"{run['load']:.1f} |"
            )
    shutil.rmtree(var_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
