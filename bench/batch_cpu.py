"""The CPU a lead costs in a routing batch, in-process: Python and the PostgreSQL backend.

    .venv/bin/python -m bench.batch_cpu [--leads 2000] [--rounds 2] [--profile out.prof]

Needs PostgreSQL and Redis (BENCH_DATABASE_URL, default a fresh `leadrouter_batch_cpu_bench` on
localhost, recreated and migrated; BENCH_REDIS_URL, default database 6 of the local
Redis, flushed; the database analyzed before each round). ``bench.pipeline``'s configuration
(one round-robin team of 10 reps, one rule).
Each round accepts ``--leads`` leads by the batch intake service (their broker messages
dropped), then runs them through ``leads_process_chunk`` in chunks of 100, as a worker would,
and prints per lead: this process's CPU (``time.process_time``), its PostgreSQL backend's CPU
(user + system from /proc, when the server is on this machine), the wall time, and the
statements a batch of 50. A first round warms the caches and is not printed. ``--profile``
writes a cProfile (CPU clock) of one more round. Compare two versions alternating, in one
session: the figures move with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.route_lead import recreate_database

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--leads", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", default="")
    args, _others = parser.parse_known_args()
    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_batch_cpu_bench"
    )
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/6")
    var_dir = tempfile.mkdtemp(prefix="leadrouter-batch-cpu-")
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
            "DELIVERY_EMAIL_ENABLED": "false",
            "ENQUEUE_IN_BACKGROUND": "false",
            "SOURCE_CACHE_SECONDS": "0",
        }
    )
    import redis

    broker = redis.Redis.from_url(redis_url)
    broker.flushdb()
    recreate_database(database_url)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=dict(os.environ),
        check=True,
    )

    import django

    django.setup()

    from django.db import connection

    from bench.pipeline import _document, analyze
    from leads.models import Lead, LeadStatus, Source
    from leads.services import lead_ingest_batch
    from routing.rules_io import rules_import
    from routing.services import leads_process_chunk

    rules_import(_document(), publish=True)
    source = Source.objects.create(slug="bench", name="Bench", rate_limit_per_minute=10**6)

    def backend_cpu() -> float:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")  # the server is on another machine
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    statements = 0

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    def one_round(tag: str, profile: Any = None, *, show: bool = True) -> None:
        nonlocal statements
        records = [
            {"email": f"{tag}-{i}@corp{i % 50}.example", "country": "DE"} for i in range(args.leads)
        ]
        ids: list[str] = []
        for b in range(0, len(records), 500):
            for outcome in lead_ingest_batch(source=source, records=records[b : b + 500]):
                ids.append(str(outcome.lead_id))  # type: ignore[union-attr]
        broker.flushdb()  # no worker here: the chunks run below
        analyze(connection)  # as autovacuum would; analyzed empty, the tables look empty
        statements = 0
        db_before, cpu_before, wall_before = backend_cpu(), time.process_time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        with connection.execute_wrapper(count):
            for k in range(0, len(ids), 100):
                leads_process_chunk(lead_ids=ids[k : k + 100], slice_seconds=0)
        if profile is not None:
            profile.disable()
        cpu, wall = time.process_time() - cpu_before, time.perf_counter() - wall_before
        db = backend_cpu() - db_before
        n = len(ids)
        assigned = Lead.objects.filter(id__in=ids, status=LeadStatus.ASSIGNED).count()
        if not show:
            return
        print(
            f"{n} leads ({assigned} assigned): Python {1000 * cpu / n:.3f} ms a lead, "
            f"PostgreSQL backend {1000 * db / n:.3f} ms, wall {1000 * wall / n:.3f} ms; "
            f"{statements / (n / 50):.1f} statements a batch of 50",
            flush=True,
        )

    run = uuid.uuid4().hex[:6]
    one_round(f"{run}-warm", show=False)
    for i in range(args.rounds):
        one_round(f"{run}-{i}")
    if args.profile:
        import cProfile

        profile = cProfile.Profile(time.process_time)
        one_round(f"{run}-profile", profile)
        profile.dump_stats(args.profile)
        print(f"profile written to {args.profile}")
    shutil.rmtree(var_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
