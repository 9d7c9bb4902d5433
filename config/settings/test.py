"""Test overrides: only what must differ from base for the suite to be fast and isolated."""

import os
from pathlib import Path

_var = Path(os.environ.get("LEADROUTER_VAR_DIR", Path(__file__).resolve().parents[2] / "var"))
# Per test run, so that two runs in one checkout (or a run beside `make run`) never share a
# database file or a broker folder. Child processes get these through the environment.
os.environ.setdefault("LEADROUTER_BROKER_DIR", str(_var / f"test-broker-{os.getpid()}"))
os.environ.setdefault("LEADROUTER_STATUS_WAKE_DIR", str(_var / f"test-wake-{os.getpid()}"))

from config.settings.base import *  # noqa: E402, F403
from config.settings.base import DATABASES, IS_SQLITE, VAR_DIR  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if IS_SQLITE:
    # A file, not :memory:, so that real worker processes started by tests see the same data.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}

STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Tests change sources between requests; the source cache has its own test.
SOURCE_CACHE_SECONDS = 0

# Tests assert what was published right after a request; one test covers the background path.
ENQUEUE_IN_BACKGROUND = False
# Alerts resolve at the first clear check (tests that want the hold-down set it themselves).
ALERT_RESOLVE_AFTER_SECONDS = 0.0
# Transactional tests flush the database between tests, audit log included (audit's flush).
AUDIT_ALLOW_FLUSH = True

# Worker processes that tests start share the machine with the test process and, in CI, with
# another test run: they keep the test process's priority so that timings stay comparable.
# tests/routing/test_worker_process.py checks the setting on its own worker.
WORKER_NICE = int(os.environ.get("WORKER_NICE", "0"))
