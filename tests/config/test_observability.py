"""LOG_FORMAT=json and SENTRY_DSN, checked in a fresh process (settings are read at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import logging, django
django.setup()
import sentry_sdk
logging.getLogger("leads.test").warning("posted to /api/v1/intake/web/?token=s3cret&x=1")
print("SENTRY", sentry_sdk.get_client().is_active(), flush=True)
"""


def _run(**env: str) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if k not in ("SENTRY_DSN", "LOG_FORMAT")}
    child.update({"DJANGO_SETTINGS_MODULE": "config.settings.base", **env})
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=child,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_json_logs_are_one_object_per_line_with_tokens_redacted():
    result = _run(LOG_FORMAT="json")
    lines = [line for line in result.stderr.splitlines() if line.startswith("{")]
    record = json.loads(lines[-1])
    assert record["level"] == "WARNING"
    assert record["logger"] == "leads.test"
    assert record["message"] == "posted to /api/v1/intake/web/?token=[redacted]&x=1"
    assert "s3cret" not in result.stderr


def test_sentry_is_initialised_only_when_a_dsn_is_set():
    assert "SENTRY False" in _run().stdout
    with_dsn = _run(SENTRY_DSN="https://public@127.0.0.1:9/1")
    assert "SENTRY True" in with_dsn.stdout
