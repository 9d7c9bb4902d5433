"""The history page's free-text search on PostgreSQL, without and with the trigram indexes.

    .venv/bin/python -m bench.history_search [--leads 1000000] [--runs 3]

Needs PostgreSQL (BENCH_DATABASE_URL, default a fresh `leadrouter_history_bench` on localhost).
It recreates that database, migrates it, drops the trigram indexes of leads 0006 and fills
``leads_lead`` with N leads in one INSERT ... SELECT (German first and last names, 50,000
companies with random names and domains, e-mail ``first.last<n>@<domain>``). For four searches —
a company fragment of 20 leads, a term nothing matches, an e-mail fragment of ~0.7 % of the
leads and a last name of 1/16 of them — it times what the page does (``keyset_page``: the
bounded count and the first page of 50, by ``received_at``) and shows which scans the planner
chose. Then it builds the indexes the way ``migrate`` does (CONCURRENTLY), VACUUM ANALYZEs and
measures again. Milliseconds, the median of ``--runs``.
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
from typing import Any

from bench.route_lead import recreate_database

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

FILL = """
INSERT INTO leads_lead (id, status, raw_payload, email, email_domain, first_name, last_name,
  phone, company, domain, title, country, region, city, postal_code, industry, utm_source,
  utm_medium, utm_campaign, custom, flags, request_fingerprint, received_at, attempts,
  last_error, source_id, dedup_key, enrichment, enrichment_attempts, enrichment_status,
  deferrals)
SELECT gen_random_uuid(), 'assigned', '{}'::jsonb,
  lower(fn) || '.' || lower(ln) || n || '@' || dom || '.com', dom || '.com', fn, ln, '', co,
  dom || '.com', '', 'DE', '', '', '', '', '', '', '', '{}'::jsonb, '[]'::jsonb,
  md5(n::text) || md5((n + 1)::text), now() - (n || ' seconds')::interval, 0, '', %(source)s,
  '', '{}'::jsonb, 0, 'done', 0
FROM (
  SELECT n,
    (ARRAY['Anna','Ben','Clara','David','Eva','Felix','Greta','Hans','Ines','Jonas','Karla',
           'Lukas','Mia','Noah','Olga','Paul'])[1 + n %% 16] AS fn,
    (ARRAY['Schmidt','Meyer','Weber','Wagner','Becker','Hoffmann','Koch','Richter','Klein',
           'Wolf','Neumann','Braun','Zimmermann','Krause','Hartmann','Lange'])[1 + (n / 16) %% 16]
      AS ln,
    'firm' || substr(md5((n %% 50000)::text), 1, 8) AS dom,
    initcap(substr(md5((n %% 50000)::text), 9, 7)) || ' '
      || (ARRAY['GmbH','AG','Ltd','Inc','SE','KG'])[1 + n %% 6] AS co
  FROM generate_series(1, %(leads)s) AS n
) AS g
"""


def _scans(plan: str) -> str:
    """The plan's scans of leads_lead and its indexes, in plan order."""
    kinds = []
    for line in plan.splitlines():
        line = line.strip().removeprefix("->").strip().split("  (")[0]
        if " on leads_lead" in line or "using lead_" in line or line.endswith("_trgm_idx"):
            kinds.append(line.replace("Bitmap Index Scan on ", ""))
    return "; ".join(kinds)


def _measure(terms: dict[str, str], runs: int) -> None:
    from django.contrib.auth.models import User

    from audit.selectors import PAGE_SIZE, history_leads, keyset_page

    user = User(is_superuser=True)
    print(f"{'search':<28} {'matches':>8} {'page+count ms':>14}  scans (first page)")
    for label, term in terms.items():
        _, leads = history_leads(user=user, data={"q": term})
        samples = []
        page: Any = None
        for _ in range(runs):
            started = time.perf_counter()
            page = keyset_page(leads, column="received_at", descending=True)
            samples.append((time.perf_counter() - started) * 1000)
        plan = leads.order_by("-received_at", "-id")[: PAGE_SIZE + 1].explain()
        matches = f"{page.count:,}{'+' if page.count_capped else ''}"
        print(
            f"{label + ' ' + repr(term):<28} {matches:>8} {statistics.median(samples):>14.1f}"
            f"  {_scans(plan)}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--leads", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args, _others = parser.parse_known_args()

    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_history_bench"
    )
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "DATABASE_URL": database_url,
            "LEADROUTER_VAR_DIR": tempfile.mkdtemp(prefix="leadrouter-history-bench-"),
            "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
            "LOG_LEVEL": "WARNING",
        }
    )
    manage = [str(BIN / "python"), "manage.py"]
    recreate_database(database_url)
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True)
    # Without the trigram indexes first (migrating back to 0005 drops them).
    subprocess.run([*manage, "migrate", "leads", "0005", "-v", "0"], cwd=ROOT, check=True)

    import django

    django.setup()
    from django.db import connection

    from leads.models import Source, token_digest

    source = Source.objects.create(
        slug="bench", name="Bench", token_hash=token_digest("bench"), token_hint=""
    )
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(FILL, {"source": source.pk, "leads": args.leads})
        cursor.execute("VACUUM ANALYZE leads_lead")
        cursor.execute("SELECT company FROM leads_lead WHERE email LIKE 'anna.%%' LIMIT 1")
        company = cursor.fetchone()[0]
    print(f"{args.leads:,} leads in {time.perf_counter() - started:.0f} s", flush=True)
    terms = {
        "rare company": company[:5].lower(),
        "nothing": "zzqx",
        "e-mail part": "hoffmann5",
        "last name": "schmidt",
    }
    print("\nWithout the trigram indexes")
    _measure(terms, args.runs)
    connection.close()
    started = time.perf_counter()
    subprocess.run([*manage, "migrate", "leads", "0006", "-v", "0"], cwd=ROOT, check=True)
    print(f"\nleads 0006 (four GIN indexes, CONCURRENTLY): {time.perf_counter() - started:.0f} s")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE leads_lead")
        cursor.execute(
            "SELECT pg_size_pretty(sum(pg_relation_size(indexrelid))) FROM pg_index "
            "WHERE indrelid = 'leads_lead'::regclass AND indexrelid::regclass::text LIKE '%%trgm%%'"
        )
        print(f"index size: {cursor.fetchone()[0]}")
    print("\nWith the trigram indexes")
    _measure(terms, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
