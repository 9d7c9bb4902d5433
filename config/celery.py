"""The Celery app: ``celery -A config worker`` and ``celery -A config beat``."""

import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_init, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")

app = Celery("leadrouter")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def worker_session_timeouts(sender: Any = None, connection: Any = None, **kwargs: Any) -> None:
    """On PostgreSQL, bound how long a worker's statement may wait for a lock, run, or sit idle
    in a transaction, so one stuck lock cannot freeze the pipeline (reliability guide)."""
    if connection is None or connection.vendor != "postgresql":
        return
    from django.conf import settings

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('lock_timeout', %s, false),"
            " set_config('statement_timeout', %s, false),"
            " set_config('idle_in_transaction_session_timeout', %s, false)",
            [
                f"{settings.WORKER_DB_LOCK_TIMEOUT_MS}ms",
                f"{settings.WORKER_DB_STATEMENT_TIMEOUT_MS}ms",
                f"{settings.WORKER_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS}ms",
            ],
        )


def _install_worker_session_timeouts(**kwargs: Any) -> None:
    from django.db import connections
    from django.db.backends.signals import connection_created

    connection_created.connect(
        worker_session_timeouts, weak=False, dispatch_uid="leadrouter-worker-timeouts"
    )
    for connection in connections.all(initialized_only=True):
        connection.close()  # opened before this point: reopen with the timeouts


worker_init.connect(_install_worker_session_timeouts, weak=False)


def _preload_geography(**kwargs: Any) -> None:
    """Build the localised country and region indexes once in the worker's parent (0.7 s),
    before the pool forks: the children share them, and no lead waits for them."""
    from leads.normalize import preload_geography

    preload_geography()


worker_init.connect(_preload_geography, weak=False)
worker_process_init.connect(_install_worker_session_timeouts, weak=False)


def drop_broken_db_connections(**kwargs: Any) -> None:
    """Close this process's database connections that broke or outlived ``CONN_MAX_AGE``, as
    Django does around every request; the next query reconnects.

    Celery's Django fix-up keeps connections across tasks (``CELERY_DB_REUSE_MAX``) and closes
    them only every so many tasks, never because they broke: after a database restart or
    failover, every later task of a pool process failed on ``the connection is closed`` (code
    outside a transaction block, like the lead's claim, does not drop the dead connection),
    and leads stayed waiting until thousands of tasks had gone by. Found by the PostgreSQL
    outage fault test (tests/reliability/test_proof_under_fire.py).
    """
    task = kwargs.get("task")
    if getattr(getattr(task, "request", None), "is_eager", False):
        return  # run in the caller's process (tests): its connection is the caller's business
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


task_prerun.connect(drop_broken_db_connections, weak=False, dispatch_uid="leadrouter-db-prerun")
task_postrun.connect(drop_broken_db_connections, weak=False, dispatch_uid="leadrouter-db-postrun")
