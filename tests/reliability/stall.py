"""Test-only: the first attempt at chosen leads stalls past the broker's visibility timeout
(issue 9, reliability guide test 3, "Task outlives the visibility timeout").

Loaded only into test worker processes, with ``celery -A config worker -I
tests.reliability.stall``; production code never imports it. When
``LEADROUTER_TEST_STALL_SECONDS`` is set, a worker that has just claimed a lead whose raw
e-mail starts with ``LEADROUTER_TEST_STALL_PREFIX`` sleeps that long on the lead's first attempt,
after the claim and before the lease check and any write (a batch holding such a lead stalls
whole: every lead of it waits) (a stall like a long GC pause, a
swapped-out process or a hung outbound call). Meanwhile Redis hands the unacknowledged message to
another worker, whose claim wins once the lease has expired.

It also makes this worker's Redis transport look for unacknowledged messages past the
visibility timeout every second (kombu's default is about every 100 s), so the redelivery
happens within the test's time budget.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from datetime import datetime

STALL_SECONDS = float(os.environ.get("LEADROUTER_TEST_STALL_SECONDS", "0") or 0)
STALL_PREFIX = os.environ.get("LEADROUTER_TEST_STALL_PREFIX", "").strip().lower()
MARKER = "STALL: first attempt stalls on lead"


def _install() -> None:
    from config.celery import app
    from leads.models import Lead
    from routing import services

    options = app.conf.broker_transport_options
    options["unacked_restore_interval"] = 1
    options["unacked_restore_throttle"] = 1

    original = services._lead_process_claimed

    def stalling(lead_uuid: uuid.UUID, lease: datetime) -> str | None:
        row = Lead.objects.filter(id=lead_uuid).values_list("raw_payload", "attempts").first()
        if row is not None:
            payload, attempts = row
            email = str(payload.get("email", "")) if isinstance(payload, dict) else ""
            if attempts == 1 and email.lower().startswith(STALL_PREFIX):
                sys.stderr.write(f"{MARKER} {lead_uuid} for {STALL_SECONDS} s\n")
                sys.stderr.flush()
                time.sleep(STALL_SECONDS)
        return original(lead_uuid, lease)

    services._lead_process_claimed = stalling  # type: ignore[assignment]

    # A batch (routing.batch) stalls the same way, after its claim and before its lock.
    from routing import batch

    original_batch = batch._batch_route

    def stalling_batch(state: batch._Batch, claimed: list[uuid.UUID], lease: datetime) -> None:
        rows = Lead.objects.filter(id__in=claimed, attempts=1).values_list("id", "raw_payload")
        for lead_uuid, payload in rows:
            email = str(payload.get("email", "")) if isinstance(payload, dict) else ""
            if email.lower().startswith(STALL_PREFIX):
                sys.stderr.write(f"{MARKER} {lead_uuid} for {STALL_SECONDS} s\n")
                sys.stderr.flush()
                time.sleep(STALL_SECONDS)
                break
        original_batch(state, claimed, lease)

    batch._batch_route = stalling_batch  # type: ignore[assignment]


if STALL_SECONDS > 0 and STALL_PREFIX:
    _install()
