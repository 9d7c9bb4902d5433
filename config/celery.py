"""The Celery app: ``celery -A config worker`` and ``celery -A config beat``."""

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_ready,
)

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


def worker_lower_priority(**kwargs: Any) -> None:
    """Lower this worker's OS priority to ``WORKER_NICE`` before its pool starts (the pool's
    processes and threads inherit it): the web processes accept a spike first, and routing takes
    the CPU they leave (issue 18). Never raises a priority: that needs privileges."""
    from django.conf import settings

    target = max(0, min(19, int(settings.WORKER_NICE)))
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if target > current:
        os.setpriority(os.PRIO_PROCESS, 0, target)


worker_init.connect(worker_lower_priority, weak=False)


def worker_privacy_keys_check(**kwargs: Any) -> None:
    """A worker does not start with malformed privacy keys (``manage.py check`` says the same,
    leadrouter.E003): every lead would fail at its first sealed event. A master key that cannot
    open existing person keys is logged at CRITICAL, and the worker starts (new people route;
    the leads of those people fail with a privacy key error, counted in /metrics)."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import DatabaseError

    from leads import privacy

    problems = privacy.key_material_problems()
    if problems:
        raise ImproperlyConfigured(
            "privacy keys: " + "; ".join(problems) + ' (docs/operations.md, "Keys")'
        )
    try:
        groups = privacy.unopenable_key_groups()
    except DatabaseError:  # the database is not reachable yet: the first lead says it
        return
    for wrapped_by, n in groups:
        logging.getLogger(__name__).critical(
            "%d person key(s) wrapped by master key %s cannot be opened with PRIVACY_KEYS: "
            "their leads fail with a privacy key error until that key is back in PRIVACY_KEYS "
            '(docs/operations.md, "Losing a key")',
            n,
            wrapped_by,
        )


worker_init.connect(worker_privacy_keys_check, weak=False)
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


def _watch_broker_folders(sender: Any = None, **kwargs: Any) -> None:
    """On the filesystem broker, stop this worker (exit 70) when its folders vanish.

    ``var/`` removed under a running worker (``make clean``, a deleted test folder, an orphan
    of a stack that is gone) leaves nothing to consume or acknowledge; without this it depended
    on where the worker was whether it crashed or went on running, shut off from everything.
    A thread, so that it works whatever the main loop is doing (a warm shutdown included).
    """
    from django.conf import settings

    if not settings.BROKER_IS_FILESYSTEM:
        return
    folders = [Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS[key]) for key in _BROKER_FOLDERS]
    interval = settings.BROKER_FOLDER_CHECK_SECONDS

    def watch() -> None:
        while True:
            time.sleep(interval)
            missing = next((folder for folder in folders if not folder.is_dir()), None)
            if missing is None:
                continue
            logging.getLogger("config.celery").critical(
                "the filesystem broker's folder %s is gone: this worker stops (exit 70). "
                "Start the stack again (make run) to recreate it.",
                missing,
            )
            for handler in logging.getLogger().handlers:
                with contextlib.suppress(Exception):
                    handler.flush()
            # Not a graceful stop: with the broker gone nothing can be acknowledged or handed
            # back, and the pool's children end with this process (prefork sets their
            # PR_SET_PDEATHSIG). The leads are rows in the database: the sweeper resends them.
            os._exit(70)

    threading.Thread(target=watch, name="broker-folder-watch", daemon=True).start()


_BROKER_FOLDERS = ("data_folder_in", "processed_folder", "control_folder")
worker_ready.connect(_watch_broker_folders, weak=False, dispatch_uid="leadrouter-broker-watch")

task_prerun.connect(drop_broken_db_connections, weak=False, dispatch_uid="leadrouter-db-prerun")
task_postrun.connect(drop_broken_db_connections, weak=False, dispatch_uid="leadrouter-db-postrun")
