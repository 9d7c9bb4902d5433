"""Intake throughput and latency beside a bare DRF view, under gunicorn on PostgreSQL + Redis.

    .venv/bin/python -m bench.intake [--seconds 15] [--connections 16]

Needs PostgreSQL and Redis (BENCH_DATABASE_URL, BENCH_REDIS_URL; defaults on localhost) and
`wrk` (Debian package). It creates a fresh `leadrouter_bench` database, starts gunicorn with the
production settings (2 sync workers), and measures in one run:
  - a bare DRF APIView (the baseline), single-lead intake, with wrk;
  - batch intake (1,000-record JSON arrays) with a Python client on keep-alive connections.
With ``--waiters N`` it also starts the status process (uvicorn, ``config.asgi``), posts N
leads (one per waiter, as N submitted forms) and measures single-lead intake again while N status
requests wait on them (``?wait=10``, each asking again when answered; issue 20: intake with 1,000
open waiters should keep >= 0.9 x its rate without), then once more without them, and reports
the database connections and the status process's CPU-seconds meanwhile.
At the end it checks that every accepted lead is in the database.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TOKEN = "bench-token-0123456789abcdef0123456789abcdef"  # noqa: S105 (a throwaway local token)

WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %(token)s"
local n = 0
request = function()
  n = n + 1
  local body = string.format(
    '{"Email Address": "lead%%d.%%d@acme-%%d.com", "first_name": "Ana", "last_name": "Lopez",' ..
    ' "Company": "Acme %%d", "Country": "Germany", "phone": "+49 30 1234567",' ..
    ' "utm_source": "webinar", "employees": "51-200", "lead_score": 72}',
    math.random(1, 1000000), n, n %% 500, n %% 500)
  return wrk.format(nil, nil, nil, body)
end
"""


def env_for(database_url: str, redis_url: str, cache_url: str, var_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "CACHE_URL": cache_url,
            "LEADROUTER_VAR_DIR": var_dir,
            "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
            "WEB_CONCURRENCY": "2",
            "LOG_LEVEL": "WARNING",
        }
    )
    return env


def recreate_database(database_url: str) -> None:
    import psycopg

    parsed = urlparse(database_url)
    name = parsed.path.lstrip("/")
    admin_url = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def parse_wrk(output: str) -> dict[str, float]:
    def latency_ms(label: str) -> float:
        match = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE)
        if not match:
            return float("nan")
        value, unit = float(match.group(1)), match.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    total = re.search(r"(\d+) requests in", output)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    errors = re.search(r"Socket errors:.*", output)
    return {
        "rps": float(rps.group(1)) if rps else float("nan"),
        "requests": float(total.group(1)) if total else 0.0,
        "p50_ms": latency_ms("50"),
        "p99_ms": latency_ms("99"),
        "non2xx": float(non2xx.group(1)) if non2xx else 0.0,
        "socket_errors": 1.0 if errors else 0.0,
    }


def run_wrk(url: str, seconds: int, connections: int, script: str | None) -> dict[str, float]:
    args = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency"]
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        lua.write(
            script
            or 'wrk.method = "POST"\nwrk.body = "{}"\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
    try:
        out = subprocess.run(
            [*args, "-s", lua.name, url], capture_output=True, text=True, check=True
        )
    finally:
        os.unlink(lua.name)
    return parse_wrk(out.stdout)


def run_batches(port: int, seconds: int, clients: int, size: int) -> dict[str, float]:
    latencies: list[float] = []
    counts = {"accepted": 0, "errors": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(worker: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        batch_no = 0
        while time.monotonic() < deadline:
            batch_no += 1
            records = [
                {
                    "email": f"b{worker}.{batch_no}.{i}@acme-{i % 300}.com",
                    "company": f"Acme {i % 300}",
                    "country": "US",
                    "state": "CA",
                    "external_id": f"w{worker}-b{batch_no}-{i}",
                }
                for i in range(size)
            ]
            body = json.dumps(records)
            started = time.perf_counter()
            conn.request(
                "POST",
                "/api/v1/intake/bench/batch/",
                body=body,
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
            )
            response = conn.getresponse()
            payload = response.read()
            elapsed = time.perf_counter() - started
            with lock:
                latencies.append(elapsed * 1000)
                if response.status == 202:
                    counts["accepted"] += json.loads(payload)["accepted"]
                else:
                    counts["errors"] += 1
        conn.close()

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    latencies.sort()
    return {
        "leads_per_s": counts["accepted"] / wall,
        "accepted": counts["accepted"],
        "errors": counts["errors"],
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "requests": len(latencies),
    }


class Waiters:
    """N status requests held open on the status process, each asking again once answered."""

    def __init__(self, port: int, paths: list[str], count: int) -> None:
        self.port = port
        self.requests = [
            f"GET {path}?wait=10 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode() for path in paths
        ]
        self.selector = selectors.DefaultSelector()
        self.buffers: dict[socket.socket, bytes] = {}
        self.request_of: dict[socket.socket, bytes] = {}
        self.answers = 0
        self.errors = 0
        self.stop = threading.Event()
        for index in range(count):
            self._open(self.requests[index % len(self.requests)])
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _open(self, request: bytes) -> None:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(request)
        s.setblocking(False)
        self.buffers[s] = b""
        self.request_of[s] = request
        self.selector.register(s, selectors.EVENT_READ)

    def _run(self) -> None:
        while not self.stop.is_set():
            for key, _ in self.selector.select(0.5):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    chunk = s.recv(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    self.errors += 1
                    self.selector.unregister(s)
                    del self.buffers[s]
                    s.close()
                    self._open(self.request_of.pop(s))
                    continue
                data = self.buffers[s] + chunk
                if data.endswith((b"}", b"\r\n0\r\n\r\n")):
                    self.answers += 1
                    data = b""
                    s.setblocking(True)
                    s.sendall(self.request_of[s])
                    s.setblocking(False)
                self.buffers[s] = data

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for s in list(self.buffers):
            s.close()


def status_paths(port: int, count: int) -> list[str]:
    """The status URLs of ``count`` leads posted to the bench source, one per waiter as a form
    page would hold (no worker runs: they stay received)."""
    from concurrent.futures import ThreadPoolExecutor

    def post(indexes: range) -> list[str]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        paths = []
        for index in indexes:
            conn.request(
                "POST",
                "/api/v1/intake/bench/",
                body=json.dumps({"email": f"waiter{index}@example.com"}),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
            )
            response = conn.getresponse()
            body = json.loads(response.read())
            assert response.status == 202, body
            paths.append(str(urlparse(body["status_url"]).path))
        return paths

    with ThreadPoolExecutor(8) as pool:
        parts = pool.map(post, [range(start, count, 8) for start in range(8)])
    return [path for part in parts for path in part]


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the processes of one process group."""
    ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def database_connections(database_url: str) -> int:
    import psycopg

    name = urlparse(database_url).path.lstrip("/")
    admin_url = urlparse(database_url)._replace(path="/postgres").geturl()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [name]
        ).fetchone()
        return int(row[0]) if row else 0


def wait_ready(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit("gunicorn did not become ready")


def measure_with_waiters(
    port: int, env: dict[str, str], database_url: str, args: argparse.Namespace, url: str
) -> dict[str, dict[str, float]]:
    """Single intake with ``args.waiters`` status requests waiting on the status process, then
    again without them."""
    status_port = port + 1
    status = subprocess.Popen(
        [
            str(BIN / "uvicorn"),
            "config.asgi:application",
            "--port",
            str(status_port),
            "--no-access-log",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    script = WRK_SCRIPT % {"token": TOKEN}
    results: dict[str, dict[str, float]] = {}
    try:
        wait_ready(status_port)
        before = database_connections(database_url)
        waiters = Waiters(status_port, status_paths(port, args.waiters), args.waiters)
        try:
            time.sleep(3)  # every waiter has read its lead once and waits
            during = database_connections(database_url)
            cpu_before, answers_before = group_cpu_seconds(status.pid), waiters.answers
            results["single intake, waiters open"] = run_wrk(
                url, args.seconds, args.connections, script
            )
            status_cpu = group_cpu_seconds(status.pid) - cpu_before
            answered = waiters.answers - answers_before
        finally:
            waiters.close()
        results["single intake, waiters open"].update(
            {
                "waiters": float(args.waiters),
                "answers": float(answered),
                "status_cpu_s": status_cpu,
                "waiter_errors": float(waiters.errors),
                "db_before": float(before),
                "db_during": float(during),
            }
        )
    finally:
        os.killpg(status.pid, signal.SIGTERM)
        status.wait(30)
    results["single intake, again"] = run_wrk(url, args.seconds, args.connections, script)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--batch-clients", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--waiters", type=int, default=0, help="open status waiters (issue 20)")
    args = parser.parse_args()

    if shutil.which("wrk") is None:
        print("wrk is not installed (Debian package `wrk`)", file=sys.stderr)
        return 2
    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_bench"
    )
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    cache_url = os.environ.get("BENCH_CACHE_URL", "redis://127.0.0.1:6379/15")
    var_dir = tempfile.mkdtemp(prefix="leadrouter-bench-")
    env = env_for(database_url, redis_url, cache_url, var_dir)

    recreate_database(database_url)
    subprocess.run(["redis-cli", "-u", redis_url, "flushdb"], check=True, capture_output=True)
    subprocess.run(["redis-cli", "-u", cache_url, "flushdb"], check=True, capture_output=True)
    manage = [str(BIN / "python"), "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run(
        [*manage, "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    setup = (
        "from leads.models import Source, token_digest;"
        f"Source.objects.create(slug='bench', name='Bench', token_hash=token_digest('{TOKEN}'),"
        "rate_limit_per_minute=100000000, field_map={'Company': 'company'})"
    )
    subprocess.run([*manage, "shell", "-c", setup], cwd=ROOT, env=env, check=True)

    port = 18900 + os.getpid() % 50
    env["PORT"] = str(port)
    server = subprocess.Popen(
        [
            str(BIN / "gunicorn"),
            "config.wsgi:application",
            "--config",
            "config/gunicorn.py",
            "--access-logfile",
            "/dev/null",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    results: dict[str, dict[str, float]] = {}
    try:
        wait_ready(port)
        base = f"http://127.0.0.1:{port}"
        script = WRK_SCRIPT % {"token": TOKEN}
        run_wrk(f"{base}/bench/bare/", 3, args.connections, None)  # warm-up
        run_wrk(f"{base}/api/v1/intake/bench/", 3, args.connections, script)
        results["bare DRF view"] = run_wrk(
            f"{base}/bench/bare/", args.seconds, args.connections, None
        )
        results["single intake"] = run_wrk(
            f"{base}/api/v1/intake/bench/", args.seconds, args.connections, script
        )
        results["batch intake"] = run_batches(
            port, args.seconds, args.batch_clients, args.batch_size
        )
        if args.waiters:
            results.update(
                measure_with_waiters(port, env, database_url, args, f"{base}/api/v1/intake/bench/")
            )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)

    check = subprocess.run(
        [*manage, "shell", "-c", "from leads.models import Lead; print(Lead.objects.count())"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    stored = int(check.stdout.strip().splitlines()[-1])
    single, bare, batch = (
        results["single intake"],
        results["bare DRF view"],
        results["batch intake"],
    )
    expected = int(single["requests"] - single["non2xx"] + batch["accepted"])
    for extra in ("single intake, waiters open", "single intake, again"):
        if extra in results:
            expected += int(results[extra]["requests"] - results[extra]["non2xx"]) + 1

    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
    print(
        f"server: gunicorn sync x2, PostgreSQL + Redis; wrk -t2 -c{args.connections} "
        f"-d{args.seconds}s; batches: {args.batch_clients} clients x {args.batch_size} records\n"
    )
    print("| path | throughput | p50 | p99 | errors | ratio to bare DRF |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(
        f"| bare DRF APIView (baseline) | {bare['rps']:,.0f} req/s | {bare['p50_ms']:.1f} ms | "
        f"{bare['p99_ms']:.1f} ms | {bare['non2xx']:.0f} | 1.00 |"
    )
    print(
        f"| single-lead intake | {single['rps']:,.0f} req/s | {single['p50_ms']:.1f} ms | "
        f"{single['p99_ms']:.1f} ms | {single['non2xx']:.0f} | {single['rps'] / bare['rps']:.2f} |"
    )
    print(
        f"| batch intake ({args.batch_size}/request) | {batch['leads_per_s']:,.0f} leads/s | "
        f"{batch['p50_ms']:.0f} ms/batch | {batch['p99_ms']:.0f} ms/batch | "
        f"{batch['errors']:.0f} | "
        f"{batch['leads_per_s'] / bare['rps']:.2f} (leads per bare request) |"
    )
    if "single intake, waiters open" in results:
        held, again = results["single intake, waiters open"], results["single intake, again"]
        for label, run in (
            (f"single-lead intake, {args.waiters} waiters open", held),
            ("single-lead intake again, no waiters", again),
        ):
            print(
                f"| {label} | {run['rps']:,.0f} req/s | {run['p50_ms']:.1f} ms | "
                f"{run['p99_ms']:.1f} ms | {run['non2xx']:.0f} | {run['rps'] / bare['rps']:.2f} |"
            )
        print(
            f"\nwith {args.waiters} waiters: {held['rps'] / single['rps']:.2f} x the first single "
            f"intake run, {held['rps'] / again['rps']:.2f} x the run after; waiters answered "
            f"{held['answers']:.0f} times ({held['waiter_errors']:.0f} dropped); database "
            f"connections {held['db_before']:.0f} before the waiters, {held['db_during']:.0f} "
            "with them open (the web and status processes together); the status process "
            f"used {held['status_cpu_s']:.2f} CPU-seconds in the {args.seconds} s "
            f"({1000 * held['status_cpu_s'] / max(held['answers'], 1):.2f} ms per answer)"
        )
    print(
        f"\nleads stored: {stored:,} (single + batch accepted in the measured runs: {expected:,}, "
        "plus the warm-up run)"
    )
    lost = expected - stored
    if stored < expected:
        print(f"LOST LEADS: {lost}", file=sys.stderr)
        return 1
    shutil.rmtree(var_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
