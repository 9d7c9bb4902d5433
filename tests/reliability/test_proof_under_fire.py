"""Proof under fire (issue 9): the fault tests 3-7 of the reliability guide's test plan, with real
processes on loopback (tests/reliability/harness.py).

- a task that outlives the broker's visibility timeout (Redis redelivers it while it runs);
- the broker paused (``CLIENT PAUSE``) during an intake burst;
- the web process crashing between the lead's commit and its publish;
- a throwaway PostgreSQL cluster stopped during a burst;
- warm worker restarts (the deploy signal) during a burst.

Each test is bounded in traffic and time, ends with exact counts read from the database, and
prints its figures (``[fault figures] ...``; also appended to ``FAULT_FIGURES_FILE`` if set).
``RELIABILITY_SCALE`` multiplies the lead counts (``make reliability``).
"""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest
from django.db import connection
from django.db.models import Sum

from audit.verify import audit_verify
from leads.models import Lead
from routing.rules_io import rules_import
from tests.leads.factories import SourceFactory
from tests.reliability import stall
from tests.reliability.harness import (
    BATCH,
    REPS,
    SCALE,
    assert_exact_routing,
    assert_one_received_event_each,
    log_signs,
    post_batch,
    report_figures,
    rules,
    unfinished,
)
from tests.support.processes import wait_until

pytestmark = [
    pytest.mark.worker,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.reliability,
    pytest.mark.django_db(transaction=True),
]

RECEIVED = re.compile(r"Task (routing\.process_leads?)\[([0-9a-f-]+)\] received")


def deliveries(text: str) -> Counter[str]:
    """How often each task id was received by a worker (above 1: a redelivery)."""
    return Counter(match.group(2) for match in RECEIVED.finditer(text))


def statuses() -> dict[str, int]:
    return dict(Counter(Lead.objects.values_list("status", flat=True)))


# --- 3. A task that outlives the broker's visibility timeout -----------------------------------

STALL_SECONDS = 20


def test_task_outliving_the_visibility_timeout_is_redelivered_and_the_stale_run_writes_nothing(
    stack,
):  # type: ignore[no-untyped-def]
    """The first attempt at two leads stalls 20 s (tests/reliability/stall.py) with a visibility
    timeout of 8 s and a lease of 4 s: Redis hands each stalled message to the other worker,
    which claims the lead (lease expired) and routes the chunk; the stalled execution then finds
    its lease gone and writes nothing. Test-only settings: the task time limit (40 s) is set
    above the visibility timeout on purpose, which the guide forbids in production, to make the
    redelivery of a live task happen. No sweeper runs: the broker's redelivery alone must do."""
    rules_import(rules(REPS), publish=True)
    SourceFactory(slug="stall")
    s = stack(
        CELERY_VISIBILITY_TIMEOUT="8",
        CELERY_TASK_TIME_LIMIT="40",
        CELERY_TASK_SOFT_TIME_LIMIT="35",
        LEAD_LEASE_SECONDS="4",
        LEADROUTER_TEST_STALL_SECONDS=str(STALL_SECONDS),
        LEADROUTER_TEST_STALL_PREFIX="stall",
    )
    s.start_redis()
    s.start_web()
    workers = [s.worker(f"stall-{n}", include="tests.reliability.stall") for n in "ab"]
    for w in workers:
        w.wait_ready()

    total = 200 * SCALE
    # The first lead of a 20-lead chunk: claimed as soon as the message is delivered, so its
    # lease (4 s) has surely expired when the message comes back (8 s); the stalled run finds the
    # rest of its chunk taken when it wakes.
    stalled = {20, total // 2 + 20}
    started = time.monotonic()
    try:
        for first in range(0, total, BATCH):
            records = [
                {"email": f"{'stall' if i in stalled else 'ok'}{i}@acme.example"}
                for i in range(first, first + BATCH)
            ]
            assert post_batch(s, "stall", records)[0] == 202
        wait_until(
            lambda: unfinished() == 0,
            timeout=80,
            interval=0.5,
            message=f"{statuses()}\n{s.logs()}",
        )
        all_final_s = time.monotonic() - started
        # The stalled executions wake up after the leads were routed: wait for them to finish.
        wait_until(
            lambda: sum(w.text().count("writing nothing") for w in workers) >= len(stalled),
            timeout=STALL_SECONDS + 20,
            interval=0.5,
            message=s.logs(),
        )
        time.sleep(1)
    finally:
        for w in workers:
            w.stop()
    connection.close()

    text = "".join(w.text() for w in workers)
    assert text.count(stall.MARKER) == len(stalled), s.logs()
    assert Lead.objects.count() == total
    assert statuses() == {"assigned": total}
    assert_exact_routing(total)
    assert_one_received_event_each(total)
    report = audit_verify()
    assert report.ok, [str(f) for f in report.findings[:10]]
    stalled_leads = Lead.objects.filter(raw_payload__email__startswith="stall")
    assert stalled_leads.count() == len(stalled)
    # Claimed by the stalled run, then by the redelivery once its lease had expired.
    assert sorted(stalled_leads.values_list("attempts", flat=True)) == [2] * len(stalled)
    for lead in stalled_leads:
        assert f"lease on lead {lead.pk} lost; writing nothing" in text, s.logs()
    assert not Lead.objects.exclude(pk__in=stalled_leads).filter(attempts__gt=1).exists()
    redelivered = {task: n for task, n in deliveries(text).items() if n > 1}
    assert len(redelivered) >= len(stalled), redelivered
    report_figures(
        "visibility-timeout",
        {
            "leads": total,
            "assigned": total,
            "stalled_first_attempts": len(stalled),
            "stall_s": STALL_SECONDS,
            "visibility_timeout_s": 8,
            "lease_s": 4,
            "messages_redelivered": len(redelivered),
            "stale_runs_writing_nothing": text.count("writing nothing"),
            "assignments_per_lead_max": 1,
            "attempts_total": Lead.objects.aggregate(t=Sum("attempts"))["t"],
            "all_final_s": round(all_final_s, 1),
            "logged": log_signs(workers),
        },
    )
