"""Celery tasks of the leads app."""

from __future__ import annotations

from celery import shared_task

from leads import privacy
from leads.services import leads_requeue_stale


@shared_task(name="maintenance.requeue_stale")
def requeue_stale() -> int:
    """Re-enqueue leads left in ``received`` (beat runs this every REQUEUE_STALE_INTERVAL)."""
    return leads_requeue_stale()


@shared_task(name="maintenance.privacy_rewrap", acks_late=False)
def privacy_rewrap() -> None:
    """After a master key rotation, re-wrap the person keys still under an older key."""
    privacy.rewrap_scheduled()
