"""The pipeline with the CRM stages on, against the Salesforce and HubSpot stand-ins, beside the
same run without them.

    .venv/bin/python -m bench.crm [--leads 300] [--vendor-leads 120] [--runs 1,2,3,4,5]

Needs PostgreSQL and Redis (BENCH_DATABASE_URL, default a fresh `leadrouter_crm_bench` on
localhost; BENCH_REDIS_URL, default database 7 of the local Redis, flushed before each run). It
creates and migrates the database once, imports one round-robin team of 10 reps and one rule
sending every lead to it (``bench.pipeline``'s document), and keeps that state as a template:
every run starts from a copy of it and an empty Redis. Each run starts 2 ``celery -A config
worker --concurrency 1`` processes (``bench.pipeline.Workers``) on the queues routing, crm and
delivery, sends 4 warm-up leads through (not timed: each worker's first decision, imports, the
CRM's access token), lets the CRM's token bucket refill, clears the stand-in's request log, then
accepts its leads through the batch intake service (500 a batch) and times, from the first batch
stored, until every lead is assigned and (CRM on) until every owner write-back is delivered.
Every lead has a new e-mail and company domain, so each lookup misses (Salesforce: Contact, Lead
and Account queries) and each write-back creates the person (Salesforce: two queries and a
create of a Lead); the rep's e-mail is off. Beat does not run: this process runs what beat
would for the pipeline, the CRM sweeper every ``CRM_SWEEP_INTERVAL_SECONDS`` and the delivery
sweeper every ``DELIVERY_SWEEP_INTERVAL_SECONDS``, in a thread (the first-touch, roster and
health jobs are not run, and the connection's first-touch job is off). The runs:

1. **without CRM**: no connection (the baseline);
2. **CRM on, answers at once**: the stand-in without delay, limit 60,000/min, burst 100 (the
   stages' own cost);
3. **CRM on, 100 ms an answer**: ``set_delay(0.1)``, the same high limit;
4. **CRM on at Salesforce's documented pace**: the connection's defaults
   (``DEFAULT_RATE_PER_MINUTE`` / ``DEFAULT_BURST``), 100 ms an answer, ``--vendor-leads`` leads;
5. **HubSpot at its documented pace**: the HubSpot stand-in (``tests.support.crm_hubspot``,
   enforcing HubSpot's limits: 5 searches a second), HubSpot's defaults, 100 ms an answer,
   ``--vendor-leads`` leads.

The stand-ins run in this process, on loopback, with their own certificate (the workers get it
as ``CRM_CA_BUNDLE``); each has one user (owner) per rep, linked to the reps by the roster sync.
They set ``TCP_NODELAY`` on their connections themselves (without it every answer waits ~40 ms
for Nagle's algorithm: they send the headers and the body apart).
It exits 1 unless every run finished: every lead assigned and, CRM on, written back.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench.pipeline import BIN, REPS, ROOT, Workers, _document
from bench.route_lead import recreate_database

QUEUES = "routing,crm,delivery"
WORKERS = 2
HIGH_RATE_PER_MINUTE = 60_000
HIGH_BURST = 100
DELAY = 0.1
WARM_UP = 4  # leads through the pipeline before each timed run (not counted)


@dataclass
class Plan:
    name: str
    leads: int
    crm: str = ""  # "", "salesforce" or "hubspot"
    delay: float = 0.0
    rate_per_minute: int | None = None  # None: the vendor's documented default
    burst: int | None = None


@dataclass
class Outcome:
    plan: Plan
    assigned_s: float | None = None
    written_s: float | None = None
    requests: int = 0
    max_per_second: int = 0
    limit_per_second: float | None = None
    rate_per_minute: int = 0
    burst: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    crm_statuses: dict[str, int] = field(default_factory=dict)
    deliveries: dict[str, int] = field(default_factory=dict)
    creates: int = 0
    answered_429: int = 0
    max_searches_per_second: int = 0
    failed_reasons: dict[str, int] = field(default_factory=dict)
    by_kind: dict[str, int] = field(default_factory=dict)
    swept: dict[str, int] = field(default_factory=dict)
    queues: list[str] = field(default_factory=list)
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)
    ids: set[uuid.UUID] = field(default_factory=set)
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    problem: str = ""


class Beat(threading.Thread):
    """What beat runs for the pipeline: the CRM and delivery sweepers, each on its interval."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopping = threading.Event()
        self.sent: Counter[str] = Counter()
        self.errors: list[str] = []

    def run(self) -> None:
        from django.conf import settings
        from django.db import connection

        from routing.crm.lookup import crm_sweep_due
        from routing.delivery.services import deliveries_sweep_due

        jobs = [
            ("crm", settings.CRM_SWEEP_INTERVAL_SECONDS, crm_sweep_due),
            ("delivery", settings.DELIVERY_SWEEP_INTERVAL_SECONDS, deliveries_sweep_due),
        ]
        started = time.monotonic()
        due = {name: started + interval for name, interval, _ in jobs}
        try:
            while not self.stopping.is_set():
                for name, interval, job in jobs:
                    if time.monotonic() >= due[name]:
                        try:
                            self.sent[name] += job()
                        except Exception as exc:  # beat would log it and run it next time
                            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                        due[name] += interval
                self.stopping.wait(max(0.0, min(due.values()) - time.monotonic()))
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def _request_kind(method: str, path: str, query: dict[str, list[str]]) -> str:
    """``query Lead``, ``POST Lead`` (Salesforce), ``POST contacts/search`` (HubSpot), ..."""
    path = path.rstrip("/")
    if path.endswith("/oauth2/token"):
        return "token"
    if path.endswith("/query"):
        soql = (query.get("q") or [""])[0]
        words = soql.split()
        target = words[words.index("FROM") + 1] if "FROM" in words else "?"
        return f"query {target}"
    if "/sobjects/" in path:
        return f"{method} {path.rsplit('/sobjects/', 1)[-1]}"
    tail = path.split("/crm/v3/objects/", 1)[-1]
    return f"{method} " + "/".join("{id}" if p.isdigit() else p for p in tail.split("/"))


CREATES = ("POST Lead", "POST contacts")


def _max_per_second(times: list[float]) -> int:
    """The most of ``times`` within any one-second window (as the stand-ins count)."""
    times = sorted(times)
    best, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] >= 1.0:
            start += 1
        best = max(best, end - start + 1)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--leads", type=int, default=300, help="leads per run (runs 1-3)")
    parser.add_argument(
        "--vendor-leads", type=int, default=120, help="leads in the run at the vendor's limit"
    )
    parser.add_argument(
        "--runs", default="1,2,3,4,5", help="which runs, e.g. 1,4 (run 1 is the ratios' baseline)"
    )
    args, _others = parser.parse_known_args()
    wanted = {int(x) for x in args.runs.split(",") if x.strip()}

    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_crm_bench"
    )
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")
    var_dir = tempfile.mkdtemp(prefix="leadrouter-crm-bench-")
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            # The CRM's shared rate limit and breaker: in the same Redis database.
            "ENRICHMENT_REDIS_URL": redis_url,
            "CACHE_URL": "locmemcache://",
            "LEADROUTER_VAR_DIR": var_dir,
            "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
            "LOG_LEVEL": "WARNING",
            "EMAIL_URL": "dummymail://",
            "DELIVERY_EMAIL_ENABLED": "false",
            "ENQUEUE_IN_BACKGROUND": "false",
            "SOURCE_CACHE_SECONDS": "0",
        }
    )
    import psycopg
    import redis

    parsed = urlparse(database_url)
    name = parsed.path.lstrip("/")
    template = f"{name}_template"
    admin_url = parsed._replace(path="/postgres").geturl()

    recreate_database(database_url)
    subprocess.run(
        [str(BIN / "python"), "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=dict(os.environ),
        check=True,
    )

    import django

    django.setup()

    from django.conf import settings
    from django.db import connection, connections
    from django.db.models import Count

    from config.celery import app as celery_app
    from leads.models import Lead, LeadStatus, Source
    from leads.services import lead_ingest_batch
    from routing.crm.base import HUBSPOT, SALESFORCE
    from routing.crm.limits import LOOKUP_REQUESTS, WRITE_REQUESTS
    from routing.crm.lookup import clear_connection_cache
    from routing.crm.models import DEFAULT_BURST, DEFAULT_RATE_PER_MINUTE, CrmConnection
    from routing.crm.roster import crm_roster_sync
    from routing.crm.salesforce import clear_token_cache
    from routing.crm.secrets import secret_seal
    from routing.delivery.models import Delivery, DeliveryStatus
    from routing.rules_io import rules_import
    from tests.support.crm_hubspot import HubSpotStandIn
    from tests.support.crm_salesforce import SalesforceStandIn

    rules_import(_document(), publish=True)
    Source.objects.create(slug="bench", name="Bench", rate_limit_per_minute=10**6)
    connections.close_all()
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{template}" TEMPLATE "{name}"')

    def fresh_state() -> None:
        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        redis.Redis.from_url(redis_url).flushdb()
        clear_connection_cache()
        clear_token_cache()

    final = (
        LeadStatus.ASSIGNED,
        LeadStatus.DUPLICATE,
        LeadStatus.EXCLUDED,
        LeadStatus.UNASSIGNED,
        LeadStatus.FAILED,
    )
    log_dir = Path(var_dir)
    ping = celery_app.control.ping

    def stages(ids: set[uuid.UUID], kind: str) -> dict[str, tuple[float, float]]:
        """p50 and max seconds of each stage of a lead's way, from its rows' timestamps ("looked
        up": the start of the lookup's last try, the one that finished)."""
        from django.utils.dateparse import parse_datetime

        spans: dict[str, list[float]] = {
            "accepted → parked": [],
            "parked → looked up": [],
            "looked up → assigned": [],
            "assigned → written back": [],
        }
        written = dict(
            Delivery.objects.filter(channel="crm", status=DeliveryStatus.DELIVERED).values_list(
                "assignment__lead_id", "delivered_at"
            )
        )
        rows = Lead.objects.filter(id__in=ids).values_list(
            "id", "received_at", "processed_at", "crm"
        )
        for lead_id, received, processed, crm in rows:
            record = crm if isinstance(crm, dict) else {}
            since = parse_datetime(str(record.get("_since") or ""))
            entry = record.get(kind) if isinstance(record.get(kind), dict) else {}
            looked = parse_datetime(str((entry or {}).get("at") or ""))
            points = [received, since, looked, processed, written.get(lead_id)]
            for values, start, end in zip(spans.values(), points, points[1:], strict=False):
                if start is not None and end is not None:
                    values.append((end - start).total_seconds())
        return {
            label: (statistics.median(values), max(values))
            for label, values in spans.items()
            if values
        }

    def run(number: int, plan: Plan) -> Outcome:
        fresh_state()
        outcome = Outcome(plan)
        source = Source.objects.get(slug="bench")
        env = dict(os.environ, CELERY_WORKER_QUEUES=QUEUES)
        standin: SalesforceStandIn | HubSpotStandIn | None = None
        if plan.crm:
            fields: dict[str, Any]
            if plan.crm == SALESFORCE:
                sf = SalesforceStandIn().start()
                for i in range(REPS):
                    sf.add_user(email=f"rep{i}@bench.example", name=f"Rep {i}")
                fields = {
                    "auth_flow": "client_credentials",
                    "client_id": sf.client_id,
                    "secret_encrypted": secret_seal(sf.client_secret),
                }
                standin = sf
            else:
                hs = HubSpotStandIn(enforce_rate_limits=True).start()
                for i in range(REPS):
                    hs.add_owner(f"rep{i}@bench.example", "Rep", str(i))
                fields = {"secret_encrypted": secret_seal(hs.token)}
                standin = hs
            crm = CrmConnection.objects.create(
                kind=plan.crm,
                name=plan.crm.title(),
                base_url=standin.url,
                **fields,
                lookup_enabled=True,
                writeback_enabled=True,
                touches_enabled=False,
                rate_per_minute=plan.rate_per_minute,
                burst=plan.burst,
            )
            outcome.rate_per_minute = crm.effective_rate_per_minute
            outcome.burst = crm.effective_burst
            outcome.limit_per_second = crm.effective_burst + crm.effective_rate_per_minute / 60
            settings.CRM_CA_BUNDLE = standin.ca_file
            crm_roster_sync(crm, create_reps=False)
            clear_token_cache()
            redis.Redis.from_url(redis_url).flushdb()  # a full bucket: the sync spent from it
            standin.reset_log()
            standin.set_delay(plan.delay)
            env["CRM_CA_BUNDLE"] = standin.ca_file
        workers = Workers(WORKERS, env, log_dir)
        beat = Beat()
        timeout = 120.0 + plan.leads * (2.0 if plan.crm else 0.5)
        try:
            workers.wait_ready(ping)
            replies = celery_app.control.inspect(timeout=2.0).active_queues() or {}
            outcome.queues = sorted({q["name"] for qs in replies.values() for q in qs})
            beat.start()

            def accept(prefix: str, count: int) -> set[uuid.UUID]:
                records = [
                    {
                        "email": f"{prefix}{i}@{prefix}r{number}c{i}.example",
                        "first_name": "Lead",
                        "last_name": f"Number {i}",
                        "company": f"Company {number}-{i}",
                        "country": "DE",
                    }
                    for i in range(count)
                ]
                ids: set[uuid.UUID] = set()
                for b in range(0, len(records), 500):
                    for accepted in lead_ingest_batch(source=source, records=records[b : b + 500]):
                        ids.add(accepted.lead_id)  # type: ignore[union-attr]
                return ids

            def wait(ids: set[uuid.UUID], started: float, deadline: float) -> tuple[Any, Any]:
                """(seconds to all assigned, to all written back), None for what did not end."""
                assigned_s = written_s = None
                while time.monotonic() < deadline:
                    now = time.perf_counter()
                    if assigned_s is None:
                        done = Lead.objects.filter(id__in=ids, status__in=final).count()
                        if done == len(ids):
                            assigned_s = now - started
                    if assigned_s is not None and plan.crm:
                        written = Delivery.objects.filter(
                            channel="crm",
                            status=DeliveryStatus.DELIVERED,
                            assignment__lead_id__in=ids,
                        ).count()
                        if written == len(ids):
                            written_s = now - started
                    if assigned_s is not None and (written_s or not plan.crm):
                        break
                    time.sleep(0.1)
                return assigned_s, written_s

            # Warm-up, not timed: each worker's first leads (imports, the first decision, the
            # CRM's access token); then the stand-in's log is cleared and the bucket refills.
            warm = accept("warm", WARM_UP)
            warmed = wait(warm, time.perf_counter(), time.monotonic() + 120)
            if warmed[0] is None or (plan.crm and warmed[1] is None):
                raise SystemExit("the warm-up leads did not finish; see " + str(log_dir))
            if standin is not None:
                time.sleep(1.0 + outcome.burst * 60 / outcome.rate_per_minute)
                standin.reset_log()
            beat.sent.clear()
            started = time.perf_counter()
            ids = accept("lead", plan.leads)
            outcome.ids = ids
            outcome.assigned_s, outcome.written_s = wait(ids, started, time.monotonic() + timeout)
            if outcome.assigned_s is None or (plan.crm and outcome.written_s is None):
                outcome.problem = f"not finished within {timeout:.0f} s"
            outcome.load = os.getloadavg()
        finally:
            beat.stop()
            workers.stop()
            if standin is not None:
                standin.stop()
        outcome.swept = dict(beat.sent)
        if beat.errors:
            outcome.problem += f" sweeper errors: {beat.errors[:3]}"
        measured = Lead.objects.filter(id__in=outcome.ids)
        outcome.statuses = dict(measured.values_list("status").annotate(n=Count("id")).order_by())
        outcome.crm_statuses = dict(
            measured.values_list("crm_status").annotate(n=Count("id")).order_by()
        )
        outcome.deliveries = dict(
            Delivery.objects.filter(channel="crm", assignment__lead_id__in=outcome.ids)
            .values_list("status")
            .annotate(n=Count("id"))
            .order_by()
        )
        if plan.crm:
            outcome.stages = stages(outcome.ids, plan.crm)
            reasons: Counter[str] = Counter()
            for record in measured.values_list("crm", flat=True):
                entry = record.get(plan.crm) if isinstance(record, dict) else None
                if isinstance(entry, dict) and entry.get("status") == "failed":
                    reasons[str(entry.get("reason") or "")[:90]] += 1
            outcome.failed_reasons = dict(reasons)
        if standin is not None:
            log: list[Any] = list(standin.requests)
            outcome.requests = len(log)
            outcome.max_per_second = standin.max_per_second()
            outcome.by_kind = dict(Counter(_request_kind(r.method, r.path, r.query) for r in log))
            outcome.creates = sum(outcome.by_kind.get(kind, 0) for kind in CREATES)
            outcome.answered_429 = sum(1 for r in log if getattr(r, "status", None) == 429)
            outcome.max_searches_per_second = _max_per_second(
                [r.at for r in log if r.path.rstrip("/").endswith("/search")]
            )
            standin.close()
        return outcome

    def vendor(kind: str) -> str:
        return f"{DEFAULT_RATE_PER_MINUTE[kind]}/min, burst {DEFAULT_BURST[kind]}"

    plans = [
        Plan("without CRM", args.leads),
        Plan(
            "Salesforce stand-in, answers at once, limit high",
            args.leads,
            crm=SALESFORCE,
            rate_per_minute=HIGH_RATE_PER_MINUTE,
            burst=HIGH_BURST,
        ),
        Plan(
            "Salesforce stand-in, 100 ms an answer, limit high",
            args.leads,
            crm=SALESFORCE,
            delay=DELAY,
            rate_per_minute=HIGH_RATE_PER_MINUTE,
            burst=HIGH_BURST,
        ),
        Plan(
            f"Salesforce stand-in, 100 ms an answer, Salesforce's default limit "
            f"({vendor(SALESFORCE)})",
            min(args.leads, args.vendor_leads),
            crm=SALESFORCE,
            delay=DELAY,
        ),
        Plan(
            f"HubSpot stand-in, 100 ms an answer, HubSpot's default limit ({vendor(HUBSPOT)})",
            min(args.leads, args.vendor_leads),
            crm=HUBSPOT,
            delay=DELAY,
        ),
    ]
    outcomes: list[tuple[int, Outcome]] = []
    for number, plan in enumerate(plans, start=1):
        if number not in wanted:
            continue
        print(f"run {number}: {plan.name}, {plan.leads} leads ...", file=sys.stderr, flush=True)
        outcomes.append((number, run(number, plan)))

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, PostgreSQL {pg}, Redis broker; {WORKERS} worker "
        f"processes (concurrency 1, queues {', '.join(outcomes[0][1].queues) or '?'})"
    )
    print(
        "load average (1 min) at the end of each run: "
        + "; ".join(f"run {i} {o.load[0]:.2f}" for i, o in outcomes)
        + "\n"
    )
    base = dict(outcomes).get(1)
    base_rate = base.plan.leads / base.assigned_s if base and base.assigned_s else None

    def rate(leads: int, seconds: float | None) -> str:
        return f"{leads / seconds:,.1f}" if seconds else "—"

    def secs(seconds: float | None) -> str:
        return f"{seconds:,.1f}" if seconds is not None else "not finished"

    print(
        "| run | leads | s to all assigned | leads/s assigned | ratio to run 1 "
        "| s to all written back | leads/s written back | requests to the stand-in "
        "| max requests in any second (limit: burst + rate/s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, o in outcomes:
        leads = o.plan.leads
        ratio = f"{leads / o.assigned_s / base_rate:.2f}" if o.assigned_s and base_rate else "—"
        limit = f" ({o.limit_per_second:,.0f})" if o.limit_per_second else ""
        print(
            f"| {i}. {o.plan.name} | {leads} | {secs(o.assigned_s)} | "
            f"{rate(leads, o.assigned_s)} | {ratio} | "
            f"{secs(o.written_s) if o.plan.crm else '—'} | "
            f"{rate(leads, o.written_s) if o.plan.crm else '—'} | "
            f"{o.requests if o.plan.crm else '—'} | "
            f"{(str(o.max_per_second) + limit) if o.plan.crm else '—'} |"
        )
    print()
    for kind in (SALESFORCE, HUBSPOT):
        per_lead = LOOKUP_REQUESTS[kind] + WRITE_REQUESTS[kind]
        rate_s = DEFAULT_RATE_PER_MINUTE[kind] / 60
        print(
            f"Bounds, {kind}: a lead takes {LOOKUP_REQUESTS[kind]} requests to look up and "
            f"{WRITE_REQUESTS[kind]} to write back ({per_lead}): at the default "
            f"{rate_s * 60:.0f}/min at most {rate_s / per_lead:.2f} leads/s; at "
            f"{DELAY * 1000:.0f} ms an answer, {WORKERS} workers of concurrency 1 waiting on "
            f"answers at most {WORKERS / (per_lead * DELAY):.2f} leads/s."
        )
    print()
    failed = False
    for i, o in outcomes:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(o.by_kind.items()))
        print(
            f"- run {i}: leads {o.statuses}; CRM lookups {o.crm_statuses}; "
            f"write-backs {o.deliveries or '—'}; Leads created in the stand-in {o.creates}; "
            f"requests: {kinds or '—'}; answered 429: {o.answered_429}; "
            + (
                f"max searches in any second: {o.max_searches_per_second}; "
                if o.plan.crm == HUBSPOT
                else ""
            )
            + (f"lookups failed: {o.failed_reasons}; " if o.failed_reasons else "")
            + f"re-sent by the sweepers {o.swept or '—'}"
            + (f"; PROBLEM: {o.problem}" if o.problem else "")
        )
        if o.stages:
            print(
                "  stages, p50 / max s: "
                + "; ".join(f"{k} {p50:.2f} / {top:.2f}" for k, (p50, top) in o.stages.items())
            )
        if o.assigned_s is None or o.problem:
            failed = True
    connections.close_all()
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
    if failed:
        print(f"\nworker logs kept in {var_dir}")
    else:
        shutil.rmtree(var_dir, ignore_errors=True)
    return int(failed)


if __name__ == "__main__":
    raise SystemExit(main())
