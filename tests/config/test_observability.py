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


# The settings' own sentry_sdk.init, with the client's transport swapped for one that keeps the
# envelopes: a reported exception must carry no frame variables (a request's `Authorization:
# Bearer …` header or an OAuth token form's client_secret held in a local of any frame).
CAPTURE_SCRIPT = """
import json, django
django.setup()
import sentry_sdk
from sentry_sdk.transport import Transport

class Keep(Transport):
    def __init__(self):
        super().__init__()
        self.envelopes = []
    def capture_envelope(self, envelope):
        self.envelopes.append(envelope)

keep = Keep()
sentry_sdk.get_client().transport = keep

def refresh_token():
    headers = {"Authorization": "Bearer tok3nSECRETvalue"}
    form = {"grant_type": "refresh_token", "client_secret": "cl1entSECRETvalue"}
    raise RuntimeError("token endpoint answered 500")

try:
    refresh_token()
except RuntimeError:
    sentry_sdk.capture_exception()
sentry_sdk.flush()
events = [item.payload.json for env in keep.envelopes for item in env.items if item.type == "event"]
print("EVENTS", json.dumps(events), flush=True)
"""


def test_sentry_events_carry_no_local_variables():
    child = {k: v for k, v in os.environ.items() if k not in ("SENTRY_DSN", "LOG_FORMAT")}
    child.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "SENTRY_DSN": "https://public@127.0.0.1:9/1",
        }
    )
    result = subprocess.run(
        [sys.executable, "-c", CAPTURE_SCRIPT],
        cwd=ROOT,
        env=child,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    line = next(x for x in result.stdout.splitlines() if x.startswith("EVENTS "))
    events = json.loads(line[len("EVENTS ") :])
    assert len(events) == 1
    frames = events[0]["exception"]["values"][0]["stacktrace"]["frames"]
    assert any(f["function"] == "refresh_token" for f in frames)
    assert all("vars" not in f for f in frames)
    text = json.dumps(events)
    assert "tok3nSECRETvalue" not in text
    assert "cl1entSECRETvalue" not in text
