"""The retention job (beat, ``maintenance`` queue): one call to its service."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from routing.retention.services import retention_scheduled


# Acknowledged early: a run lost with its worker is simply the next run's work (every batch
# it committed stays done, the rest is still due).
@shared_task(
    name="maintenance.retention_apply",
    acks_late=False,
    soft_time_limit=int(settings.RETENTION_MAX_SECONDS) + 300,
    time_limit=int(settings.RETENTION_MAX_SECONDS) + 360,
)
def retention_apply() -> None:
    """Prune what the retention periods no longer let us keep; alert when that fails."""
    retention_scheduled()
