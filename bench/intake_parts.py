"""Where one single-lead kickoff spends its time, part by part, in-process.

    .venv/bin/python -m bench.intake_parts     # after bench.intake created leadrouter_bench

Uses the Django test client against the benchmark settings (PostgreSQL + Redis, the database
and source that ``bench.intake`` created), so it measures the application's own cost per part
without a load generator competing for the CPU.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from typing import Any


def measure(label: str, fn: Callable[[], Any], n: int = 300) -> None:
    for _ in range(20):
        fn()
    started = time.perf_counter()
    for _ in range(n):
        fn()
    print(f"| {label} | {(time.perf_counter() - started) / n * 1e3:.3f} ms |")


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_bench")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
    os.environ.setdefault("CACHE_URL", "redis://127.0.0.1:6379/15")
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-not-for-production-0123456789")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")
    import django

    django.setup()
    from django.test import Client
    from django.utils import timezone

    from bench.intake import TOKEN
    from leads import services, source_auth
    from leads.models import Source

    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    body = json.dumps(
        {"email": "a@b.co", "Company": "Acme", "Country": "Germany", "phone": "+49 30 1234567"}
    )
    source = Source.objects.get(slug="bench")
    record = json.loads(body)
    print("| part | per request |\n| --- | --- |")
    measure(
        "whole single-lead request",
        lambda: client.post(
            "/api/v1/intake/bench/", data=body, content_type="application/json", **auth
        ),
    )
    measure(
        "bare DRF view",
        lambda: client.post("/bench/bare/", data=body, content_type="application/json"),
    )
    measure("source SELECT (uncached)", lambda: Source.objects.filter(slug="bench").first())
    measure("rate-limit count", lambda: source_auth.check_rate_limit(source, now=timezone.now()))
    measure("publish one task", lambda: services.leads_enqueue([uuid.uuid4()]))
    measure("map + lead check + fingerprint", lambda: services._prepare(source, record, None, 0))
    measure(
        "INSERT, committed",
        lambda: services._new_lead(
            source, services._prepare(source, record, None, 0), timezone.now()
        ).save(force_insert=True),
    )


if __name__ == "__main__":
    main()
