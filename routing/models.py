"""Routing models."""

from django.db import models


class QueueHeartbeat(models.Model):
    """The last time a worker executed the heartbeat task sent to one queue.

    Celery beat sends a heartbeat into every queue; a worker consuming that queue records it
    here. A stale row means no worker is draining the queue, which nothing else would report.
    """

    queue = models.CharField(max_length=64, unique=True)
    last_seen_at = models.DateTimeField()
    worker = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ("queue",)

    def __str__(self) -> str:
        return f"{self.queue} @ {self.last_seen_at:%Y-%m-%d %H:%M:%S}"
