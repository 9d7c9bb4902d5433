"""The Makefile for real: `make run` (gunicorn + celery worker + celery beat under config.stack) and
the exit status of `make test`."""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from config.celery import app as celery_app
from leads.models import Lead, LeadStatus
from routing.models import QueueHeartbeat
from tests.leads.factories import SourceFactory
from tests.support.processes import (
    BIN,
    ROOT,
    child_env,
    free_port,
    processes_with_env,
    start,
    wait_for_no_processes_with_env,
    wait_until,
)

# A `make` started by a test must not inherit the make that runs the suite (`make test
# PYTEST_ARGS=...` passes its variables down in MAKEFLAGS).
MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "PYTEST_ARGS")


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _post_json(url: str, body: dict[str, str], token: str) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), {"body": exc.read().decode(errors="replace")}


def _describe(processes: dict[int, str]) -> str:
    return "\n".join(f"  {pid}: {cmdline}" for pid, cmdline in sorted(processes.items()))


@pytest.mark.worker
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_web_worker_and_beat_run_together_and_stop_on_ctrl_c(tmp_path, settings):
    # The web process runs production settings, whose hashers do not include the test's MD5.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    get_user_model().objects.create_superuser("boss", "boss@example.com", "correct-horse-42")
    SourceFactory(slug="stack")  # token `token-stack`
    port = free_port()
    # Every process of this stack, in whatever session or group it runs, inherits this value.
    marker = ("LEADROUTER_VAR_DIR", str(tmp_path))
    env = child_env(
        DJANGO_SETTINGS_MODULE="config.settings.base",  # exactly what `make run` uses
        LEADROUTER_VAR_DIR=str(tmp_path),
        PORT=str(port),
        STATUS_PORT=str(free_port()),  # PORT + 1, make's default, may be taken on a busy machine
        HOST="127.0.0.1",
        HEARTBEAT_INTERVAL_SECONDS="1",
        WEB_CONCURRENCY="1",
    )
    for name in MAKE_VARIABLES:
        env.pop(name, None)
    # `make run` itself: setup is done already, migrate is a no-op on the test database, and
    # seed_demo --if-empty leaves it alone. The venv is deliberately not on PATH.
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(BIN))
    stack = start(["make", "run", f"PORT={port}", "HOST=127.0.0.1"], env)
    base = f"http://127.0.0.1:{port}"
    try:
        waited = wait_until(
            lambda: _status(f"{base}/readyz") == 200,
            # migrate, seed_demo and collectstatic (a fresh clone has no static yet) run first;
            # on CI's two busy cores that has taken more than a minute.
            timeout=150,
            message=lambda: f"/readyz never answered 200:\n{stack.text()[-4000:]}",
        )
        print(f"first 200 from /readyz after {waited:.1f}s")

        # Once up, `make run` says what to try first.
        wait_until(
            lambda: "Three things to try" in stack.text(),
            timeout=30,
            message=lambda: f"no first-steps hints:\n{stack.text()[-4000:]}",
        )
        assert f"{base}/dashboard/" in stack.text()
        assert "make spike" in stack.text()

        # Beat publishes a heartbeat into every queue; the worker executes them.
        wait_until(
            # One per declared queue (there were four before the CRM queue: `== 4` only passed
            # when a poll happened to fall between the fourth heartbeat and the fifth).
            lambda: QueueHeartbeat.objects.count() == len(celery_app.conf.task_queues),
            timeout=90,
            message=lambda: f"beat -> worker heartbeats missing:\n{stack.text()[-4000:]}",
        )

        # The stack is web, worker and beat (plus make and the supervisor), each found by its
        # environment, not by a process group it does not share.
        running = processes_with_env(*marker)
        print(f"{len(running)} stack processes:\n{_describe(running)}")
        assert len(running) >= 4, f"too few stack processes:\n{_describe(running)}"
        for what, words in {
            "web": ("gunicorn",),
            "worker": (
                "celery",
                "worker",
                "routing.realtime,maintenance,routing,routing.bulk",
            ),
            "io worker": (
                "celery",
                "worker",
                "enrichment.realtime,crm.realtime,enrichment,crm,delivery",
                "--pool threads",
            ),
            "beat": ("celery", "beat"),
        }.items():
            assert any(all(w in cmd for w in words) for cmd in running.values()), (
                f"no {what} process among:\n{_describe(running)}"
            )

        # A task enqueued by the web process is executed by the worker process: the lead is
        # stored as `received` by gunicorn and processed (normalised, routed) by celery.
        status, answer = _post_json(
            f"{base}/api/v1/intake/stack/",
            {"email": "ana@acme.de", "country": "Germany"},
            token="token-stack",
        )
        assert status == 202, (status, answer, stack.text()[-4000:])
        lead_id = answer["id"]
        waited = wait_until(
            # `processing` is the worker's lease, not an outcome: wait for a final status.
            lambda: (
                Lead.objects.get(id=lead_id).status
                not in (LeadStatus.RECEIVED, LeadStatus.PROCESSING)
            ),
            timeout=60,
            message=lambda: f"lead {lead_id} never reached a final status:\n{stack.text()[-4000:]}",
        )
        print(f"lead processed {waited:.1f}s after the 202")
        lead = Lead.objects.get(id=lead_id)
        assert lead.status == LeadStatus.UNASSIGNED, (lead.status, lead.last_error)
        assert lead.country == "DE"
        assert lead.email == "ana@acme.de"
        # Executed once, from the web process's own message, not re-sent by the stale sweeper.
        assert lead.attempts == 1
        assert lead.requeued_at is None

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
        # Whatever failed above, nothing of this stack may outlive the test (left ones are
        # killed here, and reported below).
        left = wait_for_no_processes_with_env(*marker, timeout=15)
    output = stack.text()
    assert not left, f"processes left running after Ctrl-C:\n{_describe(left)}\n{output[-3000:]}"
    assert returncode != -signal.SIGKILL, "Ctrl-C did not stop make run within 45 s"
    assert "Booting worker" in output  # gunicorn
    assert " ready." in output  # celery worker
    assert "beat: Starting" in output
    assert _status(f"{base}/healthz") == 0, "web still answering after Ctrl-C"


def _stack_env(tmp_path: Path, port: int) -> dict[str, str]:
    env = child_env(
        DJANGO_SETTINGS_MODULE="config.settings.base",
        LEADROUTER_VAR_DIR=str(tmp_path),
        PORT=str(port),
        STATUS_PORT=str(free_port()),
        HOST="127.0.0.1",
        WEB_CONCURRENCY="1",
    )
    for name in MAKE_VARIABLES:
        env.pop(name, None)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(BIN))
    return env


@pytest.mark.worker
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "how",
    [
        # A process manager: SIGTERM to the whole group, SIGKILL to it 2 s later.
        "group SIGTERM, then SIGKILL",
        # `kill -9 <pid of make>`: nothing else of the stack is told.
        "SIGKILL to make alone",
    ],
)
def test_no_process_outlives_make_run_however_it_is_ended(tmp_path, how):
    """Issue 23, item 1: a celery worker survived `make run` ended by SIGTERM then SIGKILL."""
    port = free_port()
    marker = ("LEADROUTER_VAR_DIR", str(tmp_path))
    stack = start(["make", "run", f"PORT={port}", "HOST=127.0.0.1"], _stack_env(tmp_path, port))
    left: dict[int, str] = {}
    try:
        wait_until(
            lambda: _status(f"http://127.0.0.1:{port}/readyz") == 200 and " ready." in stack.text(),
            timeout=150,
            message=lambda: f"the stack never came up:\n{stack.text()[-4000:]}",
        )
        running = processes_with_env(*marker)
        assert any("worker" in cmd for cmd in running.values()), _describe(running)
        make = stack.popen.pid
        if how == "SIGKILL to make alone":
            os.kill(make, signal.SIGKILL)
        else:
            os.killpg(make, signal.SIGTERM)
            time.sleep(2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(make, signal.SIGKILL)
        # Each process ends within its stop grace (10 s) and a little more.
        left = wait_for_no_processes_with_env(*marker, timeout=25)
    finally:
        stack.stop(sig=signal.SIGKILL, timeout=10)
        left = left or wait_for_no_processes_with_env(*marker, timeout=5)
    assert not left, (
        f"processes left running after {how}:\n{_describe(left)}\n{stack.text()[-3000:]}"
    )


def test_process_scan_finds_what_a_process_group_check_misses(tmp_path):
    """The stack check above would also catch a process that left make's process group."""
    marker = ("LEADROUTER_VAR_DIR", str(tmp_path))
    env = {**os.environ, marker[0]: marker[1]}
    # A parent in a group of its own starts a child in a new session (as a supervisor like
    # honcho does) and exits.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess; subprocess.Popen(['sleep', '120'], start_new_session=True)",
        ],
        env=env,
        start_new_session=True,
    )
    parent.wait(10)
    with pytest.raises(ProcessLookupError):  # the old check: "nothing left in the group"
        os.killpg(parent.pid, 0)
    try:
        found = processes_with_env(*marker)
        assert list(found.values()) == ["sleep 120"]
    finally:
        left = wait_for_no_processes_with_env(*marker, timeout=0)
    assert list(left.values()) == ["sleep 120"]
    wait_until(lambda: not processes_with_env(*marker), timeout=5)


def _fake_venv(tmp_path: Path, pytest_exit: int) -> Path:
    """A virtualenv stand-in for the Makefile: up to date, with a `pytest` exiting as told."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "pytest"
    fake.write_text(f'#!/bin/sh\necho "fake pytest $*"\nexit {pytest_exit}\n')
    fake.chmod(0o755)
    (venv / ".synced").touch()  # newer than pyproject.toml and uv.lock: no `uv sync`
    return venv


@pytest.mark.parametrize(
    ("pytest_exit", "pytest_args", "make_exit"),
    [
        (5, "", 2),  # nothing collected by a plain `make test`: the suite is gone, a failure
        (5, "-k no_such_test", 0),  # nothing matched a filter: fine
        (0, "", 0),
        (1, "", 2),
        (1, "-k something", 2),
    ],
)
def test_make_test_exit_status(tmp_path, pytest_exit, pytest_args, make_exit):
    venv = _fake_venv(tmp_path, pytest_exit)
    env = {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES}
    # UV=true: whatever the checkout's uv state, this never bootstraps or syncs anything.
    args = ["make", "--no-print-directory", "test", f"VENV={venv}", "UV=true"]
    if pytest_args:
        args.append(f"PYTEST_ARGS={pytest_args}")
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert "fake pytest" in done.stdout, done.stdout + done.stderr
    assert done.returncode == make_exit, done.stdout + done.stderr
