"""Celery tasks of the routing app: thin wrappers that take ids and call one service."""

from __future__ import annotations

import logging

from celery import Task, shared_task
from django.conf import settings

from routing.admin_jobs import admin_job_run
from routing.batch import lead_process_batched
from routing.services import heartbeat_record, leads_process_chunk

logger = logging.getLogger(__name__)


@shared_task(name="maintenance.heartbeat", bind=True)
def heartbeat(self: Task, queue: str) -> None:
    """Prove that a worker drains ``queue``: beat sends one into every queue."""
    heartbeat_record(queue=queue, worker=self.request.hostname or "")


@shared_task(
    name="maintenance.admin_job",
    acks_late=True,
    time_limit=settings.ADMIN_JOB_TIME_LIMIT_SECONDS,
    soft_time_limit=max(1, settings.ADMIN_JOB_TIME_LIMIT_SECONDS - 30),
)
def admin_job(job_id: int) -> None:
    """Run a large replay or CSV import started in the admin (safe to deliver twice)."""
    admin_job_run(job_id=job_id)


@shared_task(name="routing.process_lead")
def process_lead(lead_id: str) -> None:
    """Run the pipeline for one lead, with the leads waiting beside it in its lane
    (``lead_process_batched``; idempotent: a redelivered message is a no-op)."""
    failures = lead_process_batched(lead_id=lead_id)
    if failures:
        logger.warning("%d lead(s) routed beside lead %s failed", failures, lead_id)


@shared_task(name="routing.process_leads")
def process_leads(lead_ids: list[str]) -> None:
    """Run the pipeline for a chunk of a batch; one lead's failure does not stop the others.

    Every id is processed here or handed back to its queue after ``ROUTING_CHUNK_SLICE_SECONDS``
    (``leads_process_chunk``: so a realtime lead does not wait for the whole chunk); nothing is
    dropped. The soft time limit does stop the chunk: the leads not reached are still waiting,
    and the sweeper requeues them.
    """
    outcome = leads_process_chunk(lead_ids=list(lead_ids))
    if outcome.failures:
        logger.warning("%d of %d lead(s) in a chunk failed", outcome.failures, outcome.processed)


from routing.delivery import tasks as delivery_tasks  # noqa: E402,F401
from routing.monitoring import tasks as monitoring_tasks  # noqa: E402,F401
