"""Single-lead messages routed one by one and in batches, in-process: CPU and statements a lead.

    .venv/bin/python -m bench.single_messages [--leads 500] [--rounds 3]

Needs PostgreSQL (BENCH_DATABASE_URL, default a fresh `leadrouter_single_bench` on localhost); it
recreates and migrates that database and imports one round-robin team of 10 reps with one rule
sending every lead to it (bench.pipeline's configuration). Then, in alternating rounds so that
load on the machine hits both alike, it accepts ``--leads`` leads with the single-lead intake
service (published to a filesystem broker nobody reads) and runs ``routing.process_lead``'s
service once per lead, in the order they came, as a worker takes their messages from a backlog:

- **one by one**: ``ROUTING_BATCH_WAITING=false``, each message routes its own lead;
- **batched**: ``ROUTING_BATCH_WAITING=true`` (``ROUTING_BATCH_SIZE`` 50), a message routes its
  lead and the leads waiting beside it; the messages that come after find theirs done.

It prints, for each, this process's CPU time a lead (``time.process_time``: the worker's Python
side, not PostgreSQL's) and the statements a lead (every statement Django sends).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.pipeline import _document
from bench.route_lead import recreate_database

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--leads", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_single_bench"
    )
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "DATABASE_URL": database_url,
            "LEADROUTER_VAR_DIR": tempfile.mkdtemp(prefix="leadrouter-single-bench-"),
            "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
            "LOG_LEVEL": "WARNING",
            "DELIVERY_EMAIL_ENABLED": "false",
            "ENQUEUE_IN_BACKGROUND": "false",
            "ROUTING_BATCH_SIZE": "50",
        }
    )
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
    from django.db import connection

    from leads import services as lead_services
    from leads.models import Lead, LeadStatus, Source
    from routing.batch import lead_process_batched
    from routing.rules_io import rules_import

    rules_import(_document(), publish=True)
    source = Source.objects.create(slug="form", name="Form")
    results: dict[str, list[tuple[float, float]]] = {"one by one": [], "batched": []}
    serial = 0
    # Warm: the configuration compiled, each rep's counters row created.
    for mode in (False, True):
        settings.ROUTING_BATCH_WAITING = mode
        for _ in range(20):
            serial += 1
            accepted = lead_services.lead_ingest(
                source=source, record={"email": f"warm{serial}@corp.example"}
            )
            lead_process_batched(lead_id=str(accepted.lead_id))  # type: ignore[union-attr]
    for _round in range(args.rounds):
        for name, mode in (("one by one", False), ("batched", True)):
            settings.ROUTING_BATCH_WAITING = mode
            ids = []
            for _ in range(args.leads):
                serial += 1
                accepted = lead_services.lead_ingest(
                    source=source, record={"email": f"p{serial}@corp.example"}
                )
                ids.append(str(accepted.lead_id))  # type: ignore[union-attr]
            statements = [0]

            def count(execute, sql, params, many, context, statements=statements):  # type: ignore[no-untyped-def]
                statements[0] += 1
                return execute(sql, params, many, context)

            with connection.execute_wrapper(count):
                started = time.process_time()
                for lead_id in ids:
                    lead_process_batched(lead_id=lead_id)
                cpu = time.process_time() - started
            assert Lead.objects.filter(id__in=ids, status=LeadStatus.ASSIGNED).count() == len(ids)
            results[name].append((cpu * 1000 / len(ids), statements[0] / len(ids)))
    load = os.getloadavg()
    print(
        f"{args.leads} single-lead messages a round, {args.rounds} rounds alternating "
        f"(load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})"
    )
    for name, rows in results.items():
        cpu = [row[0] for row in rows]
        statements = [row[1] for row in rows]
        print(
            f"  {name:10}: CPU {statistics.median(cpu):.2f} ms a lead "
            f"(rounds {', '.join(f'{value:.2f}' for value in cpu)}); "
            f"statements {statistics.median(statements):.1f} a lead"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
