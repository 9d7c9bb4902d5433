"""Privacy (issue 21): the cost of sealing personal audit data, on and off in one run.

    .venv/bin/python -m bench.privacy [--leads 400] [--pipeline-leads 1000] [--seconds 8]

Needs PostgreSQL and Redis (BENCH_DATABASE_URL, default a fresh `leadrouter_privacy_bench` on
localhost; BENCH_REDIS_URL, default database 7 of the local Redis, flushed; BENCH_CACHE_URL,
database 8) and, for intake, `wrk` (Debian package; without it that part is skipped, said so).
Sealing is switched with the setting ``PRIVACY_SEALING`` (in-process by ``override_settings``,
for workers and gunicorn by the environment). With sealing on and off it measures:

- **lead_process in-process**: ``--leads`` leads of new people (500 a batch through the batch
  intake service), then each routed by ``lead_process`` in this process, one after another: ms
  per lead (and the same for returning people, whose key exists);
- **pipeline**: ``--pipeline-leads`` leads processed by 2 ``celery -A config worker
  --concurrency 1`` processes (bench.pipeline's workers): leads per second;
- **single-lead intake**: gunicorn sync x2 and wrk (bench.intake's script): requests per
  second;
- **person-key statements per routed lead**: SELECTs (reads) and INSERTs on ``leads_personkey``
  while ``lead_process`` runs, for a new person and for a returning one with a cold cache.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.intake import WRK_SCRIPT, run_wrk, wait_ready
from bench.pipeline import Workers, _document
from bench.route_lead import recreate_database

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TOKEN = "bench-token-0123456789abcdef0123456789abcdef"  # noqa: S105 (a throwaway local token)
MODES = (("on", "true"), ("off", "false"))


def _gunicorn_rps(env: dict[str, str], seconds: int) -> float:
    port = 18950 + os.getpid() % 40
    server = subprocess.Popen(
        [str(BIN / "gunicorn"), "config.wsgi:application", "--config", "config/gunicorn.py"],
        cwd=ROOT,
        env={**env, "PORT": str(port), "WEB_CONCURRENCY": "2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_ready(port)
        url = f"http://127.0.0.1:{port}/api/v1/intake/bench/"
        script = WRK_SCRIPT % {"token": TOKEN}
        run_wrk(url, 2, 16, script)  # warm-up
        return run_wrk(url, seconds, 16, script)["rps"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--leads", type=int, default=400, help="leads per in-process run")
    parser.add_argument("--pipeline-leads", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=8, help="seconds per wrk run")
    args, _others = parser.parse_known_args()

    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_privacy_bench"
    )
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")
    cache_url = os.environ.get("BENCH_CACHE_URL", "redis://127.0.0.1:6379/8")
    var_dir = tempfile.mkdtemp(prefix="leadrouter-privacy-bench-")
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "CACHE_URL": cache_url,
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

    for url in (redis_url, cache_url):
        redis.Redis.from_url(url).flushdb()
    recreate_database(database_url)
    for command in (["migrate"], ["collectstatic"]):  # gunicorn's /readyz wants the manifest
        subprocess.run(
            [str(BIN / "python"), "manage.py", *command, "--noinput", "-v", "0"],
            cwd=ROOT,
            env=dict(os.environ),
            check=True,
        )

    import django

    django.setup()

    from django.db import connection
    from django.test import override_settings
    from django.test.utils import CaptureQueriesContext

    from config.celery import app as celery_app
    from leads import privacy
    from leads.models import Lead, LeadStatus, Source, token_digest
    from leads.services import lead_ingest_batch
    from routing.rules_io import rules_import
    from routing.services import lead_process

    rules_import(_document(), publish=True)
    source = Source.objects.create(
        slug="bench",
        name="Bench",
        rate_limit_per_minute=10**8,
        token_hash=token_digest(TOKEN),
        field_map={"Company": "company"},
    )
    final = (
        LeadStatus.ASSIGNED,
        LeadStatus.DUPLICATE,
        LeadStatus.EXCLUDED,
        LeadStatus.UNASSIGNED,
        LeadStatus.FAILED,
    )

    def ingest(prefix: str, count: int) -> list[uuid.UUID]:
        records = [
            {
                "email": f"{prefix}-{i}@corp{i % 50}.example",
                "first_name": "Ana",
                "last_name": f"Lopez {i}",
                "company": f"Corp {i % 50}",
                "phone": f"+4930{i:07d}",
                "country": "DE",
            }
            for i in range(count)
        ]
        ids: list[uuid.UUID] = []
        for b in range(0, count, 500):
            for outcome in lead_ingest_batch(source=source, records=records[b : b + 500]):
                ids.append(outcome.lead_id)  # type: ignore[union-attr]
        return ids

    def per_lead_ms(ids: list[uuid.UUID]) -> float:
        started = time.perf_counter()
        for lead_id in ids:
            lead_process(lead_id=lead_id)
        return (time.perf_counter() - started) * 1000 / len(ids)

    def key_statements(lead_id: uuid.UUID) -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            lead_process(lead_id=lead_id)
        on_keys = [q["sql"] for q in queries.captured_queries if '"leads_personkey"' in q["sql"]]
        reads = sum(sql.lstrip().upper().startswith("SELECT") for sql in on_keys)
        return reads, len(on_keys) - reads

    results: dict[str, dict[str, Any]] = {}
    wrk_missing = shutil.which("wrk") is None
    log_dir = Path(var_dir)
    for mode, flag in MODES:
        found: dict[str, Any] = {}
        with override_settings(PRIVACY_SEALING=flag == "true"):
            privacy.cache_clear()
            per_lead_ms(ingest(f"warm-{mode}", 30))
            found["new_ms"] = per_lead_ms(ingest(f"new-{mode}", args.leads))
            privacy.cache_clear()
            found["returning_ms"] = per_lead_ms(ingest(f"new-{mode}", args.leads))
            privacy.cache_clear()
            found["keys_new"] = key_statements(ingest(f"probe-{mode}", 1)[0])
            privacy.cache_clear()
            found["keys_returning"] = key_statements(ingest(f"probe-{mode}", 1)[0])
        env = {**os.environ, "PRIVACY_SEALING": flag}
        # The messages the in-process leads and the previous intake run published: not this
        # pipeline's work (the previous mode's intake leads would be routed first).
        redis.Redis.from_url(redis_url).flushdb()
        workers = Workers(2, env, log_dir)
        try:
            workers.wait_ready(celery_app.control.ping)
            started = time.perf_counter()
            ids = set(ingest(f"pipe-{mode}", args.pipeline_leads))
            deadline = time.monotonic() + max(120.0, args.pipeline_leads / 5)
            while Lead.objects.filter(id__in=ids, status__in=final).count() < len(ids):
                if time.monotonic() > deadline:
                    raise SystemExit("the workers did not finish the pipeline leads")
                time.sleep(0.05)
            found["pipeline"] = len(ids) / (time.perf_counter() - started)
        finally:
            workers.stop()
        found["intake"] = float("nan") if wrk_missing else _gunicorn_rps(env, args.seconds)
        sealed = Lead.objects.filter(
            email__startswith=f"new-{mode}-", person_key__isnull=False
        ).count()
        found["sealed_leads"] = sealed
        results[mode] = found

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
    on, off = results["on"], results["off"]
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cores (shared), Python "
        f"{platform.python_version()}, PostgreSQL {pg}, Redis broker; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"{args.leads} leads per in-process run, {args.pipeline_leads} per pipeline run, wrk "
        f"-t2 -c16 -d{args.seconds}s; leads of people with a key: on {on['sealed_leads']}, "
        f"off {off['sealed_leads']}\n"
    )
    print("| measure | sealing on | sealing off | on / off |")
    print("| --- | ---: | ---: | ---: |")
    rows = [
        ("lead_process, new people (ms/lead)", "new_ms", "{:.2f}"),
        ("lead_process, returning people, cold cache (ms/lead)", "returning_ms", "{:.2f}"),
        ("pipeline, 2 worker processes (leads/s)", "pipeline", "{:,.0f}"),
        ("single-lead intake, gunicorn x2 (req/s)", "intake", "{:,.0f}"),
    ]
    for label, key, form in rows:
        ratio = on[key] / off[key] if off[key] == off[key] and off[key] else float("nan")
        print(f"| {label} | {form.format(on[key])} | {form.format(off[key])} | {ratio:.2f} |")
    for label, key in (("new person", "keys_new"), ("returning person", "keys_returning")):
        (r_on, w_on), (r_off, w_off) = on[key], off[key]
        print(
            f"| person-key reads (writes) per routed lead, {label} | {r_on} ({w_on}) | "
            f"{r_off} ({w_off}) | |"
        )
    if wrk_missing:
        print("\nwrk is not installed (Debian package `wrk`): single-lead intake not measured")
    shutil.rmtree(var_dir, ignore_errors=True)
    reads_ok = on["keys_new"][0] <= 1 and on["keys_returning"][0] <= 1
    if not reads_ok:
        print("MORE THAN ONE PERSON-KEY READ PER LEAD", file=sys.stderr)
    return 0 if reads_ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
