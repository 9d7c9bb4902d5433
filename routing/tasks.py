"""Celery tasks of the routing app: thin wrappers that take ids and call one service."""

from __future__ import annotations

from celery import Task, shared_task

from routing.services import heartbeat_record, lead_process


@shared_task(name="maintenance.heartbeat", bind=True)
def heartbeat(self: Task, queue: str) -> None:
    """Prove that a worker drains ``queue``: beat sends one into every queue."""
    heartbeat_record(queue=queue, worker=self.request.hostname or "")


@shared_task(name="routing.process_lead")
def process_lead(lead_id: str) -> None:
    """Run the pipeline for one lead (idempotent: a redelivered message is a no-op)."""
    lead_process(lead_id=lead_id)
