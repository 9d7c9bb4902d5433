"""Real processes for tests: celery workers, and the whole `make run` stack under config.stack."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def database_url() -> str:
    """A DATABASE_URL for the database this test run is using (the test database)."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    user = quote(s.get("USER") or "", safe="")
    password = quote(s.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}{s.get('HOST') or 'localhost'}{port}/{s['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that shares this test run's database and broker."""
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "LEADROUTER_BROKER_DIR": str(settings.BROKER_DIR),
            "PYTHONUNBUFFERED": "1",
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    env.update(extra)
    return env


@dataclass
class ManagedProcess:
    """A child process whose combined output is collected for assertions and failure reports."""

    popen: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(self.output)

    def wait_for_output(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return
            if self.popen.poll() is not None:
                raise AssertionError(f"process exited ({self.popen.returncode}):\n{self.text()}")
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} not seen within {timeout}s:\n{self.text()[-5000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        return self.popen.returncode


def start(args: list[str], env: dict[str, str]) -> ManagedProcess:
    popen = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    proc = ManagedProcess(popen)

    def pump() -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            proc.output.append(line)

    threading.Thread(target=pump, daemon=True).start()
    return proc


@contextlib.contextmanager
def celery_worker(
    *,
    concurrency: int = 1,
    queues: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
    pool: str | None = None,
    name: str | None = None,
) -> Iterator[ManagedProcess]:
    """A real ``celery -A config worker`` process on this test run's database and broker.

    ``pool="threads"`` is the I/O worker of the Procfile (``io``); ``name`` tells two workers of
    one test apart (celery warns about two nodes of the same name).
    """
    args = [str(BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO"]
    hostname = f"test-{os.getpid()}{f'-{name}' if name else ''}-%h"
    args += ["--concurrency", str(concurrency), "--hostname", hostname]
    if queues:
        args += ["--queues", ",".join(queues)]
    if pool:
        args += ["--pool", pool]
    proc = start(args, child_env(**(extra_env or {})))
    try:
        proc.wait_for_output(" ready.", timeout=60)
        yield proc
    finally:
        proc.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    predicate: Callable[[], object],
    timeout: float,
    interval: float = 0.2,
    message: str | Callable[[], str] = "",
) -> float:
    """Poll ``predicate`` until it is truthy; return the seconds it took.

    ``message`` may be a callable, so that a process's output is read when the wait fails, not
    when it starts (an f-string argument is evaluated before the first poll, when the output is
    usually still empty).
    """
    start_at = time.monotonic()
    deadline = start_at + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic() - start_at
        time.sleep(interval)
    text = message() if callable(message) else message
    raise AssertionError(text or f"condition not met within {timeout}s")


def processes_with_env(name: str, value: str) -> dict[int, str]:
    """Every live process whose environment has ``name=value``: pid -> command line.

    A supervisor may start each Procfile process in a group or session of its own (config.stack
    gives each a group; honcho gave each a session), so a process group says nothing about what
    belongs to a stack. A variable with a value unique to the test (its ``tmp_path``)
    does: every descendant inherits it, whatever session it runs in.
    """
    needle = f"{name}={value}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):  # a zombie's environ reads empty: not counted
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def wait_for_no_processes_with_env(name: str, value: str, timeout: float) -> dict[int, str]:
    """Wait until no process has ``name=value``; return (and SIGKILL) those still there then."""
    deadline = time.monotonic() + timeout
    while (left := processes_with_env(name, value)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return left


@contextlib.contextmanager
def status_server(extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """A real ``uvicorn config.asgi:application`` (make run's `status` process) on this test
    run's database and broker; yields its base URL once it answers."""
    with status_server_process(extra_env) as (base, _proc):
        yield base


@contextlib.contextmanager
def status_server_process(
    extra_env: dict[str, str] | None = None,
) -> Iterator[tuple[str, ManagedProcess]]:
    """``status_server``, yielding the process too (its output: what its listener logged)."""
    import urllib.request

    port = free_port()
    args = [str(BIN / "uvicorn"), "config.asgi:application", "--host", "127.0.0.1"]
    args += ["--port", str(port), "--no-access-log"]
    proc = start(args, child_env(**(extra_env or {})))
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            if proc.popen.poll() is not None:
                raise AssertionError(f"uvicorn exited:\n{proc.text()}") from None
            return False

    try:
        wait_until(answers, timeout=60, message=lambda: f"uvicorn never answered:\n{proc.text()}")
        yield base, proc
    finally:
        proc.stop()
