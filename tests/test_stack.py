"""`make run` for real: gunicorn + celery worker + celery beat under honcho."""

from __future__ import annotations

import http.cookiejar
import os
import signal
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from django.contrib.auth import get_user_model

from routing.models import QueueHeartbeat
from tests.support.processes import BIN, child_env, free_port, start, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def test_web_worker_and_beat_run_together_and_stop_on_ctrl_c(tmp_path, settings):
    # The web process runs production settings, whose hashers do not include the test's MD5.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    get_user_model().objects.create_superuser("boss", "boss@example.com", "correct-horse-42")
    port = free_port()
    env = child_env(
        DJANGO_SETTINGS_MODULE="config.settings.base",  # exactly what `make run` uses
        LEADROUTER_VAR_DIR=str(tmp_path),
        PORT=str(port),
        HOST="127.0.0.1",
        HEARTBEAT_INTERVAL_SECONDS="1",
        WEB_CONCURRENCY="1",
    )
    # `make run` itself: setup is done already, migrate is a no-op on the test database, and
    # seed_demo --if-empty leaves it alone. The venv is deliberately not on PATH.
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(BIN))
    stack = start(["make", "run", f"PORT={port}", "HOST=127.0.0.1"], env)
    base = f"http://127.0.0.1:{port}"
    try:
        waited = wait_until(
            lambda: _status(f"{base}/readyz") == 200,
            timeout=60,
            message=f"/readyz never answered 200:\n{stack.text()[-4000:]}",
        )
        print(f"first 200 from /readyz after {waited:.1f}s")

        # Beat publishes a heartbeat into every queue; the worker executes them.
        wait_until(
            lambda: QueueHeartbeat.objects.count() == 4,
            timeout=90,
            message=f"beat -> worker heartbeats missing:\n{stack.text()[-4000:]}",
        )

        # The admin login works through the real web server (static files served too).
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        with opener.open(f"{base}/admin/login/", timeout=5) as page:
            assert page.status == 200
        csrf = next(c.value for c in jar if c.name == "csrftoken")
        form = urllib.parse.urlencode(
            {
                "username": "boss",
                "password": "correct-horse-42",
                "csrfmiddlewaretoken": csrf,
                "next": "/admin/",
            }
        ).encode()
        request = urllib.request.Request(
            f"{base}/admin/login/", data=form, headers={"Referer": f"{base}/admin/login/"}
        )
        with opener.open(request, timeout=5) as landed:
            assert landed.url.rstrip("/").endswith("/admin")
            assert b"Site administration" in landed.read()
        assert _status(f"{base}/static/admin/css/base.css") == 200
    finally:
        returncode = stack.stop(sig=signal.SIGINT, timeout=45)
    output = stack.text()
    assert "Booting worker" in output  # gunicorn
    assert " ready." in output  # celery worker
    assert "beat: Starting" in output
    time.sleep(0.5)
    assert _status(f"{base}/healthz") == 0, "web still answering after Ctrl-C"
    assert returncode != -signal.SIGKILL, "Ctrl-C did not stop make run within 45 s"
    # Nothing of the stack is left running (all of it shares the terminal's process group).
    try:
        os.killpg(stack.popen.pid, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError(f"processes left after Ctrl-C:\n{output[-3000:]}")
