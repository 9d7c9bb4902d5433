"""The pipeline end to end on PostgreSQL + Redis, beside the bare database work of a routed lead.

    .venv/bin/python -m bench.pipeline [--leads 2000] [--steady-seconds 20]

Needs PostgreSQL and Redis (BENCH_DATABASE_URL, default a fresh `leadrouter_pipeline_bench` on
localhost; BENCH_REDIS_URL, default database 6 of the local Redis, flushed). It recreates and
migrates the database, imports one round-robin team of 10 reps and one rule sending every lead
to it, then measures, in one run:

- **raw**: the rows one routed lead writes, with the ORM, in one transaction per lead and no
  decision, lock or broker: INSERT the lead and its `received` event; UPDATE the lead's
  canonical fields and status; UPDATE the team's turn; INSERT the assignment; UPDATE the rep;
  INSERT the `assigned` event. With 1 and with 2 connections (threads), leads per second.
- **pipeline**: the same number of leads accepted by the batch intake service (500 a batch) and
  processed by 1 and by 2 `celery -A config worker --concurrency 1` processes: from the first
  batch stored to every lead assigned, leads per second. The rep's e-mail (a delivery task per
  lead) is off, as is any webhook: routing alone; ``BENCH_EMAIL=true`` turns the e-mail on (to
  Django's dummy backend) for both sides.

``--company`` measures instead issue 18's company scale through the whole pipeline: the leads/s
of 2 workers when the configuration is 1,000 rules (998 ``country eq`` rules no lead matches, a
territory rule, the team rule) over 100,000 postal prefixes and one capped team of 10 reps,
then of ``--capped-reps`` (default 1,000) capped reps holding ``--open-leads`` (default 100,000)
open leads, in the same run (``--strategy``, default round_robin), and the ratio of the two.

``--without-rollup-triggers`` drops the report rollups' triggers (audit.rollups) after
migrating: run with and without, alternating, for their cost on every side.
  The workers' CPU a lead (user + system of their processes, from /proc) is printed beside.
  The database is analyzed before each part (``analyze``: as autovacuum would).
- **steady**: 50 leads a second accepted one by one (the single-lead intake service) for
  ``--steady-seconds``, with 2 workers: accept to assigned, p50 / p95 / max, where "assigned"
  is the moment the worker took its decision (``processed_at``; its commit follows within
  milliseconds) and "accept" the lead's ``received_at``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
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
from pathlib import Path
from typing import Any

from bench.route_lead import recreate_database

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TEAM = "Inbound SDR"
REPS = 10


def _document() -> dict[str, Any]:
    reps = [
        {"email": f"rep{i}@bench.example", "name": f"Rep {i}", "timezone": "UTC"}
        for i in range(REPS)
    ]
    return {
        "reps": reps,
        "teams": [
            {
                "name": TEAM,
                "strategy": "round_robin",
                "members": [{"rep": r["email"]} for r in reps],
            }
        ],
        "ruleset": {
            "name": "Everyone",
            "rules": [
                {"name": "Everyone", "priority": 1, "action": {"type": "team", "team": TEAM}}
            ],
        },
    }


def analyze(connection: Any) -> None:
    """``ANALYZE`` the bench's database, as autovacuum does on its own in production: on a
    server run with autovacuum off (this machine's is), the tables filled by the bench are never
    analyzed, the planner takes them for empty and the pipeline's statements scan whole tables
    (PostgreSQL's CPU a lead grew from ~0.9 ms to ~3 ms over 36,000 leads, measured)."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


class Workers:
    """``count`` celery worker processes, concurrency 1 each, on the bench's broker."""

    def __init__(self, count: int, env: dict[str, str], log_dir: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        for i in range(count):
            log = log_dir / f"worker-{count}-{i}.log"
            self.logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    [
                        str(BIN / "celery"),
                        "-A",
                        "config",
                        "worker",
                        "--concurrency",
                        "1",
                        "--loglevel",
                        "WARNING",
                        "--hostname",
                        f"bench{count}-{i}@%h",
                        "--without-mingle",
                        "--without-gossip",
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=log.open("wb"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def wait_ready(self, ping: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            replies = ping(timeout=1.0) or []
            if len(replies) >= len(self.procs):
                return
        raise SystemExit("workers did not start; see " + ", ".join(map(str, self.logs)))

    def cpu_seconds(self) -> float:
        """User + system CPU the workers' processes (each's session: the main process and its
        pool child) have used so far, from /proc (0 where there is none)."""
        sessions = {str(proc.pid) for proc in self.procs}
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[3] in sessions:
                total += int(fields[11]) + int(fields[12])
        return total / tick

    def stop(self) -> None:
        import signal

        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--leads", type=int, default=2000, help="leads per throughput run")
    parser.add_argument("--steady-seconds", type=float, default=20.0)
    parser.add_argument(
        "--without-rollup-triggers",
        action="store_true",
        help="drop the report rollups' triggers after migrating (their cost: run with and "
        "without, alternating)",
    )
    parser.add_argument("--company", action="store_true", help="10 reps against 1,000 only")
    parser.add_argument("--capped-reps", type=int, default=1_000)
    parser.add_argument("--open-leads", type=int, default=100_000)
    parser.add_argument("--strategy", default="round_robin")
    args, _others = parser.parse_known_args()

    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_pipeline_bench"
    )
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/6")
    var_dir = tempfile.mkdtemp(prefix="leadrouter-pipeline-bench-")
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "LEADROUTER_VAR_DIR": var_dir,
            "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
            "LOG_LEVEL": "WARNING",
            "EMAIL_URL": "dummymail://",
            # Routing only: the rep's e-mail is a second task per lead, measured apart below.
            "DELIVERY_EMAIL_ENABLED": os.environ.get("BENCH_EMAIL", "false"),
            "ENQUEUE_IN_BACKGROUND": "false",
            "SOURCE_CACHE_SECONDS": "0",
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

    from django.db import connection, transaction
    from django.utils import timezone

    from audit.models import EventType
    from audit.services import event_record_for_assignment, events_record_received
    from config.celery import app as celery_app
    from leads.models import Lead, LeadStatus, Source
    from leads.services import lead_ingest, lead_ingest_batch
    from routing.delivery.services import deliveries_schedule
    from routing.models import Assignment, AssignmentKind, Rep, Team
    from routing.rules_io import rules_import

    if args.without_rollup_triggers:
        from audit.rollups import rollup_triggers_drop

        rollup_triggers_drop(connection)
    if args.company:
        return _company(args, source_url=redis_url, var_dir=var_dir)
    rules_import(_document(), publish=True)
    source = Source.objects.create(slug="bench", name="Bench", rate_limit_per_minute=10**6)
    team = Team.objects.get(name=TEAM)
    reps = list(Rep.objects.order_by("email"))
    final = (
        LeadStatus.ASSIGNED,
        LeadStatus.DUPLICATE,
        LeadStatus.EXCLUDED,
        LeadStatus.UNASSIGNED,
        LeadStatus.FAILED,
    )

    # --- raw ---------------------------------------------------------------------------------
    def raw_one(i: int) -> None:
        now = timezone.now()
        rep = reps[i % REPS]
        with transaction.atomic():
            lead = Lead(
                id=uuid.uuid4(),
                source=source,
                raw_payload={"email": f"raw{i}@corp{i % 50}.example"},
                request_fingerprint=uuid.uuid4().hex,
                received_at=now,
            )
            lead.save(force_insert=True)
            events_record_received(leads=[lead], actor="source:bench")
            lead.email = f"raw{i}@corp{i % 50}.example"
            lead.email_domain = f"corp{i % 50}.example"
            lead.status = LeadStatus.ASSIGNED
            lead.normalized_at = lead.deduped_at = lead.processed_at = now
            lead.save()
            Team.objects.filter(pk=team.pk).update(
                rotation_state={"team_id": team.pk, "last_rep_id": rep.pk}
            )
            assignment = Assignment.objects.create(
                lead=lead,
                rep=rep,
                team=team,
                rule_name="Everyone",
                rep_name=rep.name,
                team_name=team.name,
                ruleset_version=1,
                kind=AssignmentKind.INITIAL,
                reason="raw",
                trace=[],
                assigned_at=now,
                active=True,
            )
            Rep.objects.filter(pk=rep.pk).update(last_assigned_at=now)
            event_record_for_assignment(type=EventType.ASSIGNED, assignment=assignment, at=now)
            deliveries_schedule(assignment=assignment, event="assigned")  # none without e-mail

    def raw_rate(threads: int, count: int) -> float:
        def run(offset: int) -> None:
            try:
                for i in range(offset, count, threads):
                    raw_one(i)
            finally:
                connection.close()

        started = time.perf_counter()
        pool = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return count / (time.perf_counter() - started)

    # raw_one schedules deliveries: their publish would queue e-mail tasks nobody consumes
    # here; the broker is flushed before the pipeline runs.
    raw_rate(1, 50)  # warm up
    analyze(connection)
    raw = {n: raw_rate(n, args.leads) for n in (1, 2)}
    redis.Redis.from_url(redis_url).flushdb()

    # --- pipeline ----------------------------------------------------------------------------
    def wait_final(ids: set[uuid.UUID], timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = Lead.objects.filter(id__in=ids, status__in=final).count()
            if done == len(ids):
                return time.perf_counter()
            time.sleep(0.05)
        raise SystemExit(f"not every lead was processed within {timeout} s")

    log_dir = Path(var_dir)
    ping = celery_app.control.ping
    pipeline: dict[int, float] = {}
    worker_cpu: dict[int, float] = {}  # ms of the workers' CPU a lead
    for count in (1, 2):
        analyze(connection)
        workers = Workers(count, dict(os.environ), log_dir)
        try:
            workers.wait_ready(ping)
            records = [
                {"email": f"p{count}-{i}@corp{i % 50}.example", "country": "DE"}
                for i in range(args.leads)
            ]
            started = time.perf_counter()
            cpu_before = workers.cpu_seconds()
            ids: set[uuid.UUID] = set()
            for b in range(0, len(records), 500):
                for outcome in lead_ingest_batch(source=source, records=records[b : b + 500]):
                    ids.add(outcome.lead_id)  # type: ignore[union-attr]
            ended = wait_final(ids, timeout=max(120.0, args.leads / 5))
            pipeline[count] = len(ids) / (ended - started)
            worker_cpu[count] = 1000 * (workers.cpu_seconds() - cpu_before) / len(ids)
        finally:
            workers.stop()
    assigned = Lead.objects.filter(status=LeadStatus.ASSIGNED).count()

    # --- steady ------------------------------------------------------------------------------
    analyze(connection)
    workers = Workers(2, dict(os.environ), log_dir)
    try:
        workers.wait_ready(ping)
        steady_ids: list[uuid.UUID] = []
        interval = 1 / 50
        started = time.perf_counter()
        total = int(args.steady_seconds * 50)
        for i in range(total):
            due = started + i * interval
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            accepted = lead_ingest(source=source, record={"email": f"steady{i}@corp.example"})
            steady_ids.append(accepted.lead_id)
        sent_for = time.perf_counter() - started
        wait_final(set(steady_ids), timeout=120)
    finally:
        workers.stop()
    latencies = sorted(
        (processed - received).total_seconds()
        for received, processed in Lead.objects.filter(id__in=steady_ids).values_list(
            "received_at", "processed_at"
        )
    )
    p50 = statistics.median(latencies)
    p95 = latencies[int(len(latencies) * 0.95) - 1]

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, PostgreSQL {pg}, Redis broker; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    triggers = "dropped" if args.without_rollup_triggers else "on"
    print(
        f"{args.leads} leads per throughput run; {assigned} assigned in all; "
        f"report rollup triggers {triggers}\n"
    )
    print("| measure | leads/s | ratio to raw (same connections) | workers' CPU a lead |")
    print("|---|---:|---:|---:|")
    for n in (1, 2):
        print(f"| raw transaction, {n} connection{'s' if n > 1 else ''} | {raw[n]:,.0f} | 1.00 | |")
    for n in (1, 2):
        print(
            f"| pipeline, {n} worker process{'es' if n > 1 else ''} | {pipeline[n]:,.0f} | "
            f"{pipeline[n] / raw[n]:.2f} | {worker_cpu[n]:.2f} ms |"
        )
    print(
        f"\nsteady 50 leads/s for {sent_for:.1f} s ({len(steady_ids)} leads), 2 workers: "
        f"accept to assigned p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
        f"max {latencies[-1] * 1000:.0f} ms"
    )
    shutil.rmtree(var_dir, ignore_errors=True)
    return 0


def _company(args: argparse.Namespace, *, source_url: str, var_dir: str) -> int:
    """``--company``: the pipeline's leads/s at 10 capped reps and at ``--capped-reps`` with
    ``--open-leads``, same rules and territories, same run."""
    from datetime import timedelta

    import redis
    from django.db import connection
    from django.utils import timezone

    from bench.route_lead import _base_document, _country_rules, _team_rule, _territories
    from config.celery import app as celery_app
    from leads.models import Lead, LeadStatus, Source
    from leads.services import lead_ingest_batch
    from routing.loads import rep_loads_reconcile
    from routing.models import Assignment, AssignmentKind, Rep, Team, Territory
    from routing.rules_io import rules_import

    source = Source.objects.create(slug="bench", name="Bench", rate_limit_per_minute=10**6)
    ruleset = {
        "name": "company",
        "rules": [
            *_country_rules(999)[:-1],
            {"name": "By territory", "priority": 998, "action": {"type": "territory"}},
            _team_rule(999),
        ],
    }
    caps = {"max_open": args.open_leads + 10 * args.leads, "max_per_day": 10 * args.leads}
    final = (LeadStatus.ASSIGNED, LeadStatus.UNASSIGNED, LeadStatus.FAILED, LeadStatus.EXCLUDED)
    rates: list[tuple[str, float, int]] = []
    for reps_n, held_n in ((REPS, 0), (args.capped_reps, args.open_leads)):
        Territory.objects.all().delete()
        Assignment.objects.all().delete()
        Rep.objects.all().delete()
        rules_import(
            {
                **_base_document(reps_n, args.strategy, caps),
                "territories": _territories(1_000, 100),
                "ruleset": ruleset,
            },
            publish=True,
        )
        team = Team.objects.get(name=TEAM)
        reps = list(Rep.objects.order_by("email"))
        if held_n:
            now = timezone.now()
            held = [
                Lead(
                    id=uuid.uuid4(),
                    source=source,
                    status=LeadStatus.ASSIGNED,
                    raw_payload={},
                    request_fingerprint=uuid.uuid4().hex,
                    email=f"held{i}@corp.example",
                    received_at=now,
                )
                for i in range(held_n)
            ]
            Lead.objects.bulk_create(held, batch_size=2000)
            Assignment.objects.bulk_create(
                [
                    Assignment(
                        lead=lead,
                        rep=reps[i % len(reps)],
                        team=team,
                        rep_name=reps[i % len(reps)].name,
                        team_name=team.name,
                        kind=AssignmentKind.INITIAL,
                        reason="held",
                        assigned_at=now - timedelta(days=2),
                        active=True,
                    )
                    for i, lead in enumerate(held)
                ],
                batch_size=2000,
            )
            # Every rep "drifted" (the held leads were written around the services): not news.
            logging.getLogger("routing.loads").setLevel(logging.ERROR)
            rep_loads_reconcile()
            logging.getLogger("routing.loads").setLevel(logging.NOTSET)
        redis.Redis.from_url(source_url).flushdb()
        analyze(connection)
        workers = Workers(2, dict(os.environ), Path(var_dir))
        try:
            workers.wait_ready(celery_app.control.ping)
            records = [
                {
                    "email": f"c{reps_n}-{i}@corp{i % 50}.example",
                    "country": "US",
                    "postal_code": f"{(i * 7919) % 100_000:05d}",
                }
                for i in range(args.leads)
            ]
            started = time.perf_counter()
            ids: set[uuid.UUID] = set()
            for b in range(0, len(records), 500):
                for outcome in lead_ingest_batch(source=source, records=records[b : b + 500]):
                    ids.add(outcome.lead_id)  # type: ignore[union-attr]
            deadline = time.monotonic() + max(300.0, args.leads / 2)
            while Lead.objects.filter(id__in=ids, status__in=final).count() < len(ids):
                if time.monotonic() > deadline:
                    raise SystemExit("not every lead was processed in time")
                time.sleep(0.1)
            rate = len(ids) / (time.perf_counter() - started)
        finally:
            workers.stop()
        assigned = Lead.objects.filter(id__in=ids, status=LeadStatus.ASSIGNED).count()
        label = f"{args.strategy}, {reps_n:,} capped reps, {held_n:,} open leads"
        rates.append((label, rate, assigned))
        print(f"  measured {label}", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, PostgreSQL {pg}, Redis broker; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"{args.leads} leads a run, 2 worker processes; 1,000 rules, 100,000 postal prefixes\n")
    print("| configuration | leads/s | assigned | ratio to 10 reps |")
    print("|---|---:|---:|---:|")
    for label, rate, assigned in rates:
        print(f"| {label} | {rate:,.1f} | {assigned} | {rate / rates[0][1]:.2f} |")
    shutil.rmtree(var_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
