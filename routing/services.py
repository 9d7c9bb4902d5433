"""Write services of the routing app."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from routing.models import QueueHeartbeat


@transaction.atomic
def heartbeat_record(*, queue: str, worker: str) -> QueueHeartbeat:
    """Record that ``worker`` just executed a heartbeat taken from ``queue``."""
    heartbeat, _ = QueueHeartbeat.objects.update_or_create(
        queue=queue, defaults={"last_seen_at": timezone.now(), "worker": worker[:255]}
    )
    return heartbeat
