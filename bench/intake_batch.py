"""Batch intake's CPU per record, in-process: the service alone and the whole request.

    .venv/bin/python -m bench.intake_batch [--rounds 20] [--size 1000]

(DATABASE_URL, REDIS_URL and CACHE_URL name the database and Redis, as for bench.intake_parts;
the database must be migrated. It adds sources named ``batch-*`` and leaves the leads it wrote.)

Each round posts a fresh batch of ``--size`` varied records (new e-mails and external ids, so
no round replays another): records for a generic source, flat ones with aliases and external
ids, nested ones, lists, JSON written into a form field and a few that are no lead; and, per
source kind with JSON fixtures, that kind's fixtures over and over. CPU is ``process_time`` of
this process (all threads: the background publisher's work counts), divided by the records;
building the records is outside the measured time, encoding the body is outside it too for the
request figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-batch-token-0123456789abcdef0123456789abcdef"  # noqa: S105 (local only)


def generic_record(rng: random.Random, round_no: int, i: int) -> dict[str, Any]:
    """One of the shapes a generic source receives."""
    email = f"r{round_no}.{i}.{rng.randrange(10**9)}@acme-{i % 300}.com"
    shape = i % 20
    if shape < 12:  # flat, with aliases and tracking fields
        record: dict[str, Any] = {
            "Email Address": email,
            "first_name": rng.choice(["Ana", "Jörg", "Li", "María José"]),
            "last_name": rng.choice(["Lopez", "Müller", "Wang", "van der Berg"]),
            "Company": f"Acme {i % 300}",
            "Country": rng.choice(["Germany", "US", "France", "United Kingdom"]),
            "phone": "+49 30 1234567",
            "utm_source": "webinar",
            "employees": "51-200",
            "lead_score": rng.randrange(100),
        }
        if shape < 6:
            record["external_id"] = f"ext-{round_no}-{i}-{rng.randrange(10**9)}"
        return record
    if shape < 15:  # nested
        return {
            "contact": {"email": email, "name": "Ana Lopez", "phone": "+1 415 555 0100"},
            "company": {"name": f"Acme {i % 300}", "size": 120},
            "meta": {"page": "/pricing", "ts": 1733500000 + i},
        }
    if shape < 17:  # lists
        return {"emails": [email, "other@acme.com"], "names": ["Ana", "Lopez"], "tags": [1, 2]}
    if shape < 19:  # JSON written into a form field
        inner = {"email": email, "company": "Acme", "first_name": "Ana"}
        return {"form_id": "contact", "payload": json.dumps(inner)}
    return {"comment": "no one here", "page": "/blog"}  # not a lead: refused (422)


def fixture_records(kind: str) -> list[dict[str, Any]]:
    folder = ROOT / "leads" / "sources" / kind / "fixtures"
    found = []
    for path in sorted(folder.glob("*.json")):
        value = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(value, dict):
            found.append(value)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--kinds", default="hubspot,typeform,meta_lead_ads,google_ads,calendly")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-not-for-production-0123456789")
    os.environ.setdefault("LOG_LEVEL", "ERROR")
    os.environ.setdefault("ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")
    import django

    django.setup()
    from django.test import Client

    from leads import services
    from leads.api import _limits
    from leads.models import Source, token_digest

    def source_for(slug: str, kind: str) -> Source:
        source, _ = Source.objects.update_or_create(
            slug=slug,
            defaults={
                "name": slug,
                "kind": kind,
                "token_hash": token_digest(TOKEN),
                "rate_limit_per_minute": 100_000_000,
                "field_map": {"Company": "company"} if kind == "generic" else {},
            },
        )
        return source

    rng = random.Random(18)
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    limits = _limits()
    cases: list[tuple[str, Source, Any]] = [
        (
            "flat, each with an external id (bench.intake's batches)",
            source_for("batch-flat", "generic"),
            lambda r: [
                {
                    "email": f"b{r}.{i}.{rng.randrange(10**9)}@acme-{i % 300}.com",
                    "company": f"Acme {i % 300}",
                    "country": "US",
                    "state": "CA",
                    "external_id": f"r{r}-{i}-{rng.randrange(10**9)}",
                }
                for i in range(args.size)
            ],
        ),
        (
            "generic, varied shapes",
            source_for("batch-generic", "generic"),
            lambda r: [generic_record(rng, r, i) for i in range(args.size)],
        ),
    ]
    for kind in [k for k in args.kinds.split(",") if k]:
        samples = fixture_records(kind)
        if samples:
            cases.append(
                (
                    f"{kind} fixtures",
                    source_for(f"batch-{kind}".replace("_", "-"), kind),
                    lambda r, s=samples: [
                        json.loads(json.dumps(s[i % len(s)])) for i in range(args.size)
                    ],
                )
            )

    print("| records | service µs CPU/record | whole request µs CPU/record | accepted |")
    print("| --- | --- | --- | --- |")
    for label, source, make in cases:
        service_cpu = request_cpu = 0.0
        accepted = 0
        for round_no in range(args.rounds + 2):
            records = make(round_no)
            started = time.process_time()
            outcomes = services.lead_ingest_batch(source=source, records=records, limits=limits)
            used = time.process_time() - started
            services.publisher.flush()
            if round_no >= 2:  # the first rounds warm the caches
                service_cpu += used
                accepted += sum(isinstance(o, services.Accepted) for o in outcomes)
            body = json.dumps(make(round_no + 10_000))
            started = time.process_time()
            response = client.post(
                f"/api/v1/intake/{source.slug}/batch/",
                data=body,
                content_type="application/json",
                **auth,
            )
            used = time.process_time() - started
            services.publisher.flush()
            if response.status_code not in (202, 422):
                raise SystemExit(f"{label}: {response.status_code} {response.content[:300]!r}")
            if round_no >= 2:
                request_cpu += used
        per = args.rounds * args.size
        print(
            f"| {label} | {service_cpu / per * 1e6:.1f} | {request_cpu / per * 1e6:.1f} | "
            f"{accepted / args.rounds:.0f} of {args.size} |"
        )


if __name__ == "__main__":
    main()
