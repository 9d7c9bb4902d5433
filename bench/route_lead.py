"""route_lead on PostgreSQL: time and queries per lead by rule count and territory-table size.

    .venv/bin/python -m bench.route_lead [--leads 300]

Needs PostgreSQL (BENCH_DATABASE_URL, default a fresh `leadrouter_route_bench` on localhost). It
recreates that database, migrates it with manage.py, then runs in-process with the base settings.
Each scenario imports its configuration with ``rules_import(..., publish=True)``: a round-robin
team of 10 reps (no caps), and
  - 10 / 1,000 / 10,000 rules: all but the last ``country eq <code>`` for countries the leads are
    not in, then a final team rule (every lead is decided by the last rule);
  - 100 / 100,000 postal-prefix territory entries (1 x 100 and 1,000 x 100 prefixes, US, owned by
    the team) and a ruleset of one territory rule (then the team rule as a fallback);
  - company scale, issue 18's scenario (``--capped-reps``, default 1,000, ``--open-leads``,
    default 100,000): the team is that many reps, every one with max_open and max_per_day caps,
    holding that many open (untouched) leads between them, routed by 1,000 rules (998
    ``country eq`` rules no lead matches, a territory rule, the team rule) over 100,000 postal
    prefixes (1,000 x 100, every one the team's), round robin and least loaded, each beside the
    same rules and territories with 10 capped reps and no open leads (the 10-rep case); the
    ratio of the two (p50 and mean per decision, and queries) is printed after the table.
``--only TEXT`` runs only the scenarios whose label contains TEXT.
For every scenario it creates 2N normalised leads (email, email_domain, country, postal_code set
directly, status ``processing``) and times, in alternating blocks so that load on the machine hits
both alike:
  - ``route_lead(lead=...)`` on N of them (each call commits its own transaction);
  - the baseline on the other N: the same writes without the engine, with the ORM, in one
    ``transaction.atomic`` (UPDATE the team's rotation state, INSERT the Assignment, UPDATE the
    rep's last_assigned_at, UPDATE the rep's load counters, UPDATE the lead's status): what
    applying any decision costs at least.
Queries per lead are counted with CaptureQueriesContext, SAVEPOINT/RELEASE left out.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TEAM = "Inbound SDR"
REPS = 10
BLOCKS = 10


def recreate_database(database_url: str) -> None:
    from urllib.parse import urlparse

    import psycopg

    parsed = urlparse(database_url)
    name = parsed.path.lstrip("/")
    admin_url = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


# Time zones of the company-scale reps: "today" is each rep's own local day.
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Asia/Kolkata")


def _base_document(
    reps: int = REPS, strategy: str = "round_robin", caps: dict[str, int] | None = None
) -> dict[str, Any]:
    people = [
        {
            "email": f"rep{i}@bench.example",
            "name": f"Rep {i}",
            "timezone": ZONES[i % len(ZONES)] if caps else "UTC",
            **(caps or {}),
        }
        for i in range(reps)
    ]
    return {
        "reps": people,
        "teams": [
            {
                "name": TEAM,
                "strategy": strategy,
                "members": [{"rep": rep["email"], "weight": 1} for rep in people],
            }
        ],
    }


def _team_rule(priority: int) -> dict[str, Any]:
    return {"name": "Everyone else", "priority": priority, "action": {"type": "team", "team": TEAM}}


def _country_rules(count: int) -> list[dict[str, Any]]:
    # count - 1 rules for countries no lead comes from (indexed by the engine), then the team.
    rules = [
        {
            "name": f"country {i}",
            "priority": i,
            "when": {"field": "country", "op": "eq", "value": f"X{i:05d}"},
            "action": {"type": "team", "team": TEAM},
        }
        for i in range(count - 1)
    ]
    return [*rules, _team_rule(count)]


def _territories(count: int, per_territory: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"T{t:04d}",
            "countries": ["US"],
            "postal_prefixes": [f"{t * per_territory + j:05d}" for j in range(per_territory)],
            "team": TEAM,
        }
        for t in range(count)
    ]


def _samples(call: Callable[[Any], object], items: Sequence[Any]) -> list[int]:
    clock = time.perf_counter_ns
    samples = []
    for item in items:
        start = clock()
        call(item)
        samples.append(clock() - start)
    return samples


def _summary(samples: list[int]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    p50 = ordered[len(ordered) // 2] / 1e6
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1e6
    return p50, p99, 1e9 / statistics.fmean(ordered)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--leads", type=int, default=300, help="leads per scenario and path")
    parser.add_argument("--capped-reps", type=int, default=1_000, help="reps at company scale")
    parser.add_argument("--open-leads", type=int, default=100_000, help="their open leads")
    parser.add_argument("--only", default="", help="only the scenarios whose label has this")
    # `make bench` hands every benchmark the same arguments: ignore the ones meant for others.
    args, _others = parser.parse_known_args()

    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_route_bench"
    )
    var_dir = tempfile.mkdtemp(prefix="leadrouter-route-bench-")
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "DATABASE_URL": database_url,
            "LEADROUTER_VAR_DIR": var_dir,
            "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
            "LOG_LEVEL": "WARNING",
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

    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from leads.models import Lead, LeadStatus, Source
    from routing.decisions import clear_live_config_cache, route_lead
    from routing.loads import load_assigned, rep_loads_reconcile
    from routing.models import Assignment, AssignmentKind, Rep, Team, Territory
    from routing.rules_io import rules_import

    source = Source.objects.create(slug="bench", name="Bench")

    def make_leads(
        count: int, postal: Callable[[int], str], status: str = LeadStatus.PROCESSING
    ) -> list[Lead]:
        now = timezone.now()
        leads = [
            Lead(
                id=uuid.uuid4(),
                source=source,
                status=status,
                raw_payload={},
                request_fingerprint=uuid.uuid4().hex,
                email=f"lead{i}@corp{i % 50}.example",
                email_domain=f"corp{i % 50}.example",
                country="US",
                postal_code=postal(i),
                received_at=now,
                normalized_at=now,
            )
            for i in range(count)
        ]
        Lead.objects.bulk_create(leads, batch_size=1000)
        if status != LeadStatus.PROCESSING:
            return leads  # held, not routed: their ids are enough
        ids = [lead.id for lead in leads]
        by_id = Lead.objects.select_related("source").in_bulk(ids)
        return [by_id[i] for i in ids]  # as the worker has it: source selected with the lead

    def baseline(lead: Lead) -> None:
        # The writes route_lead makes for an assignment, without deciding or locking.
        now = timezone.now()
        team = team_row
        rep = reps[baseline.turn % len(reps)]  # type: ignore[attr-defined]
        baseline.turn += 1  # type: ignore[attr-defined]
        with transaction.atomic():
            Team.objects.filter(pk=team.pk).update(
                rotation_state={"team_id": team.pk, "last_rep_id": rep.pk}
            )
            Assignment.objects.create(
                lead=lead,
                rep_id=rep.pk,
                team_id=team.pk,
                rule_name="Everyone else",
                rep_name=rep.name,
                team_name=team.name,
                ruleset_version=1,
                kind=AssignmentKind.INITIAL,
                reason="baseline",
                trace=[],
                assigned_at=now,
                active=True,
            )
            Rep.objects.filter(pk=rep.pk).update(last_assigned_at=now)
            load_assigned(rep_id=rep.pk, zone_name=rep.timezone, now=now)
            lead.status = LeadStatus.ASSIGNED
            lead.processed_at = now
            lead.save(update_fields=["status", "processed_at"])

    baseline.turn = 0  # type: ignore[attr-defined]

    def route(lead: Lead) -> None:
        result = route_lead(lead=lead)
        if result.status != LeadStatus.ASSIGNED:
            raise SystemExit(f"lead not assigned: {result.decision.reason}")

    def queries(call: Callable[[Lead], object], lead: Lead) -> int:
        with CaptureQueriesContext(connection) as captured:
            call(lead)
        return sum(
            1
            for query in captured.captured_queries
            if not query["sql"].lstrip().upper().startswith(("SAVEPOINT", "RELEASE"))
        )

    def hold_open_leads(count: int) -> None:
        """``count`` open (untouched) leads spread over the team's reps, written in bulk, then
        the reps' load counters recounted from them (as the services would have kept them)."""
        if not count:
            return
        held = make_leads(count, lambda i: "99999", LeadStatus.ASSIGNED)
        now = timezone.now()
        Assignment.objects.bulk_create(
            [
                Assignment(
                    lead=lead,
                    rep_id=reps[i % len(reps)].pk,
                    team_id=team_row.pk,
                    rep_name=reps[i % len(reps)].name,
                    team_name=team_row.name,
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

    Scenario = tuple[str, dict[str, Any], Callable[[int], str], dict[str, Any], int]
    scenarios: list[Scenario] = []
    # Caps no lead reaches in the run: every decision reads them and passes.
    caps = {"max_open": args.open_leads + 10 * args.leads, "max_per_day": 10 * args.leads}
    for count in (10, 1_000, 10_000):
        scenarios.append(
            (
                f"{count:,} rules (country eq, last one a team)",
                {"ruleset": {"name": f"{count} rules", "rules": _country_rules(count)}},
                lambda i: f"{i % 100_000:05d}",
                {},
                0,
            )
        )
    territory_rules = {
        "name": "territories",
        "rules": [
            {"name": "By territory", "priority": 1, "action": {"type": "territory"}},
            _team_rule(2),
        ],
    }
    for count, per in ((1, 100), (1_000, 100)):
        entries = count * per
        scenarios.append(
            (
                f"territory rule, {entries:,} postal prefixes ({count:,} x {per})",
                {"territories": _territories(count, per), "ruleset": territory_rules},
                (lambda n: lambda i: f"{(i * 7919) % n:05d}")(entries),
                {},
                0,
            )
        )
    # Company scale: 1,000 rules (998 countries, a territory rule, the team); 100,000 prefixes.
    company_rules = {
        "name": "company",
        "rules": [
            *_country_rules(999)[:-1],
            {"name": "By territory", "priority": 998, "action": {"type": "territory"}},
            _team_rule(999),
        ],
    }
    company_document = {"territories": _territories(1_000, 100), "ruleset": company_rules}
    for strategy in ("round_robin", "least_loaded"):
        for reps_n, held_n in ((REPS, 0), (args.capped_reps, args.open_leads)):
            scenarios.append(
                (
                    f"{strategy}, {reps_n:,} capped reps, {held_n:,} open leads, "
                    "1,000 rules, 100,000 prefixes",
                    company_document,
                    lambda i: f"{(i * 7919) % 100_000:05d}",
                    {"reps": reps_n, "strategy": strategy, "caps": caps},
                    held_n,
                )
            )
    scenarios = [scenario for scenario in scenarios if args.only in scenario[0]]

    rows: list[dict[str, Any]] = []
    team_row: Team
    reps: list[Rep]
    for label, document, postal, company, held_n in scenarios:
        Territory.objects.all().delete()  # each territory scenario brings its own table
        # Each scenario's reps only (the previous scenarios' open leads go with their reps).
        Assignment.objects.all().delete()
        Rep.objects.all().delete()
        started = time.perf_counter()
        rules_import({**_base_document(**company), **document}, publish=True)
        imported = time.perf_counter() - started
        clear_live_config_cache()
        team_row = Team.objects.get(name=TEAM)
        reps = list(Rep.objects.order_by("email"))
        hold_open_leads(held_n)
        n = args.leads
        leads = make_leads(2 * n + 20, postal)
        warm, routed, based = leads[:20], leads[20 : 20 + n], leads[20 + n :]
        started = time.perf_counter()
        route(warm[0])  # compiles and caches the live configuration
        compiled = time.perf_counter() - started
        for lead in warm[1:10]:
            route(lead)
        for lead in warm[10:]:
            baseline(lead)
        # Query counts on the first lead of each path (not timed).
        route_queries = queries(route, routed[0])
        base_queries = queries(baseline, based[0])
        more_route = {queries(route, lead) for lead in routed[1:5]}
        routed, based = routed[5:], based[5:]
        gc.collect()
        route_samples: list[int] = []
        base_samples: list[int] = []
        block = max(len(routed) // BLOCKS, 1)
        for b in range(0, len(routed), block):
            route_samples += _samples(route, routed[b : b + block])
            base_samples += _samples(baseline, based[b : b + block])
        r50, r99, rrate = _summary(route_samples)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT AVG(jsonb_array_length(trace)), AVG(octet_length(trace::text)) "
                "FROM routing_assignment WHERE lead_id = ANY(%s)",
                [[lead.id for lead in routed]],
            )
            trace_entries, trace_bytes = cursor.fetchone()
        b50, b99, brate = _summary(base_samples)
        rows.append(
            {
                "label": label,
                "route": (r50, r99, rrate),
                "base": (b50, b99, brate),
                "route_mean": statistics.fmean(route_samples) / 1e6,
                "route_queries": route_queries,
                "stable": more_route == {route_queries},
                "base_queries": base_queries,
                "trace": (float(trace_entries), float(trace_bytes)),
                "import_s": imported,
                "compile_s": compiled,
            }
        )
        print(f"  measured {label}", flush=True)

    from django.conf import settings

    db = settings.DATABASES["default"]
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, PostgreSQL {pg} ({db['HOST']}), "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"{args.leads - 5} timed leads per path and scenario; one team of {REPS} reps (round "
        "robin, no caps) unless the scenario says otherwise\n"
    )
    print(
        "| scenario | route_lead p50 ms | p99 ms | decisions/s | baseline p50 ms | p99 ms "
        "| route_lead / baseline (p50) | queries per lead (baseline) | trace stored per lead |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        r50, r99, rrate = row["route"]
        b50, b99, _brate = row["base"]
        stable = "" if row["stable"] else " (varied)"
        print(
            f"| {row['label']} | {r50:.2f} | {r99:.2f} | {rrate:,.0f} | {b50:.2f} | {b99:.2f} "
            f"| {r50 / b50:.2f}x | {row['route_queries']}{stable} ({row['base_queries']}) "
            f"| {row['trace'][0]:,.0f} entries, {row['trace'][1] / 1024:,.0f} KiB |"
        )
    print()
    for row in rows:
        print(
            f"  {row['label']}: import {row['import_s']:.1f} s, first route_lead "
            f"(compiles the live configuration) {row['compile_s'] * 1000:.0f} ms"
        )
    pairs = [
        (small, large)
        for small in rows
        for large in rows
        if "capped" in small["label"]
        and small["label"].split(",")[0] == large["label"].split(",")[0]
        and f"{REPS} capped reps" in small["label"]
        and small is not large
    ]
    if pairs:
        print(
            "\ncompany scale: the large team against 10 reps, same rules and territories, "
            "same run\n"
        )
        print(
            "| strategy | p50 ms (10 reps) | p50 ratio | mean ms (10 reps) | mean ratio | queries |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for small, large in pairs:
            print(
                f"| {large['label']} | {large['route'][0]:.2f} ({small['route'][0]:.2f}) "
                f"| {large['route'][0] / small['route'][0]:.2f}x "
                f"| {large['route_mean']:.2f} ({small['route_mean']:.2f}) "
                f"| {large['route_mean'] / small['route_mean']:.2f}x "
                f"| {large['route_queries']} ({small['route_queries']}) |"
            )
    counts = {row["route_queries"] for row in rows}
    print(
        f"\nqueries per route_lead: {sorted(counts)} "
        f"{'- fixed across rules and territories' if len(counts) == 1 else '- NOT fixed'}"
    )
    connection.close()
    shutil.rmtree(var_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
