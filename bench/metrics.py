"""/metrics and check_backlog on a large database: whole-table counts against incremental ones.

    .venv/bin/python -m bench.metrics [--leads 300000] [--repeat 7] [--keep]

Needs PostgreSQL (BENCH_DATABASE_URL, default a fresh `leadrouter_metrics_bench` on localhost).
It recreates that database, migrates it, and seeds N leads with SQL (``generate_series``): 93 %
assigned, 5 % duplicate, 1 % excluded, 0.5 % unassigned, 0.1 % received, a few processing; a
`received` event and an outcome event per processed lead, an assignment per owned lead, an
`sla_breached` event for 1 % of them. Then, in one run, timed ``--repeat`` times each (median):

  - **before**: the statements /metrics and check_backlog ran until now (``legacy_*`` below,
    kept verbatim as the baseline): aggregates over the whole leads, events and assignments
    tables at every scrape and every check;
  - **after**: ``metrics_snapshot()`` (the counters' stored totals plus the rows past their
    marks, the gauges from indexes) with a realistic tail past the marks (a minute of traffic at
    50 leads/s), and ``backlog_measure()``'s database part;
  - the refresh that moves the marks (``counters_refresh``: the rows since the last mark), and
    the leads-per-status recount it does every ``METRICS_STATUS_REFRESH_SECONDS``.

Both paths must give the same numbers; the run fails otherwise. ``--keep`` keeps the database.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TAIL_LEADS = 3000  # a minute of traffic at 50 leads/s past the marks


def recreate_database(database_url: str) -> None:
    from urllib.parse import urlparse

    import psycopg

    parsed = urlparse(database_url)
    name = parsed.path.lstrip("/")
    admin_url = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(database_url: str) -> None:
    from urllib.parse import urlparse

    import psycopg

    parsed = urlparse(database_url)
    admin_url = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parsed.path.lstrip("/")}" WITH (FORCE)')


_LEAD_STATUS = """CASE
    WHEN g %% 1000 = 0 THEN 'received'
    WHEN g %% 1000 = 1 THEN 'processing'
    WHEN g %% 200 = 2 THEN 'unassigned'
    WHEN g %% 100 = 3 THEN 'excluded'
    WHEN g %% 20 = 4 THEN 'duplicate'
    ELSE 'assigned' END"""


def seed(cursor: Any, *, first: int, count: int, source_id: int, rep_id: int, t0: str) -> None:
    """Leads g in [first, first + count), received one 20 ms apart from t0, with their events
    and assignments (audit rows with placeholder hashes: the chain is not what is measured)."""
    last = first + count - 1
    cursor.execute(
        f"""
        INSERT INTO leads_lead (id, status, raw_payload, email, email_domain, first_name,
            last_name, phone, company, domain, title, country, region, city, postal_code,
            industry, utm_source, utm_medium, utm_campaign, custom, flags, request_fingerprint,
            received_at, attempts, last_error, source_id, dedup_key, enrichment,
            enrichment_attempts, enrichment_status, deferrals, processed_at, claimed_until)
        SELECT md5('lead' || g)::uuid, {_LEAD_STATUS}, '{{}}', 'v' || g || '@example.com',
            'example.com', '', '', '', '', '', '', 'US', '', '', '', '', '', '', '', '{{}}',
            '{{}}', '', %(t0)s::timestamptz + g * interval '20 ms', 1, '', %(source)s,
            'v' || g, '{{}}', 0, 'none', 0, %(t0)s::timestamptz + g * interval '20 ms',
            CASE WHEN g %% 1000 = 1 THEN now() - interval '1 hour' END
        FROM generate_series(%(first)s, %(last)s) AS g
        """,  # noqa: S608 - constant SQL fragments; the values are parameters
        {"t0": t0, "source": source_id, "first": first, "last": last},
    )
    cursor.execute(
        """
        INSERT INTO audit_event (chain, seq, lead_id, type, at, actor, rep_name, team_name,
            rule_name, data, trace, prev_hash, hash)
        SELECT l.id::text, 1, l.id, 'received', l.received_at, 'source:bench', '', '', '',
            '{}', '[]', '', md5(l.id::text || 'r')
        FROM leads_lead l WHERE l.received_at >= %(t0)s::timestamptz + %(first)s * interval '20 ms'
            AND l.received_at <= %(t0)s::timestamptz + %(last)s * interval '20 ms'
        ORDER BY l.received_at
        """,
        {"t0": t0, "first": first, "last": last},
    )
    outcome = """CASE l.status WHEN 'duplicate' THEN 'assigned' ELSE l.status END"""
    cursor.execute(
        f"""
        INSERT INTO audit_event (chain, seq, lead_id, type, at, actor, rep_name, team_name,
            rule_name, data, trace, prev_hash, hash)
        SELECT l.id::text, 2, l.id, {outcome}, l.received_at + interval '2 s', 'system', '',
            '', '', CASE WHEN l.status = 'duplicate' THEN '{{"kind": "duplicate"}}'::jsonb
                ELSE '{{"kind": "initial"}}'::jsonb END, '[]', '', md5(l.id::text || 'o')
        FROM leads_lead l
        WHERE l.status IN ('assigned', 'duplicate', 'excluded', 'unassigned')
            AND l.received_at >= %(t0)s::timestamptz + %(first)s * interval '20 ms'
            AND l.received_at <= %(t0)s::timestamptz + %(last)s * interval '20 ms'
        ORDER BY l.received_at
        """,  # noqa: S608 - constant SQL fragments; the values are parameters
        {"t0": t0, "first": first, "last": last},
    )
    cursor.execute(
        """
        INSERT INTO routing_assignment (lead_id, rep_id, rule_name, rep_name, team_name, kind,
            reason, trace, sla_minutes, sla_due_at, touched_at, assigned_at, active)
        SELECT l.id, %(rep)s, '', 'Rep', '', CASE WHEN l.status = 'duplicate'
            THEN 'duplicate' ELSE 'initial' END, '', '[]', 30,
            l.received_at + interval '30 min', l.received_at + interval '5 min',
            l.received_at + (random() * 20) * interval '1 s', true
        FROM leads_lead l WHERE l.status IN ('assigned', 'duplicate')
            AND l.received_at >= %(t0)s::timestamptz + %(first)s * interval '20 ms'
            AND l.received_at <= %(t0)s::timestamptz + %(last)s * interval '20 ms'
        ORDER BY l.received_at
        """,
        {"t0": t0, "rep": rep_id, "first": first, "last": last},
    )
    cursor.execute(
        """
        INSERT INTO audit_event (chain, seq, lead_id, type, at, actor, rep_name, team_name,
            rule_name, data, trace, prev_hash, hash)
        SELECT l.id::text, 3, l.id, 'sla_breached', l.received_at + interval '31 min',
            'system', '', '', '', '{}', '[]', '', md5(l.id::text || 's')
        FROM leads_lead l WHERE l.status = 'assigned' AND abs(hashtext(l.id::text)) %% 100 = 0
            AND l.received_at >= %(t0)s::timestamptz + %(first)s * interval '20 ms'
            AND l.received_at <= %(t0)s::timestamptz + %(last)s * interval '20 ms'
        """,
        {"t0": t0, "first": first, "last": last},
    )


# --- The baseline: what /metrics and check_backlog ran before (whole-table aggregates) --------


def legacy_metrics() -> dict[str, Any]:
    from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, Sum

    from audit.models import Event, EventType
    from leads.models import Lead, LeadStatus
    from routing.models import Assignment, AssignmentKind
    from routing.monitoring.counters import _OUTCOME_CONDITIONS, _OUTCOME_EVENTS

    out: dict[str, Any] = {}
    out["received"] = dict(
        Lead.objects.order_by()
        .values_list("source__slug")
        .annotate(n=Count("id"))
        .values_list("source__slug", "n")
    )
    out["statuses"] = dict(
        Lead.objects.order_by()
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    out["outcomes"] = Event.objects.filter(type__in=_OUTCOME_EVENTS).aggregate(
        **{s: Count("id", filter=c) for s, c in _OUTCOME_CONDITIONS.items()}
    )
    waited = ExpressionWrapper(
        F("assigned_at") - F("lead__received_at"), output_field=DurationField()
    )
    out["hist"] = (
        Assignment.objects.filter(kind__in=(AssignmentKind.INITIAL, AssignmentKind.DUPLICATE))
        .annotate(waited=waited)
        .aggregate(
            count=Count("id"),
            total=Sum("waited"),
            le_60=Count("id", filter=Q(waited__lte=timedelta(seconds=60))),
        )
    )
    out["waiting"] = Lead.objects.aggregate(
        n=Count("id", filter=Q(status=LeadStatus.RECEIVED)),
        oldest=Min("received_at", filter=Q(status=LeadStatus.RECEIVED)),
    )
    out["events"] = Event.objects.aggregate(
        sla=Count("id", filter=Q(type=EventType.SLA_BREACHED)),
        delivery=Count("id", filter=Q(type=EventType.DELIVERY_FAILED)),
        reassigned=Count("id", filter=Q(type=EventType.REASSIGNED)),
    )
    return out


def legacy_backlog() -> dict[str, Any]:
    from django.db.models import Count, Min, Q
    from django.utils import timezone

    from leads.models import Lead, LeadStatus

    now = timezone.now()
    return Lead.objects.aggregate(
        received=Count("id", filter=Q(status=LeadStatus.RECEIVED)),
        oldest_received=Min("received_at", filter=Q(status=LeadStatus.RECEIVED)),
        stuck=Count("id", filter=Q(status=LeadStatus.PROCESSING, claimed_until__lt=now)),
        unassigned=Count("id", filter=Q(status=LeadStatus.UNASSIGNED)),
        oldest_unassigned=Min("received_at", filter=Q(status=LeadStatus.UNASSIGNED)),
    )


def backlog_database_part() -> None:
    """``backlog_measure`` without the broker round trip and the heartbeats (not measured)."""
    from django.utils import timezone

    from leads.models import Lead, LeadStatus
    from routing.monitoring.backlog import _oldest

    now = timezone.now()
    received = Lead.objects.filter(status=LeadStatus.RECEIVED)
    unassigned = Lead.objects.filter(status=LeadStatus.UNASSIGNED)
    received.count()
    _oldest(received)
    Lead.objects.filter(status=LeadStatus.PROCESSING, claimed_until__lt=now).count()
    unassigned.count()
    _oldest(unassigned)


def timed(call: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leads", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_metrics_bench"
    )
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "DATABASE_URL": database_url,
            "METRICS_REFRESH_SECONDS": "1000000",  # refreshes are timed on their own
        }
    )
    recreate_database(database_url)
    subprocess.run(
        [str(BIN / "python"), "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=dict(os.environ),
        check=True,
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from leads.models import Source
    from routing.models import Rep
    from routing.monitoring.counters import counters_refresh
    from routing.monitoring.metrics import metrics_snapshot

    source = Source.objects.create(slug="webinar", name="Webinar")
    rep = Rep.objects.create(email="rep@bench.example", name="Rep")
    n = args.leads
    t0 = (timezone.now() - timedelta(seconds=n * 0.02 + 3600)).isoformat()
    started = time.perf_counter()
    with connection.cursor() as cursor:
        for first in range(1, n + 1, 100_000):
            seed(
                cursor,
                first=first,
                count=min(100_000, n + 1 - first),
                source_id=source.pk,
                rep_id=rep.pk,
                t0=t0,
            )
        cursor.execute("VACUUM ANALYZE")
        cursor.execute("SELECT count(*) FROM audit_event")
        events = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM routing_assignment")
        assignments = cursor.fetchone()[0]
    print(
        f"seeded {n:,} leads, {events:,} events, {assignments:,} assignments in "
        f"{time.perf_counter() - started:.0f} s",
        flush=True,
    )

    # Steady state: the marks settled over everything seeded, then a minute of traffic past them.
    now = timezone.now()
    counters_refresh(now=now)
    settle = timedelta(seconds=settings.METRICS_SETTLE_SECONDS + 1)
    refresh_first = timed(lambda: counters_refresh(now=now + settle), 1)
    with connection.cursor() as cursor:
        seed(
            cursor,
            first=n + 1,
            count=TAIL_LEADS,
            source_id=source.pk,
            rep_id=rep.pk,
            t0=(now + settle - timedelta(seconds=n * 0.02)).isoformat(),
        )
        cursor.execute("ANALYZE")

    before = legacy_metrics()
    after = metrics_snapshot()
    expect = {
        "received": before["received"].get("webinar"),
        "assigned": before["outcomes"][("assigned")],
        "duplicate": before["outcomes"]["duplicate"],
        "hist_count": before["hist"]["count"],
        "sla": before["events"]["sla"],
        "backlog": before["waiting"]["n"],
    }
    got = {
        "received": after.received_by_source.get("webinar"),
        "assigned": after.processed_by_status["assigned"],
        "duplicate": after.processed_by_status["duplicate"],
        "hist_count": after.assign_count,
        "sla": after.sla_breaches,
        "backlog": after.backlog_leads,
    }
    if expect != got:
        print(f"MISMATCH: before {expect} after {got}")
        return 1
    print(f"both paths agree: {got}")

    rows = []
    scrape_before = timed(legacy_metrics, args.repeat)
    scrape_after = timed(metrics_snapshot, args.repeat)
    rows.append(("/metrics snapshot", scrape_before, scrape_after))
    backlog_before = timed(legacy_backlog, args.repeat)
    backlog_after = timed(backlog_database_part, args.repeat)
    rows.append(("check_backlog lead counts", backlog_before, backlog_after))
    print(f"\n{n:,} leads, {TAIL_LEADS:,} of them past the marks; median of {args.repeat}\n")
    print("| what | before ms | after ms | after / before |")
    print("| --- | ---: | ---: | ---: |")
    for name, old, new in rows:
        print(f"| {name} | {old:.1f} | {new:.2f} | {new / old:.4f} |")

    later = now + settle + timedelta(seconds=settings.METRICS_SETTLE_SECONDS + 1)
    counters_refresh(now=later - timedelta(seconds=1))
    refresh = timed(lambda: counters_refresh(now=later), 1)
    print(
        f"\ncounters_refresh: first settle over the whole seeded history {refresh_first:.0f} ms "
        f"(once after deployment); moving the marks past {TAIL_LEADS:,} leads {refresh:.1f} ms"
    )
    from routing.monitoring.counters import _status_counts

    print(f"leads per status recount (every 300 s): {timed(_status_counts, 3):.0f} ms")
    with connection.cursor() as cursor:
        for label, sql in [
            ("waiting leads", "SELECT count(*) FROM leads_lead WHERE status = 'received'"),
            (
                "oldest waiting",
                "SELECT received_at FROM leads_lead WHERE status = 'received' "
                "ORDER BY received_at LIMIT 1",
            ),
            (
                "live statuses",
                "SELECT status, count(*) FROM leads_lead WHERE status IN "
                "('received','processing','unassigned','failed') GROUP BY status",
            ),
            (
                "events past the mark",
                "SELECT count(*) FROM audit_event WHERE id > "
                "(SELECT max(id) - 6000 FROM audit_event)",
            ),
        ]:
            cursor.execute("EXPLAIN " + sql)
            plan = " / ".join(row[0].strip() for row in cursor.fetchall()[:3])
            print(f"plan, {label}: {plan}")
    connection.close()
    if not args.keep:
        drop_database(database_url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
