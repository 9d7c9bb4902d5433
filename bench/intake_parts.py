"""Where one single-lead kickoff spends its time, part by part, in-process.

    .venv/bin/python -m bench.intake_parts     # after bench.intake created leadrouter_bench

(DATABASE_URL, REDIS_URL and CACHE_URL name another database and Redis, as for bench.intake.)

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
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    wall = (time.perf_counter() - started) / n * 1e3
    used = (time.process_time() - cpu) / n * 1e3
    print(f"| {label} | {wall:.3f} ms | {used:.3f} ms |")


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
    from django.db import transaction
    from django.test import Client
    from django.utils import timezone

    from audit.services import events_record_received
    from bench.intake import TOKEN
    from leads import services, source_auth
    from leads.broker_publish import raw_publisher
    from leads.kickoff_sql import kickoff_statement
    from leads.models import Source

    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    body = json.dumps(
        {"email": "a@b.co", "Company": "Acme", "Country": "Germany", "phone": "+49 30 1234567"}
    )
    source = Source.objects.get(slug="bench")
    record = json.loads(body)
    # CPU: this process's, all threads (the background publisher's included); on a shared
    # machine the wall time also holds the waits for the CPU.
    print("| part | wall per request | CPU per request |\n| --- | --- | --- |")
    counter = iter(range(10**9))

    def fresh_lead() -> str:  # a new e-mail and company each time, as bench.intake's wrk script
        n = next(counter)
        return json.dumps(
            {
                "Email Address": f"lead{n}.{uuid.uuid4().hex[:8]}@acme-{n % 500}.com",
                "first_name": "Ana",
                "last_name": "Lopez",
                "Company": f"Acme {n % 500}",
                "Country": "Germany",
                "phone": "+49 30 1234567",
                "utm_source": "webinar",
                "employees": "51-200",
                "lead_score": 72,
            }
        )

    measure(
        "whole single-lead request (a fresh lead each time)",
        lambda: client.post(
            "/api/v1/intake/bench/", data=fresh_lead(), content_type="application/json", **auth
        ),
        n=1000,
    )
    measure(
        "bare DRF view",
        lambda: client.post("/bench/bare/", data="{}", content_type="application/json"),
        n=1000,
    )
    measure("source SELECT (uncached)", lambda: Source.objects.filter(slug="bench").first())
    measure("rate-limit count", lambda: source_auth.check_rate_limit(source, now=timezone.now()))
    measure(
        "publish one task, kombu send_task",
        lambda: services.celery_app.send_task(
            services.PROCESS_LEAD_TASK, args=[str(uuid.uuid4())], retry=False, queue="bench.parts"
        ),
    )
    measure(
        "publish one task, raw LPUSH",
        lambda: raw_publisher.publish(
            [(services.PROCESS_LEAD_TASK, [str(uuid.uuid4())], "bench.parts", 0)]
        ),
    )
    measure("map + lead check + fingerprint", lambda: services._prepare(source, record, None, 0))

    def orm_insert() -> None:
        lead = services._new_lead(
            source, services._prepare(source, record, None, 0), timezone.now(), "realtime"
        )
        with transaction.atomic():
            lead.save(force_insert=True)
            events_record_received(leads=[lead], actor="source:bench")

    def one_statement() -> None:
        item = services._prepare(source, record, None, 0)
        kickoff_statement.insert(
            lead_id=item.lead_id,
            source_id=source.pk,
            lane="realtime",
            raw_payload=item.record,
            idempotency_key=item.key,
            request_fingerprint=item.fingerprint,
            received_at=timezone.now(),
            actor="source:bench",
        )

    measure("lead + received event, ORM save + bulk_create in a transaction", orm_insert)
    measure("lead + received event, one statement (leads.kickoff_sql)", one_statement)
    import redis

    redis.Redis.from_url(os.environ["REDIS_URL"]).delete("bench.parts")


if __name__ == "__main__":
    main()
