"""A high-priority lead is taken before the normal ones waiting in its lane (issue 22, item 2).

Real ``celery`` worker processes laid out as the Procfile's routing worker, on whichever broker
this run uses (Redis: kombu's priority lists, published raw or through kombu; the embedded
filesystem broker: files named by priority, config.broker_filesystem). Everything is queued
before the worker starts, so its order is the broker's alone, and it is measured by position:
how many of the normal leads queued ahead of a high one were routed before it (first in, first
out: all of them).

Known at intake: the source's intake priority. Known later: a lead's own priority (a tag rule's)
when it is queued again, by a re-route or by the stale sweeper. A bulk lead of a hot source still
waits for every realtime lead: priority orders a lane, not the lanes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from config.celery import app
from leads import lanes
from leads.models import Lead, LeadStatus
from leads.services import lead_ingest, lead_ingest_batch, leads_requeue_stale
from routing.rules_io import rules_import
from routing.services import lead_reroute
from tests.leads.factories import LeadFactory, SourceFactory
from tests.support.processes import celery_worker, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

NORMAL = 30
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


@pytest.fixture(params=["raw", "kombu"])
def publish_path(request: Any, settings: Any) -> str:
    """On Redis both publish paths (the kickoff's raw LPUSH and kombu's); one on the filesystem."""
    if request.param == "raw" and settings.BROKER_IS_FILESYSTEM:
        pytest.skip("the raw publish is for Redis: the filesystem broker has kombu's only")
    settings.ENQUEUE_RAW_REDIS = request.param == "raw"
    settings.ENQUEUE_IN_BACKGROUND = False  # published inline, in the order of the test
    rules_import(RULES, publish=True)
    app.control.purge()  # messages earlier tests left in the shared broker
    return str(request.param)


def _routed_in_order() -> list[str]:
    return [
        str(lead_id)
        for lead_id in Lead.objects.filter(processed_at__isnull=False)
        .order_by("processed_at", "id")
        .values_list("id", flat=True)
    ]


def _route_all(expected: int) -> list[str]:
    with celery_worker(concurrency=1, queues=WORKER_QUEUES) as worker:
        wait_until(
            lambda: Lead.objects.filter(processed_at__isnull=False).count() == expected,
            180,
            message=lambda: worker.text()[-3000:],
        )
    assert Lead.objects.filter(status=LeadStatus.RECEIVED).count() == 0  # nothing lost
    assert Lead.objects.filter(status=LeadStatus.ASSIGNED).count() == expected
    return _routed_in_order()


def _overtaken(order: list[str], lead_id: str, normal: list[str]) -> int:
    """How many of ``normal`` (all queued before ``lead_id``) were routed before it."""
    position = order.index(lead_id)
    return len(set(order[:position]) & set(normal))


def test_a_hot_source_lead_is_routed_before_the_normal_ones_waiting_in_its_lane(
    publish_path: str, settings: Any
) -> None:
    form = SourceFactory(slug="contact-us")
    demo = SourceFactory(slug="demo-request", intake_priority="hot")
    uploads = SourceFactory(slug="webinar-upload", intake_priority="hot")
    # A hot bulk batch first: it stays behind the realtime lane whatever its priority.
    bulk = lead_ingest_batch(
        source=uploads, records=[{"email": f"b{i}@bulk.example"} for i in range(5)]
    )
    normal = [
        str(lead_ingest(source=form, record={"email": f"n{i}@prospect.example"}).lead_id)
        for i in range(NORMAL)
    ]
    hot = str(lead_ingest(source=demo, record={"email": "ceo@prospect.example"}).lead_id)
    assert {lead.lane for lead in Lead.objects.exclude(source=uploads)} == {lanes.REALTIME}

    order = _route_all(NORMAL + 1 + len(bulk))

    overtaken = _overtaken(order, hot, normal)
    bulk_ids = {str(accepted.lead_id) for accepted in bulk}  # type: ignore[union-attr]
    first_bulk = min(order.index(lead_id) for lead_id in bulk_ids)
    print(
        f"broker {'filesystem' if settings.BROKER_IS_FILESYSTEM else 'redis'} ({publish_path}): "
        f"hot lead routed {order.index(hot) + 1}th of {len(order)}, after {overtaken} of the "
        f"{NORMAL} normal leads queued ahead of it; first bulk lead routed "
        f"{first_bulk + 1}th"
    )
    # First in, first out would route all 30 first; the worker may hold one it fetched.
    assert overtaken <= 2, order
    # The normal ones keep their order among themselves.
    assert [lead_id for lead_id in order if lead_id in set(normal)] == normal
    # Priority is within a lane: every realtime lead before any bulk one.
    assert first_bulk == NORMAL + 1, order


def test_a_re_queued_lead_with_a_hot_priority_goes_before_the_normal_ones_waiting(
    publish_path: str, settings: Any
) -> None:
    form = SourceFactory(slug="contact-us")
    # Known from an earlier decision (a tag rule's priority), queued again: by a re-route of
    # an unassigned lead, and by the stale sweeper (its message lost). Sources: normal.
    rerouted = LeadFactory(
        source=form, lane=lanes.REALTIME, status=LeadStatus.UNASSIGNED, priority="hot"
    )
    long_ago = timezone.now() - timedelta(hours=1)
    stale = LeadFactory(
        source=form, lane=lanes.REALTIME, priority="Hot", received_at=long_ago, queued_at=long_ago
    )
    normal = [
        str(lead_ingest(source=form, record={"email": f"n{i}@prospect.example"}).lead_id)
        for i in range(NORMAL)
    ]
    lead_reroute(lead_id=rerouted.pk, actor="test")
    assert leads_requeue_stale(older_than=timedelta(minutes=5)) == 1  # only the stale one

    order = _route_all(NORMAL + 2)

    overtaken = {
        name: _overtaken(order, str(lead.pk), normal)
        for name, lead in (("rerouted", rerouted), ("stale", stale))
    }
    print(
        f"broker {'filesystem' if settings.BROKER_IS_FILESYSTEM else 'redis'} ({publish_path}): "
        f"normal leads routed before the re-queued hot ones {overtaken} of {NORMAL}"
    )
    assert max(overtaken.values()) <= 2, order
    assert [lead_id for lead_id in order if lead_id in set(normal)] == normal
