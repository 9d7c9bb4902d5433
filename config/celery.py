"""The Celery app: ``celery -A config worker`` and ``celery -A config beat``."""

import os
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_process_init

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
worker_process_init.connect(_install_worker_session_timeouts, weak=False)
