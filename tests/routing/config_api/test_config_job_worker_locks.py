"""A publish job runs in a worker, whose PostgreSQL session has the
pipeline's ``lock_timeout`` (``config.celery.worker_session_timeouts``, 5 s by default).
``routing.drafts.jobs._long_transaction`` raises the statement, idle-in-transaction and lock
timeouts for the publish's one transaction (found by review: the lock timeout was not): its last
statement, the decide
lock taken exclusively (``decide_lock_exclusive``), waits for the leads being decided, and a
batch of leads holds that lock shared for its whole transaction. A batch a little over 5 s
long (a loaded machine) failed the publish with a raw lock-timeout error instead of it waiting
for the swap, as the synchronous publish in the web process did. It waits now."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction

from config.celery import worker_session_timeouts
from routing.admin_jobs import admin_job_run
from routing.decisions import DECIDE_LOCK, clear_live_config_cache
from routing.drafts.models import ConfigSnapshot
from routing.models import AdminJob
from routing.rules_io import rules_import
from tests.routing.config_api.test_config_publish_concurrency import (
    _changed_draft,
    _publish,
    _secret,
)
from tests.routing.test_pipeline import RULES

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_publish_job_in_a_worker_session_waits_for_a_batch_holding_the_decide_lock(
    settings: Any,
) -> None:
    settings.WORKER_DB_LOCK_TIMEOUT_MS = 1_000  # the worker's 5 s, shortened for the test
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    secret = _secret()
    draft_id = _changed_draft(["a.io"])
    job = _publish(draft_id, secret)
    held, release = threading.Event(), threading.Event()

    def batch_deciding() -> None:  # a batch of leads: the decide lock shared, 3 s
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))", [DECIDE_LOCK]
                )
                held.set()
                release.wait(3)
        finally:
            held.set()
            connection.close()

    thread = threading.Thread(target=batch_deciding)
    thread.start()
    error: BaseException | None = None
    try:
        assert held.wait(20)
        connection.close()
        connection.ensure_connection()
        worker_session_timeouts(connection=connection)  # as in a worker process
        try:
            admin_job_run(job_id=job["id"])
        except Exception as exc:
            error = exc
    finally:
        release.set()
        thread.join(30)
        connection.close()  # the next test's session without the worker's timeouts
    ended = AdminJob.objects.get(pk=job["id"])
    assert (ended.status, ended.error) == ("done", ""), (ended.status, ended.error, error)
    assert ConfigSnapshot.objects.count() == 2
    clear_live_config_cache()
