"""Intake throughput and latency beside a bare DRF view, under gunicorn on PostgreSQL + Redis.

    .venv/bin/python -m bench.intake [--seconds 15] [--connections 16]

Needs PostgreSQL and Redis (BENCH_DATABASE_URL, BENCH_REDIS_URL; defaults on localhost) and
`wrk` (Debian package). It creates a fresh `leadrouter_bench` database, starts gunicorn with the
production settings (2 sync workers), and measures in one run:
  - a bare DRF APIView (the baseline), single-lead intake, with wrk;
  - batch intake (1,000-record JSON arrays) with a Python client on keep-alive connections.
At the end it checks that every accepted lead is in the database.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import signal
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--batch-clients", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1000)
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
