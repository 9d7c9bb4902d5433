"""The dashboard's reports over 1 hour to 90 days on PostgreSQL, on a million leads.

    .venv/bin/python -m bench.reports [--leads 1000000] [--runs 3] [--plans FILE]

Needs PostgreSQL (BENCH_DATABASE_URL, default a fresh `leadrouter_reports_bench` on localhost).
It recreates that database, migrates it, and fills it with INSERT ... SELECT FROM
generate_series: N leads received evenly over the last 90 days (92 % assigned, 4 % excluded,
2 % unassigned, 2 % duplicates given to the original's owner), one first assignment per
assigned lead to one of 200 reps in 8 teams (round robin, weighted, least loaded; reps in five
time zones), 70 % of them touched, a 60-minute SLA on each; 1.5 % of the leads reassigned once
(by the SLA, by hand, in the CRM, by the rules after an absence); the audit events the
dashboard reads (assigned, excluded, unassigned, reassigned, sla_breached). The fill runs with
triggers off (``session_replication_role = replica``); the report rollups are then computed by
the backfill (``audit.rollups.rollups_rebuild``, timed), and the reps' load counters by the
reconciliation (``routing.loads.rep_loads_reconcile``: "Open now" reads them). Then, for each
window (1h, 24h, 7d, 30d, 90d; all teams and 2 of the 8), it times every report the page
builds (the median of ``--runs``, in milliseconds; the totals, team and rep tables are read
together, as the page does) and the whole dashboard, twice: over the raw rows only (the path
before the rollups, kept for windows of a week or less) and as the page reads them now (the
rollups for windows over a week). Last, per window (all teams, as the page reads it now), the
query side: every query the whole dashboard runs, under EXPLAIN (ANALYZE, BUFFERS), their
execution times added up (less sensitive to the machine's load than the wall clock, which
includes Python); the plans go to ``--plans`` (default: a file under the temporary var
directory, named at the end).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.route_lead import recreate_database

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

TEAMS = 8
REPS = 200
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Asia/Kolkata")
STRATEGIES = ("round_robin", "weighted", "least_loaded")
WINDOWS = ("1h", "24h", "7d", "30d", "90d")

# The leads: n = 1..N, received evenly over 90 days back from now; the status by n % 50.
FILL_LEADS = """
INSERT INTO leads_lead (id, status, raw_payload, email, email_domain, first_name, last_name,
  phone, company, domain, title, country, region, city, postal_code, industry, utm_source,
  utm_medium, utm_campaign, custom, flags, request_fingerprint, received_at, queued_at,
  attempts, last_error, source_id, dedup_key, enrichment, enrichment_attempts,
  enrichment_status, deferrals, unassigned_retries, crm, crm_status, crm_attempts, "fetch",
  fetch_status, fetch_attempts, priority, tags, lane)
SELECT md5('lead' || n)::uuid,
  CASE WHEN n %% 50 IN (1, 2) THEN 'excluded' WHEN n %% 50 = 3 THEN 'unassigned'
       WHEN n %% 50 = 4 THEN 'duplicate' ELSE 'assigned' END,
  '{}'::jsonb, 'p' || n || '@bench.example', 'bench.example', 'P', 'Q', '', 'Co', '', '', 'DE',
  '', '', '', '', '', '', '', '{}'::jsonb, '[]'::jsonb, md5(n::text) || md5((n + 1)::text),
  now() - n * %(spacing)s::float8 * interval '1 second',
  now() - n * %(spacing)s::float8 * interval '1 second', 1, '', %(source)s, '', '{}'::jsonb, 0,
  '', 0, 0, '{}'::jsonb, '', 0, '{}'::jsonb, '', 0, '', '[]'::jsonb, 'normal'
FROM generate_series(1, %(leads)s) AS n
"""

# One first assignment per assigned or duplicate lead, 5 to 125 s after it was received; a
# reassigned lead's first assignment is no longer active.
FILL_ASSIGNMENTS = """
INSERT INTO routing_assignment (lead_id, rep_id, team_id, rule_name, rep_name, team_name, kind,
  reason, trace, sla_minutes, sla_due_at, touched_at, touch_source, assigned_at, active,
  priority, tags)
SELECT l.id, r.id, m.team_id, 'Bench', r.name, t.name,
  CASE WHEN g.n %% 50 = 4 THEN 'duplicate' ELSE 'initial' END, '', '[]'::jsonb, 60,
  g.at + interval '60 minutes',
  CASE WHEN g.n %% 10 < 7 THEN g.at + ((g.n %% 97) * 60 || ' seconds')::interval END,
  CASE WHEN g.n %% 10 < 7 THEN 'leadrouter' ELSE '' END, g.at, g.n %% 67 <> 0, '', '[]'::jsonb
FROM (
  SELECT n, l.received_at + ((5 + n %% 120) || ' seconds')::interval AS at
  FROM generate_series(1, %(leads)s) AS n JOIN leads_lead l ON l.id = md5('lead' || n)::uuid
  WHERE n %% 50 NOT IN (1, 2, 3)
) AS g
JOIN leads_lead l ON l.id = md5('lead' || g.n)::uuid
JOIN routing_rep r ON r.email = 'rep' || (g.n %% %(reps)s) || '@bench.example'
JOIN routing_teammembership m ON m.rep_id = r.id
JOIN routing_team t ON t.id = m.team_id
"""

# Every 67th assigned lead reassigned once, 70 minutes later, to the next rep of its team.
FILL_REASSIGNMENTS = """
INSERT INTO routing_assignment (lead_id, rep_id, team_id, rule_name, rep_name, team_name, kind,
  reason, trace, sla_minutes, sla_due_at, touched_at, touch_source, assigned_at, supersedes_id,
  active, priority, tags)
SELECT a.lead_id, nr.id, a.team_id, a.rule_name, nr.name, a.team_name, 'reassignment',
  CASE a.id %% 4 WHEN 0 THEN 'SLA of 60 min missed' WHEN 1 THEN 'reassigned by hand'
       WHEN 2 THEN 'reassigned in HubSpot' ELSE 'rerouted' END,
  '[]'::jsonb, 60, a.assigned_at + interval '130 minutes', NULL, '',
  a.assigned_at + interval '70 minutes', a.id, true, '', '[]'::jsonb
FROM routing_assignment a
JOIN routing_rep cur ON cur.id = a.rep_id
JOIN routing_rep nr ON nr.email = 'rep'
  || ((split_part(substring(cur.email from 4), '@', 1)::int + %(teams)s) %% %(reps)s)
  || '@bench.example'
WHERE NOT a.active
"""

# The events: one routed event per lead, one reassigned event per reassignment (its data as
# the services write it), an sla_breached for every reassignment by the SLA.
FILL_EVENTS = """
INSERT INTO audit_event (chain, seq, lead_id, type, at, actor, rep_id, team_id, rule_id,
  rep_name, team_name, rule_name, data, trace, prev_hash, hash)
SELECT l.id::text, 2, l.id,
  CASE l.status WHEN 'excluded' THEN 'excluded' WHEN 'unassigned' THEN 'unassigned'
       ELSE 'assigned' END,
  coalesce(a.assigned_at, l.received_at + interval '30 seconds'), 'system', a.rep_id,
  a.team_id, NULL, coalesce(a.rep_name, ''), coalesce(a.team_name, ''), '', '{}'::jsonb,
  '[]'::jsonb, '', md5(l.id::text)
FROM leads_lead l
LEFT JOIN routing_assignment a ON a.lead_id = l.id AND a.kind <> 'reassignment';

INSERT INTO audit_event (chain, seq, lead_id, type, at, actor, rep_id, team_id, rule_id,
  rep_name, team_name, rule_name, data, trace, prev_hash, hash)
SELECT r.lead_id::text, 3, r.lead_id, 'reassigned', r.assigned_at,
  CASE r.supersedes_id %% 4 WHEN 1 THEN 'user:mia' WHEN 2 THEN 'crm:hubspot' ELSE 'system' END,
  r.rep_id, r.team_id, NULL, r.rep_name, r.team_name, '',
  jsonb_build_object('from', jsonb_build_object('id', s.rep_id, 'name', s.rep_name))
    || CASE r.supersedes_id %% 4
         WHEN 0 THEN '{"manual": false, "reason": "sla_breached"}'::jsonb
         WHEN 1 THEN '{"manual": true, "reason": "on leave"}'::jsonb
         WHEN 2 THEN '{"manual": false, "crm": "hubspot", "reason": "in HubSpot"}'::jsonb
         ELSE '{"manual": false, "reason": "out of office"}'::jsonb END,
  '[]'::jsonb, '', md5(r.id::text)
FROM routing_assignment r JOIN routing_assignment s ON s.id = r.supersedes_id;

INSERT INTO audit_event (chain, seq, lead_id, type, at, actor, rep_id, team_id, rule_id,
  rep_name, team_name, rule_name, data, trace, prev_hash, hash)
SELECT s.lead_id::text, 4, s.lead_id, 'sla_breached', s.sla_due_at, 'system', s.rep_id,
  s.team_id, NULL, s.rep_name, s.team_name, '', '{}'::jsonb, '[]'::jsonb, '', md5(s.id::text)
FROM routing_assignment r JOIN routing_assignment s ON s.id = r.supersedes_id
WHERE r.supersedes_id %% 4 = 0;
"""


def _people() -> None:
    from routing.models import Rep, Team, TeamMembership

    teams = [
        Team.objects.create(name=f"Team {t}", strategy=STRATEGIES[t % len(STRATEGIES)])
        for t in range(TEAMS)
    ]
    for i in range(REPS):
        rep = Rep.objects.create(
            email=f"rep{i}@bench.example",
            name=f"Rep {i}",
            timezone=ZONES[i % len(ZONES)],
            max_per_day=200,
        )
        TeamMembership.objects.create(
            team=teams[i % TEAMS], rep=rep, position=i // TEAMS, weight=1 + i % 3
        )


def _median_ms(call: Callable[[], Any], runs: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _paths(raw: bool) -> None:
    """Raw rows only (the path before the rollups), or the rollups beyond a week."""
    from datetime import timedelta

    from audit import reports

    reports.ROLLUP_AFTER = timedelta(days=10_000) if raw else timedelta(days=7)


def _reports(window: str, team_ids: list[int] | None = None) -> dict[str, Callable[[], Any]]:
    from django.utils import timezone

    from audit import dashboard, reports

    query = dashboard.dashboard_query({"window": window})
    _, bucket = reports.bucket_parse(query.bucket, query.window)
    span = reports.span_of(query.window, bucket, timezone.now())
    return {
        "intake chart": lambda: reports.intake_counts(span),
        "routed chart": lambda: reports.routed_counts(span),
        "outcomes": lambda: reports.outcomes(span=span),
        "tables": lambda: reports.window_tables(span=span, team_ids=team_ids),
        "fairness": lambda: reports.fairness(span=span, team_ids=team_ids),
        "SLA breaches today": lambda: reports.sla_breaches_today(now=span.now),
        "whole dashboard": lambda: dashboard.dashboard(query=query, team_ids=team_ids),
    }


def _plans(out: Any, window: str) -> tuple[float, int]:
    """EXPLAIN (ANALYZE, BUFFERS) of every query the whole dashboard runs over ``window``
    (all teams), written to ``out``; returns their execution times added up (ms) and how many."""
    import re

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        _reports(window)["whole dashboard"]()
    total, count = 0.0, 0
    print(f"# window {window}\n", file=out)
    for query in captured.captured_queries:
        sql = query["sql"]
        if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
            continue
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        found = re.search(r"Execution Time: ([0-9.]+) ms", plan)
        total += float(found.group(1)) if found else 0.0
        count += 1
        print(f"## {window}\n\n{sql}\n\n{plan}\n", file=out, flush=True)
    return total, count


def _fill(leads: int) -> None:
    """The leads, assignments and events, by INSERT ... SELECT with triggers off."""
    from django.db import connection

    from leads.models import Source, token_digest

    source = Source.objects.create(
        slug="bench", name="Bench", token_hash=token_digest("bench"), token_hint=""
    )
    _people()
    started = time.perf_counter()
    spacing = 90 * 86400 / leads
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")  # no triggers while filling
        cursor.execute(
            FILL_LEADS, {"source": source.pk, "leads": leads, "spacing": f"{spacing:.6f}"}
        )
        cursor.execute("ANALYZE leads_lead")
        cursor.execute(FILL_ASSIGNMENTS, {"leads": leads, "reps": REPS})
        cursor.execute(FILL_REASSIGNMENTS, {"teams": TEAMS, "reps": REPS})
        cursor.execute(FILL_EVENTS, {})
        cursor.execute("SET session_replication_role = DEFAULT")
        for table in ("leads_lead", "routing_assignment", "audit_event"):
            cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("SELECT count(*) FROM routing_assignment")
        assignments = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM audit_event")
        events = cursor.fetchone()[0]
    print(
        f"{leads:,} leads, {assignments:,} assignments, {events:,} events "
        f"in {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--leads", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plans", default="")
    parser.add_argument(
        "--windows", default=",".join(WINDOWS), help="the windows to time, comma-separated"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="time an already filled database (no refill)"
    )
    args, _others = parser.parse_known_args()

    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_reports_bench"
    )
    var = tempfile.mkdtemp(prefix="leadrouter-reports-bench-")
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "DATABASE_URL": database_url,
            "LEADROUTER_VAR_DIR": var,
            "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
            "LOG_LEVEL": "WARNING",
        }
    )
    if not args.reuse:
        recreate_database(database_url)
        subprocess.run(
            [str(BIN / "python"), "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            check=True,
        )

    import django

    django.setup()
    from django.db import connection

    if not args.reuse:
        _fill(args.leads)
    from django.db import transaction

    from audit.rollups import rollups_rebuild

    started = time.perf_counter()
    with transaction.atomic():
        rollups_rebuild(connection)
    with connection.cursor() as cursor:
        for table in ("audit_reportslot", "audit_assignmentday"):
            cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("SELECT count(*) FROM audit_reportslot")
        slots = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM audit_assignmentday")
        days = cursor.fetchone()[0]
    print(
        f"rollups backfilled in {time.perf_counter() - started:.0f} s: {slots:,} slot rows, "
        f"{days:,} day rows",
        flush=True,
    )
    from routing.loads import rep_loads_reconcile
    from routing.models import RepLoad

    if RepLoad.objects.count() < REPS:  # the fill writes around the services
        report = rep_loads_reconcile()
        print(f"load counters: {report.repaired} reps counted", flush=True)
    from routing.models import Team

    scoped = list(Team.objects.order_by("pk").values_list("pk", flat=True)[:2])
    windows = [w for w in args.windows.split(",") if w in WINDOWS]
    for window in windows:
        for scope, team_ids in (("all teams", None), ("2 teams", scoped)):
            print(f"\nwindow {window}, {scope} (median of {args.runs}, ms): raw rows, now")
            timed: dict[str, list[float]] = {}
            for raw in (True, False):
                _paths(raw)
                for label, call in _reports(window, team_ids).items():
                    timed.setdefault(label, []).append(_median_ms(call, args.runs))
            for label, (before, after) in timed.items():
                print(f"  {label:<20} {before:>8.0f} {after:>8.0f}", flush=True)
    _paths(False)
    target = Path(args.plans) if args.plans else Path(var) / "plans.txt"
    print("\nquery side, whole dashboard, all teams (EXPLAIN ANALYZE execution times added up)")
    with target.open("w") as out:
        for window in windows:
            total, count = _plans(out, window)
            print(f"  {window:<5} {total:>8.0f} ms in {count} queries", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f}; query plans: {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
