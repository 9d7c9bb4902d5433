"""Celery tasks of the routing app: thin wrappers that take ids and call one service."""

from __future__ import annotations

from celery import Task, shared_task

from routing.services import heartbeat_record


@shared_task(name="maintenance.heartbeat", bind=True)
def heartbeat(self: Task, queue: str) -> None:
    """Prove that a worker drains ``queue``: beat sends one into every queue."""
    heartbeat_record(queue=queue, worker=self.request.hostname or "")
