"""Celery tasks of delivery: thin wrappers that take ids and call one service."""

from __future__ import annotations

from celery import shared_task

from routing.delivery.services import deliveries_sweep_due, delivery_attempt


@shared_task(name="delivery.deliver")
def deliver(delivery_id: int) -> None:
    """Attempt one delivery (a duplicate or early message is a no-op)."""
    delivery_attempt(delivery_id=delivery_id)


@shared_task(name="delivery.sweep_due")
def sweep_due() -> None:
    """Publish the deliveries whose retry is due, or whose task was lost (beat, ~15 s)."""
    deliveries_sweep_due()
