"""Concurrent sweepers on PostgreSQL split the due deliveries: each is published once."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from routing.delivery import services
from routing.delivery.services import deliveries_schedule, deliveries_sweep_due
from tests.routing.factories import AssignmentFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_sweepers_at_once_publish_every_due_delivery_exactly_once(
    published: list[int], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.DELIVERY_REDISPATCH_SECONDS = 0
    for _ in range(12):
        deliveries_schedule(assignment=AssignmentFactory())
    published.clear()
    slow_send = services.celery_app.send_task

    def send_slowly(*args: Any, **kwargs: Any) -> None:
        time.sleep(0.05)  # keep each sweeper's batch locked long enough to overlap
        slow_send(*args, **kwargs)

    monkeypatch.setattr(services.celery_app, "send_task", send_slowly)
    later = timezone.now() + timedelta(seconds=1)
    counts: list[int] = []
    barrier = threading.Barrier(2)

    def sweep() -> None:
        try:
            barrier.wait(5)
            counts.append(deliveries_sweep_due(now=later, batch_size=4))
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(counts) == 12
    assert sorted(published) == sorted(set(published))
    assert len(published) == 12
    assert all(counts), counts  # both took a share


def test_a_transaction_holding_the_assignment_does_not_hide_its_delivery(
    published: list[int], settings: Any
) -> None:
    """The sweep locks the delivery rows only (``FOR UPDATE OF``): the join it reads the
    assignment's priority through must not lock (or skip on) the assignment, which a routing,
    touch or reassignment transaction may hold."""
    from django.db import connections, transaction

    from routing.models import Assignment

    settings.DELIVERY_REDISPATCH_SECONDS = 0
    assignment = AssignmentFactory()
    deliveries_schedule(assignment=assignment)
    published.clear()
    held = threading.Event()
    release = threading.Event()

    def hold_assignment() -> None:
        try:
            with transaction.atomic():
                Assignment.objects.select_for_update().get(pk=assignment.pk)
                held.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_assignment)
    holder.start()
    try:
        assert held.wait(10)
        assert deliveries_sweep_due(now=timezone.now() + timedelta(seconds=1)) == 1
    finally:
        release.set()
        holder.join()
    assert len(published) == 1
