"""``check_backlog`` inside the beat process, so that what stops workers is still reported.

The beat task ``maintenance.check_backlog`` needs a broker to carry it and a worker to run it:
exactly what is missing when the broker is dead or no worker drains the ``maintenance``
queue. So beat also runs the check itself, in a daemon thread, every
``BACKLOG_CHECK_INTERVAL_SECONDS`` (``BACKLOG_CHECK_IN_BEAT``). Running it twice is harmless:
alerts are one per (kind, subject) and opening one notifies once.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.db import close_old_connections

logger = logging.getLogger(__name__)

_started = threading.Event()


def watchdog_tick() -> None:
    """One check from the beat process; never raises (a failure is logged and retried)."""
    from routing.monitoring.backlog import backlog_check

    close_old_connections()
    try:
        backlog_check()
    except Exception:  # the database may be down; the next tick tries again
        logger.exception("the beat watchdog's backlog check failed")
    finally:
        close_old_connections()


def _loop(stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        watchdog_tick()


def start_watchdog(interval: float | None = None) -> threading.Event:
    """Start the watchdog thread once per process; returns the event that stops it."""
    stop = threading.Event()
    if _started.is_set():
        return stop
    _started.set()
    seconds = interval or settings.BACKLOG_CHECK_INTERVAL_SECONDS
    threading.Thread(
        target=_loop, args=(stop, seconds), name="leadrouter-watchdog", daemon=True
    ).start()
    logger.info("beat watchdog: checking the backlog every %.0f s in this process", seconds)
    return stop


def _on_beat_init(sender: Any = None, **kwargs: Any) -> None:
    if settings.BACKLOG_CHECK_IN_BEAT:
        start_watchdog()


def connect_beat_watchdog() -> None:
    """Hook the watchdog to ``celery beat`` start-up (idempotent)."""
    from celery.signals import beat_init

    beat_init.connect(_on_beat_init, weak=False, dispatch_uid="leadrouter-beat-watchdog")
