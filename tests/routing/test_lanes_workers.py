"""Lanes under a bulk backlog, with real worker processes (issue 20, item 3).

A bulk batch is queued first (BULK leads in routing.bulk), a worker laid out as the Procfile's
(``--queues routing.realtime,maintenance,delivery,routing,routing.bulk``, two processes,
prefetch 1) starts on it, and form leads arrive once it is busy. Each must be routed before the
backlog queued ahead of it: measured by position, how many bulk leads waiting when it was
accepted were routed before it (a first-in-first-out queue would route every one of them
first; lanes route the batches in progress first, ``ROUTING_BATCH_SIZE`` a process), not by
how much of the backlog is left at the end, which depends on how fast this machine drains it
against how fast the test posts. And the backlog must still drain once they
are done (no starvation of bulk when realtime is quiet).

The worker takes its queues in that order on Redis (``BROKER_QUEUE_ORDER=priority``) and on the
embedded filesystem broker (config.broker_filesystem), and a bulk chunk hands its rest back as
soon as it sees a realtime message waiting (``RealtimePeek``, both brokers). The test runs on
whichever broker this run uses and prints what it measured.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db.models import Max, Min

from config.celery import app
from leads import lanes
from leads.models import Lead, LeadStatus
from leads.services import lead_ingest, lead_ingest_batch
from routing.rules_io import rules_import
from tests.leads.factories import SourceFactory
from tests.support.processes import celery_worker, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BULK = 500
REALTIME = 10
WORKER_PROCESSES = 2
# The Procfile's routing worker, in its order, with delivery (the io worker's: none runs here).
WORKER_QUEUES = ["routing.realtime", "maintenance", "delivery", "routing", "routing.bulk"]
RULES = {
    "reps": [{"email": "ana@northwind.example", "name": "Ana Lima", "timezone": "UTC"}],
    "teams": [
        {"name": "Web", "strategy": "round_robin", "members": [{"rep": "ana@northwind.example"}]}
    ],
    "ruleset": {
        "name": "Inbound",
        "rules": [{"name": "Everyone", "priority": 10, "action": {"type": "team", "team": "Web"}}],
    },
}


def _done(lane: str) -> int:
    """Leads of the lane the pipeline finished (an outcome and its time)."""
    return Lead.objects.filter(lane=lane, processed_at__isnull=False).count()


def _ms(delta: timedelta) -> float:
    return delta.total_seconds() * 1000


def test_realtime_leads_are_routed_before_a_bulk_backlog_drains_and_bulk_still_drains(
    settings: Any,
) -> None:
    rules_import(RULES, publish=True)
    app.control.purge()  # messages earlier tests left in the shared broker
    uploads = SourceFactory(slug="webinar-upload")
    form = SourceFactory(slug="contact-sales")
    records = [{"email": f"attendee{i}@bulk.example", "company": "Bulk"} for i in range(BULK)]
    lead_ingest_batch(source=uploads, records=records)  # enqueued at commit: routing.bulk
    assert Lead.objects.filter(lane=lanes.BULK).count() == BULK

    with celery_worker(concurrency=WORKER_PROCESSES, queues=WORKER_QUEUES) as worker:
        # The worker is busy on the backlog before the form leads arrive.
        wait_until(lambda: _done(lanes.BULK) >= 20, 90, message=lambda: worker.text()[-3000:])
        started_with = _done(lanes.BULK)
        fast_ids = []
        for i in range(REALTIME):
            accepted = lead_ingest(source=form, record={"email": f"ana{i}@prospect.example"})
            fast_ids.append(accepted.lead_id)
            time.sleep(0.2)  # a few a second, like form posts
        wait_until(
            lambda: _done(lanes.REALTIME) == REALTIME, 120, message=lambda: worker.text()[-3000:]
        )
        bulk_left = BULK - _done(lanes.BULK)
        # Bulk is not starved: once realtime is quiet the rest drains.
        wait_until(lambda: _done(lanes.BULK) == BULK, 300, message=lambda: worker.text()[-3000:])

    fast = list(Lead.objects.filter(id__in=fast_ids).order_by("received_at"))
    assert {lead.status for lead in fast} == {LeadStatus.ASSIGNED}
    latencies = sorted(_ms(lead.processed_at - lead.received_at) for lead in fast)  # type: ignore[operator]
    bulk = Lead.objects.filter(lane=lanes.BULK)
    # For each form lead: the bulk leads still waiting when it was accepted, and how many of
    # those were routed before it. First in, first out: every one of them.
    waiting = [bulk.exclude(processed_at__lte=lead.received_at).count() for lead in fast]
    overtaken = [
        bulk.filter(processed_at__gt=lead.received_at, processed_at__lt=lead.processed_at).count()
        for lead in fast
    ]
    span = bulk.aggregate(first=Min("processed_at"), last=Max("processed_at"))
    print(
        f"broker {'filesystem' if settings.BROKER_IS_FILESYSTEM else 'redis'}: "
        f"{BULK} bulk queued first, {started_with} routed when the form leads came; "
        f"realtime accept->routed ms p50 {statistics.median(latencies):.0f} "
        f"max {latencies[-1]:.0f}; bulk waiting at each form lead {waiting}, routed before it "
        f"{overtaken}; bulk still waiting when the last realtime lead was done {bulk_left}; "
        f"bulk drained in {_ms(span['last'] - span['first']) / 1000:.1f} s"
    )
    # Lanes: a form lead waits for the leads in progress when it came (a batch of
    # ROUTING_BATCH_SIZE per worker process, docs/operations.md, a few more while a chunk sees
    # it and hands back), never for the backlog. The bound leaves room for a loaded CI machine.
    bound = WORKER_PROCESSES * max(1, settings.ROUTING_BATCH_SIZE) + 20
    # The premise: each form lead came with a backlog ahead of it that FIFO would route first,
    # more than the bound (FIFO would fail it).
    assert min(waiting) > bound, f"the backlog was gone before the form leads came: {waiting}"
    assert max(overtaken) <= bound, (waiting, overtaken)
    # Each waits about the lead in progress, not for a whole 100-lead chunk (10 s and more on a
    # busy 2-core machine); SQLite serialises the writers: twice the room there.
    assert latencies[-1] < (10_000 if settings.BROKER_IS_FILESYSTEM else 5_000), latencies
    assert Lead.objects.filter(status=LeadStatus.RECEIVED).count() == 0


def test_the_worker_consumes_its_queues_in_the_order_given() -> None:
    """On Redis the order of --queues is the order of BRPOP's keys (kombu's priority cycle); on
    the filesystem broker every poll starts at the first queue (tests/config/
    test_broker_filesystem.py takes messages through it)."""
    if settings.BROKER_IS_FILESYSTEM:
        assert app.conf.broker_transport == "config.broker_filesystem:Transport"
    else:
        assert app.conf.broker_transport_options["queue_order_strategy"] == "priority"
