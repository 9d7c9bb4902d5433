"""A high-priority lead's deliveries are taken before normal ones waiting in the delivery queue.

A real worker on Redis: normal deliveries are queued first, a hot lead's last, with no worker
running; the worker (one process, prefetch 1) then sends the hot one first.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import transaction
from pytest_httpserver import HTTPServer

from config.celery import app
from routing.delivery.models import Delivery, DeliveryStatus, WebhookEndpoint
from routing.delivery.services import deliveries_schedule
from routing.models import Assignment
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, RepFactory
from tests.support.processes import celery_worker, wait_until

pytestmark = [
    pytest.mark.worker,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def _assignment(n: int, priority: str) -> Assignment:
    lead = LeadFactory(email=f"lead{n}@acme.example", priority=priority)
    rep = RepFactory(email=f"rep{n}@x.example")
    assignment: Assignment = AssignmentFactory(lead=lead, rep=rep, priority=priority)
    return assignment


def test_the_hot_leads_delivery_is_sent_before_the_normal_ones_queued_earlier(
    settings: Any, endpoint: WebhookEndpoint, httpserver: HTTPServer
) -> None:
    if settings.BROKER_IS_FILESYSTEM:
        pytest.skip("the filesystem broker has no priorities (docs/operations.md, 'Priority')")
    settings.DELIVERY_EMAIL_ENABLED = False
    httpserver.expect_request("/hook").respond_with_data("ok")
    app.control.purge()  # messages earlier tests left in the shared broker
    normal = [_assignment(n, "normal" if n % 2 else "") for n in range(6)]
    hot = _assignment(99, "hot")
    for assignment in [*normal, hot]:  # the hot one is queued last
        with transaction.atomic():
            deliveries_schedule(assignment=assignment)
    assert Delivery.objects.count() == 7

    extra_env = {"DELIVERY_ALLOW_PRIVATE_URLS": "1", "DELIVERY_EMAIL_ENABLED": "0"}
    with celery_worker(concurrency=1, queues=["delivery"], extra_env=extra_env) as worker:
        wait_until(
            lambda: Delivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 7,
            90,
            message=worker.text()[-3000:],
        )

    order = [json.loads(request.get_data()) for request, _ in httpserver.log]
    assert len(order) == 7  # nothing lost, nothing sent twice
    assert order[0]["data"]["lead"]["id"] == str(hot.lead_id)
    assert order[0]["data"]["assignment"]["priority"] == "hot"
    # The normal ones keep their queue order (first in, first out) behind it.
    assert [doc["data"]["lead"]["id"] for doc in order[1:]] == [str(a.lead_id) for a in normal]
