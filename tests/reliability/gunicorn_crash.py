"""Test-only gunicorn settings: config/gunicorn.py, plus the commit-then-crash hook
(tests/reliability/crash.py) installed in every worker once the application is loaded.

The application is preloaded in the master, so a worker that the hook ends is replaced by a
fork in milliseconds instead of a fresh Django start-up (seconds on a busy 2-core machine): the
test measures the sweeper's recovery, not the machine's import time.
"""

from typing import Any

from config.gunicorn import *  # noqa: F403

preload_app = True


def post_worker_init(worker: Any) -> None:
    from tests.reliability import crash

    crash.install()
