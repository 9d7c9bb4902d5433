"""The fault-test harness (issue 5 "Faults", issue 9 "Proof under fire"; reliability guide,
"Fault tests on one machine"): real processes on loopback that the tests start, fault and end
themselves, and the ground truth read from the database afterwards.

- ``Stack``: a throwaway ``redis-server`` on a free port as the broker (so a test may stop or
  pause it and use short visibility timeouts), gunicorn for intake (``config.settings.base``, as
  in production: background publisher, breaker), ``celery -A config worker`` processes
  (``Worker``) signalled by PID or process group, and the stale sweeper
  (``leads_requeue_stale``) in a bounded loop of its own (tests/reliability/sweeper.py).
- ``FAULT_SETTINGS``: short limits for the children, in the guide's ratios.
- ``SCALE`` (``RELIABILITY_SCALE``, default 1): multiplies the traffic of the tests (``scaled``).
  At 1 each test is the small version CI runs in ``make test`` (seconds to a minute each); ``make
  reliability`` runs them at 10, the sizes of the reliability guide's test plan (5,000 leads and
  13 kills for the SIGKILL test, for instance).

The shared PostgreSQL and Redis of the machine are never stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from django.db import connection
from django.db.models import Count, Max
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from audit.models import Event
from leads.models import Lead, LeadStatus
from routing.models import Assignment, TeamMembership
from tests.support.processes import (
    BIN,
    ManagedProcess,
    child_env,
    free_port,
    start,
    wait_until,
)

# Multiplies the traffic of the fault tests: 1 is CI's small version, `make reliability` runs 10.
SCALE = max(0.1, float(os.environ.get("RELIABILITY_SCALE", "1") or "1"))
# Waits grow with the traffic, never below their CI-sized values.
WAIT_SCALE = max(1.0, SCALE)


def scaled(n: float, least: int = 1) -> int:
    """``n`` at the current SCALE, as a whole count of at least ``least``."""
    return max(least, round(n * SCALE))


FINAL = (
    LeadStatus.ASSIGNED,
    LeadStatus.DUPLICATE,
    LeadStatus.EXCLUDED,
    LeadStatus.UNASSIGNED,
    LeadStatus.FAILED,
)
REPS = 7
BATCH = 50  # leads per batch request
MAX_ATTEMPTS = 3
# Short limits for the children, in the ratios the guide asks for: the visibility timeout is
# 2.5x the hard time limit; a lead's lease outlives what one lead takes by far.
FAULT_SETTINGS = {
    "CELERY_TASK_TIME_LIMIT": "10",
    "CELERY_TASK_SOFT_TIME_LIMIT": "8",
    "CELERY_VISIBILITY_TIMEOUT": "25",
    "LEAD_LEASE_SECONDS": "10",
    "LEAD_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
    # Lead ids per message. With the default 100 a chunk took 8-12 s on this 2-core machine
    # under the burst and ran into the short soft limit (a cut chunk burns the attempt of the
    # lead in progress): 20 keeps a task well inside the 10 s limit, as in production.
    "ENQUEUE_CHUNK_SIZE": "20",
    # The sweeper's (and gunicorn's) publishing pause after a broker failure: short here so a
    # test waits seconds, not the default 30 s, once the broker is back.
    "BROKER_BREAKER_SECONDS": "2",
    # No e-mail to the reps: the SIGKILL test's webhooks to a CRM stand-in are the delivery work.
    "DELIVERY_EMAIL_ENABLED": "0",
    # That CRM listens on loopback. A delivery attempt cut short by a kill is sent again once
    # its lease is over (production: the 10 s timeout + 50 s).
    "DELIVERY_ALLOW_PRIVATE_URLS": "1",
    "DELIVERY_TIMEOUT_SECONDS": "5",
    "DELIVERY_LEASE_SECONDS": "15",
    "DELIVERY_REDISPATCH_SECONDS": "15",
    "LOG_LEVEL": "INFO",
}


def rules(reps: int) -> dict:
    people = [
        {"email": f"rep{i}@example.com", "name": f"Rep {i}", "timezone": "UTC"} for i in range(reps)
    ]
    return {
        "reps": people,
        "teams": [
            {
                "name": "Inbound",
                "strategy": "round_robin",
                "members": [{"rep": p["email"]} for p in people],
            }
        ],
        "ruleset": {
            "name": "Inbound",
            "rules": [
                {"name": "Everyone", "priority": 10, "action": {"type": "team", "team": "Inbound"}}
            ],
        },
    }


# --- Processes -------------------------------------------------------------------------------


def redis_server(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    """A throwaway redis-server without persistence: stopping it loses every queued message."""
    return subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def pool_children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(p) for p in (task / "children").read_text().split()]
    return found


@dataclass
class Worker:
    """One ``celery -A config worker`` that the test kills (SIGKILL) and starts again."""

    name: str
    env: dict[str, str]
    concurrency: int = 2
    include: str | None = None
    proc: ManagedProcess | None = None
    past_output: list[str] = field(default_factory=list)

    def start(self) -> None:
        args = [str(BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO"]
        args += ["--concurrency", str(self.concurrency), "--hostname", f"{self.name}@%h"]
        if self.include:
            args += ["--include", self.include]
        self.proc = start(args, self.env)

    def wait_ready(self, timeout: float = 60) -> None:
        assert self.proc is not None
        self.proc.wait_for_output(" ready.", timeout=timeout)

    def shut_down(self, sig: int, timeout: float) -> float:
        """Send ``sig`` to the main process only, as an orchestrator does (Docker signals PID 1),
        and wait for the whole worker to exit; returns the seconds it took (then SIGKILLs)."""
        assert self.proc is not None
        started = time.monotonic()
        os.kill(self.proc.popen.pid, sig)
        try:
            self.proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.popen.pid, signal.SIGKILL)
            self.proc.popen.wait(10)
        took = time.monotonic() - started
        time.sleep(0.2)  # let the output pump drain
        self.past_output.append(self.proc.text())
        self.proc = None
        return took

    def kill_group(self) -> None:
        """SIGKILL the main process and its pool children at once (a node dying)."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.popen.pid, signal.SIGKILL)
        self.proc.popen.wait(10)
        time.sleep(0.2)  # let the output pump drain
        self.past_output.append(self.proc.text())
        self.proc = None

    def kill_child(self) -> bool:
        """SIGKILL one pool child; the main process notices and forks another."""
        assert self.proc is not None
        children = pool_children(self.proc.popen.pid)
        if not children:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(children[0], signal.SIGKILL)
        return True

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(signal.SIGKILL if self.proc.popen.poll() is None else signal.SIGTERM)
            self.past_output.append(self.proc.text())
            self.proc = None

    def text(self) -> str:
        return "".join(self.past_output) + (self.proc.text() if self.proc else "")


class Stack:
    """The processes of one fault test, all on loopback; ``close`` ends every one it started."""

    def __init__(self, tmp_path: Path, **extra: str) -> None:
        self.tmp_path = tmp_path
        self.redis_port = free_port()
        self.web_port = free_port()
        broker = f"redis://127.0.0.1:{self.redis_port}/0"
        self.env = child_env(
            **{
                "LEADROUTER_VAR_DIR": str(tmp_path),
                "REDIS_URL": broker,
                "CELERY_BROKER_URL": broker,
                "CACHE_URL": "locmemcache://",
                **FAULT_SETTINGS,
                **extra,
            }
        )
        self.redis: subprocess.Popen[bytes] | None = None
        self.web: ManagedProcess | None = None
        self.sweeper: ManagedProcess | None = None
        self.workers: list[Worker] = []
        self.beats: dict[str, ManagedProcess] = {}
        self.base = f"http://127.0.0.1:{self.web_port}"

    def start_redis(self) -> None:
        self.redis = redis_server(self.redis_port, self.tmp_path)
        port = self.redis_port

        def accepting() -> bool:
            with contextlib.suppress(OSError), socket_to(port):
                return True
            return False

        wait_until(accepting, timeout=10, interval=0.05, message="redis-server did not start")

    def stop_redis(self) -> None:
        assert self.redis is not None
        self.redis.terminate()
        self.redis.wait(10)
        self.redis = None

    def redis_cli(self, *args: str) -> str:
        """Run ``redis-cli`` against the throwaway redis-server (never the machine's)."""
        cli = shutil.which("redis-cli") or "redis-cli"
        done = subprocess.run(
            [cli, "-h", "127.0.0.1", "-p", str(self.redis_port), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return done.stdout.strip()

    def start_web(self, concurrency: int = 1, config: str = "config/gunicorn.py") -> None:
        env = dict(
            self.env,
            DJANGO_SETTINGS_MODULE="config.settings.base",
            PORT=str(self.web_port),
            WEB_CONCURRENCY=str(concurrency),
            ALLOWED_HOSTS="127.0.0.1",
        )
        self.web = start([str(BIN / "gunicorn"), "config.wsgi:application", "-c", config], env)
        wait_until(
            lambda: http_get(f"{self.base}/healthz") == 200,
            timeout=60,
            message=lambda: f"gunicorn did not start:\n{self.web.text()[-3000:]}",
        )

    def start_sweeper(
        self, *, every: float, older_than: float, duration: float, deliveries: bool = False
    ) -> None:
        args = [str(BIN / "python"), "-m", "tests.reliability.sweeper"]
        args += ["--every", str(every), "--older-than", str(older_than), "--for", str(duration)]
        args += ["--deliveries"] if deliveries else []
        self.sweeper = start(args, self.env)
        self.sweeper.wait_for_output("sweeper ready", timeout=60)

    def worker(self, name: str, **kwargs: object) -> Worker:
        worker = Worker(name, self.env, **kwargs)  # type: ignore[arg-type]
        self.workers.append(worker)
        worker.start()
        return worker

    def beat(self, name: str, **extra: str) -> ManagedProcess:
        """A ``celery -A config beat`` (the database scheduler), with ``extra`` in its env."""
        args = [str(BIN / "celery"), "-A", "config", "beat", "--loglevel", "INFO"]
        self.beats[name] = start(args, dict(self.env, **extra))
        return self.beats[name]

    def logs(self) -> str:
        parts = [f"--- {w.name}\n{w.text()[-3000:]}" for w in self.workers]
        parts += [f"--- beat {n}\n{b.text()[-1500:]}" for n, b in self.beats.items()]
        if self.sweeper:
            parts.append(f"--- sweeper\n{self.sweeper.text()[-1500:]}")
        if self.web:
            parts.append(f"--- web\n{self.web.text()[-1500:]}")
        return "\n".join(parts)

    def close(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(Exception):
                worker.stop()
        keep = os.environ.get("FAULT_LOG_DIR")  # to read the children's whole logs afterwards
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for worker in self.workers:
                (Path(keep) / f"{worker.name}.log").write_text(worker.text())
        for proc in (self.sweeper, self.web, *self.beats.values()):
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.stop()
        if self.redis is not None:
            self.redis.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.redis.wait(10)
        connection.close()


@contextlib.contextmanager
def socket_to(port: int) -> Iterator[None]:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        yield


# --- HTTP ------------------------------------------------------------------------------------


def http_get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def post(url: str, body: object, token: str) -> tuple[int, float]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError:
        status = 0
    return status, time.monotonic() - started


def post_batch(stack: Stack, slug: str, records: list[dict]) -> tuple[int, float]:
    return post(f"{stack.base}/api/v1/intake/{slug}/batch/", records, f"token-{slug}")


# --- Ground truth ----------------------------------------------------------------------------


def unfinished() -> int:
    return Lead.objects.exclude(status__in=FINAL).count()


def assert_exact_routing(routed_leads: int) -> None:
    """One assignment per routed lead, one ``assigned`` event each, exact round robin."""
    assert Assignment.objects.count() == routed_leads
    per_lead = Assignment.objects.values("lead").annotate(n=Count("id"))
    assert per_lead.count() == routed_leads
    assert per_lead.aggregate(m=Max("n"))["m"] == 1
    assigned_events = Event.objects.filter(type="assigned").values("lead").annotate(n=Count("id"))
    assert assigned_events.count() == routed_leads
    assert assigned_events.aggregate(m=Max("n"))["m"] == 1
    assert Event.objects.filter(type="assigned").count() == routed_leads
    # Rotation: in the order the assignments were made under the team's lock, the members in
    # turn, whatever was killed on the way (a killed transaction moves no turn).
    members = list(TeamMembership.objects.order_by("position").values_list("rep_id", flat=True))
    routed = list(
        Assignment.objects.filter(kind="initial").order_by("id").values_list("rep_id", flat=True)
    )
    assert routed == [members[k % REPS] for k in range(routed_leads)]
    low, extra = divmod(routed_leads, REPS)
    assert sorted(Counter(routed).values()) == [low] * (REPS - extra) + [low + 1] * extra


def assert_one_received_event_each(leads: int, also: dict[str, int] | None = None) -> None:
    """One ``received`` event per lead, one outcome event per lead in a final state (``assigned``
    or ``failed``, as its status), ``also`` (e.g. ``{"delivered": n}``), and no other event on any
    lead: nothing doubled by a retry."""
    received = Event.objects.filter(type="received").values("lead").annotate(n=Count("id"))
    assert received.count() == leads
    assert received.aggregate(m=Max("n"))["m"] == 1
    statuses = Counter(Lead.objects.values_list("status", flat=True))
    outcomes = {status: n for status, n in statuses.items() if status in ("assigned", "failed")}
    on_leads = Counter(Event.objects.filter(lead__isnull=False).values_list("type", flat=True))
    assert dict(on_leads) == {"received": leads, **outcomes, **(also or {})}, (on_leads, statuses)


LOG_SIGNS = {
    "soft_time_limit": "Soft time limit",
    "hard_time_limit": "Hard time limit",
    "worker_lost": "WorkerLostError",
    "lease_lost": "writing nothing",
    "contention": "met lock contention",
    "lead_errors": "processing lead",
    "broker_lost": "Connection to broker lost",
}


def log_signs(workers: list[Worker]) -> dict[str, int]:
    """How often the workers logged each sign of trouble (for the figures; not asserted)."""
    text = "".join(w.text() for w in workers)
    return {name: text.count(needle) for name, needle in LOG_SIGNS.items() if needle in text}


def report_figures(name: str, figures: dict[str, object]) -> None:
    line = f"[fault figures] {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items())
    print(line)
    out = os.environ.get("FAULT_FIGURES_FILE")
    if out:
        with open(out, "a") as fh:
            fh.write(line + "\n")


# --- A CRM stand-in ------------------------------------------------------------------------------


class WebhookReceiver:
    """A CRM on loopback: it records every webhook's ``webhook-id`` and lead, checks its
    Standard Webhooks signature, and answers 200 after ``delay`` seconds. A CRM that honours
    Standard Webhooks acts once per ``webhook-id``: ``effects()`` counts those, per lead.

    ``hold_next()`` keeps the next request waiting (unanswered) and says which client port sent
    it, so that a test can kill the process in the middle of that send."""

    def __init__(self, delay: float = 0.05) -> None:
        self.received: list[tuple[str, str]] = []  # (webhook-id, lead id), in arrival order
        self.bodies: dict[str, set[bytes]] = {}  # webhook-id -> the bodies sent with it
        self.bad_signatures = 0
        self.secret = ""  # the endpoint's, once it exists
        self._lock = threading.Lock()
        self._armed = False
        self._held = threading.Event()
        self._release = threading.Event()
        self.held_port: int | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                message_id = self.headers.get("webhook-id", "")
                # Checked with the reference implementation, not with our own signing code.
                try:
                    Webhook(receiver.secret).verify(body, dict(self.headers))
                    signed = True
                except WebhookVerificationError:
                    signed = False
                with receiver._lock:
                    receiver.received.append((message_id, json.loads(body)["data"]["lead"]["id"]))
                    receiver.bodies.setdefault(message_id, set()).add(body)
                    if not signed:
                        receiver.bad_signatures += 1
                    hold, receiver._armed = receiver._armed, False
                if hold:
                    receiver.held_port = self.client_address[1]
                    receiver._held.set()
                    receiver._release.wait(60)
                time.sleep(delay)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A sender killed mid-request leaves a broken pipe: expected there, not worth a
        # traceback. Every handler error is kept by type, for the test to check.
        self.handler_errors: list[str] = []

        def handle_error(request: object, client_address: object) -> None:
            self.handler_errors.append(type(sys.exc_info()[1]).__name__)

        self._server.handle_error = handle_error  # type: ignore[method-assign,assignment]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/crm/leads"

    def hold_next(self, timeout: float) -> int | None:
        """Hold the next request unanswered; the client port that sent it (None: none came)."""
        self._held.clear()
        self._release.clear()
        with self._lock:
            self._armed = True
        if self._held.wait(timeout):
            return self.held_port
        with self._lock:
            self._armed = False
        return None

    def arm(self) -> None:
        """Hold the next request unanswered when it comes (``held()`` tells when it has)."""
        self._held.clear()
        self._release.clear()
        with self._lock:
            self._armed = True

    def held(self) -> int | None:
        """The client port of the request held since ``arm()``, None while none has come."""
        return self.held_port if self._held.is_set() else None

    def release(self) -> None:
        self._release.set()

    def effects(self) -> Counter[str]:
        """Per lead, how many distinct webhooks (by ``webhook-id``) reached the CRM."""
        with self._lock:
            return Counter(lead for _, lead in set(self.received))

    def message_ids(self) -> set[str]:
        with self._lock:
            return {message for message, _ in self.received}

    def resends(self) -> int:
        """Requests beyond the first of each ``webhook-id`` (at-least-once sends)."""
        with self._lock:
            return len(self.received) - len({message for message, _ in self.received})

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()


def pid_with_socket(local_port: int, pids: list[int]) -> int | None:
    """Which of ``pids`` holds the loopback TCP socket bound to ``local_port`` (Linux /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == local_port:
                    inodes.add(f"socket:[{fields[9]}]")
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return pid
    return None


# --- A throwaway PostgreSQL cluster --------------------------------------------------------------


def postgres_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` live: ``PG_BINDIR``, else PATH, else ``pg_config``."""
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    pg_config = shutil.which("pg_config")
    if pg_config:
        done = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        bindir = Path(done.stdout.strip())
        if (bindir / "initdb").exists():
            return bindir
    return None


class ThrowawayPostgres:
    """A PostgreSQL cluster of the test's own (``initdb`` + ``pg_ctl``) on a free loopback port,
    with trust auth, no fsync, and its socket in its own folder: the test may stop it.

    PostgreSQL refuses to run as root: as root (CI), every ``initdb``/``pg_ctl`` runs as the
    ``postgres`` user (``runuser``), in a temporary folder that user owns (pytest's tmp_path is
    private to root). The machine's own cluster is never touched.
    """

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="leadrouter-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres"
            import pwd

            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.running = False

    def _run(self, *args: str, timeout: float = 120) -> str:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.user is not None:
            command = [shutil.which("runuser") or "runuser", "-u", self.user, "--", *command]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=self.root, check=False
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n"
                + (self.log.read_text()[-3000:] if self.log.exists() else "")
            )
        return done.stdout

    def init(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off -c max_connections=60"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> Any:
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=database, autocommit=True
        )

    def create_database(self, name: str) -> str:
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self) -> None:
        if self.running:
            with contextlib.suppress(Exception):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self.running = False
        shutil.rmtree(self.root, ignore_errors=True)
