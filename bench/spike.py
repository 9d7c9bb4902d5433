"""A webinar spike, and the memory it leaves behind, on PostgreSQL + Redis under gunicorn.

    .venv/bin/python -m bench.spike [--leads 10000] [--seconds 60] [--workers 2]

Needs PostgreSQL and Redis (BENCH_DATABASE_URL, default a fresh `leadrouter_spike_bench` on
localhost; BENCH_REDIS_URL / BENCH_CACHE_URL, default databases 14 and 15 of the local Redis,
flushed). It recreates and migrates the database, imports one round-robin team of 10 reps with
one rule, starts gunicorn with the production settings (2 sync workers) and ``--workers`` celery
worker processes, then, in one run:

- **baseline**: the same offered load (``--leads`` over ``--seconds``, from 16 client threads on
  keep-alive connections, evenly paced) against a bare DRF view in the same gunicorn: accept
  latency p50 / p99 and errors;
- **spike**: the offered load against the single-lead intake, as a webinar platform posting its
  attendee list: accepted, errors (any answer but 202), the rate reached, accept latency p50 /
  p99 from the send and from the request's slot in the schedule (which counts the wait of
  requests that went out late because every client was busy), the latter's ratio
  to the baseline's, and the time from the first post until every lead is routed ("drain");
- **memory**: the resident set size (RSS, summed over each process tree) of the web server and of
  the workers before the spike and after it, and the ratio.

At the end it checks that every accepted lead is in the database and routed once.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.intake import env_for, recreate_database, wait_ready
from bench.pipeline import Workers, _document

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TOKEN = "bench-spike-token-0123456789abcdef0123456789abcd"  # noqa: S105 (throwaway local token)
CLIENTS = 16


def _rss_kib(pid: int) -> int:
    """RSS of a process and all its descendants, in KiB (Linux /proc)."""
    total = 0
    try:
        children = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    except OSError:
        return 0
    return total + sum(_rss_kib(int(child)) for child in children)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def offered_load(port: int, path: str, leads: int, seconds: float) -> dict[str, Any]:
    """Post ``leads`` requests evenly over ``seconds`` from CLIENTS threads."""
    interval = seconds / leads
    start = time.monotonic() + 0.5
    latencies: list[float] = []
    from_schedule: list[float] = []
    errors: list[str] = []
    ids: list[str] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for i in range(k, leads, CLIENTS):
            due = start + i * interval
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            body = json.dumps(
                {
                    "Email Address": f"attendee{i}@firm-{i % 997}.example",
                    "First Name": "Ana",
                    "Last Name": f"Lopez {i}",
                    "Company": f"Firm {i % 997}",
                    "Country": "Germany",
                    "lead_score": i % 100,
                }
            )
            sent = time.monotonic()
            try:
                conn.request(
                    "POST",
                    path,
                    body=body,
                    headers={
                        "Content-Type": "application/json",
                        "Authorization": f"Bearer {TOKEN}",
                    },
                )
                response = conn.getresponse()
                data = response.read()
                status = response.status
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                with lock:
                    errors.append(type(exc).__name__)
                continue
            answered = time.monotonic()
            with lock:
                latencies.append(answered - sent)
                # From the request's slot in the schedule: a request that went out late (every
                # client busy with earlier ones) waited that long too, as a webinar platform's
                # queue would have (measuring from the send alone hides it).
                from_schedule.append(answered - due)
                if status != 202:
                    errors.append(str(status))
                elif path != "/bench/bare/":
                    ids.append(json.loads(data)["id"])
        conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    return {
        "sent": leads,
        "errors": len(errors),
        "error_kinds": sorted(set(errors))[:5],
        "accepted": len(ids),
        "p50_ms": _percentile(latencies, 0.5) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "sched_p50_ms": _percentile(from_schedule, 0.5) * 1000,
        "sched_p99_ms": _percentile(from_schedule, 0.99) * 1000,
        "rate": leads / elapsed,
        "elapsed": elapsed,
        "started": start,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--leads", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--drain-timeout", type=float, default=1800.0)
    parser.add_argument(
        "--baseline-leads",
        type=int,
        default=None,
        help="requests for the bare-view baseline, offered at the spike's rate (default --leads; "
        "a long memory run needs no 100,000-request baseline)",
    )
    args = parser.parse_args()

    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_spike_bench"
    )
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    cache_url = os.environ.get("BENCH_CACHE_URL", "redis://127.0.0.1:6379/15")
    var_dir = tempfile.mkdtemp(prefix="leadrouter-spike-")
    env = env_for(database_url, redis_url, cache_url, var_dir)
    env["DELIVERY_EMAIL_ENABLED"] = os.environ.get("BENCH_EMAIL", "false")

    recreate_database(database_url)
    for url in (redis_url, cache_url):
        subprocess.run(["redis-cli", "-u", url, "flushdb"], check=True, capture_output=True)
    manage = [str(BIN / "python"), "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run(
        [*manage, "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    rules = Path(var_dir) / "rules.json"
    rules.write_text(json.dumps(_document()))
    subprocess.run(
        [*manage, "routing_import", str(rules), "--publish"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    setup = (
        "from leads.models import Source, token_digest;"
        f"Source.objects.create(slug='webinar', name='Webinar', token_hash=token_digest('{TOKEN}'),"
        "rate_limit_per_minute=100000000, field_map={'Company': 'company'})"
    )
    subprocess.run([*manage, "shell", "-c", setup], cwd=ROOT, env=env, check=True)

    port = 18950 + os.getpid() % 40
    env["PORT"] = str(port)
    server = subprocess.Popen(
        [str(BIN / "gunicorn"), "config.wsgi:application", "--config", "config/gunicorn.py"],
        cwd=ROOT,
        env={**env, "GUNICORN_CMD_ARGS": "--access-logfile /dev/null"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    workers = Workers(args.workers, env, Path(var_dir))
    try:
        wait_ready(port)
        from celery import Celery

        ping_app = Celery(broker=redis_url)
        workers.wait_ready(ping_app.control.ping)
        offered_load(port, "/bench/bare/", 200, 2)  # warm-up
        warm = offered_load(port, "/api/v1/intake/webinar/", 50, 1)["accepted"]
        time.sleep(3)
        rss_before = {
            "web": _rss_kib(server.pid),
            "workers": sum(_rss_kib(p.pid) for p in workers.procs),
        }
        base_leads = min(args.baseline_leads or args.leads, args.leads)
        base = offered_load(
            port, "/bench/bare/", base_leads, args.seconds * base_leads / args.leads
        )
        samples: list[tuple[float, int, int, int]] = []
        spike = offered_load(port, "/api/v1/intake/webinar/", args.leads, args.seconds)
        # Polled over one plain connection: a `manage.py shell` per poll would take a second of
        # the CPU the workers are draining with.
        import psycopg

        deadline = time.monotonic() + args.drain_timeout
        routed = total = 0
        next_sample = time.monotonic() + 60
        with psycopg.connect(database_url, autocommit=True) as db:
            while time.monotonic() < deadline:
                row = db.execute(
                    "SELECT count(*) FILTER (WHERE status NOT IN ('received', 'processing')), "
                    "count(*) FROM leads_lead"
                ).fetchone()
                assert row is not None
                routed, total = int(row[0]), int(row[1])
                if time.monotonic() >= next_sample:
                    next_sample += 60
                    samples.append(
                        (
                            time.monotonic() - spike["started"],
                            routed,
                            _rss_kib(server.pid),
                            sum(_rss_kib(p.pid) for p in workers.procs),
                        )
                    )
                if routed == total:
                    break
                time.sleep(2)
        drained = time.monotonic() - spike["started"]
        rss_after = {
            "web": _rss_kib(server.pid),
            "workers": sum(_rss_kib(p.pid) for p in workers.procs),
        }
    finally:
        workers.stop()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)

    check = (
        "from django.db.models import Count; from routing.models import Assignment; "
        "print(Assignment.objects.values('lead').annotate(n=Count('id')).filter(n__gt=1).count())"
    )
    twice = subprocess.run(
        [*manage, "shell", "-c", check],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()[-1]

    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; gunicorn sync x2 + {args.workers} celery worker processes "
        f"(concurrency 1), PostgreSQL + Redis; {args.leads:,} leads offered evenly over "
        f"{args.seconds:g} s by {CLIENTS} keep-alive clients\n"
    )
    print(
        "| path | sent | errors | rate reached | p50 from send | p99 from send "
        "| p50 from schedule | p99 from schedule | p99 from schedule, ratio to bare DRF |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, run in (("bare DRF view (baseline)", base), ("single-lead intake (spike)", spike)):
        print(
            f"| {name} | {run['sent']:,} | {run['errors']} | {run['rate']:.0f}/s | "
            f"{run['p50_ms']:.1f} ms | {run['p99_ms']:.1f} ms | {run['sched_p50_ms']:.1f} ms | "
            f"{run['sched_p99_ms']:.1f} ms | "
            f"{run['sched_p99_ms'] / max(base['sched_p99_ms'], 1e-9):.2f} |"
        )
    print(
        f"\noffered {args.leads / args.seconds:.0f}/s; latency from send is the server's answer "
        "time; from schedule it includes the wait of requests that went out late"
    )
    if spike["error_kinds"]:
        print(f"\nerrors: {spike['error_kinds']}")
    print(
        f"\naccepted {spike['accepted']:,} of {spike['sent']:,}; stored {total:,} (with {warm} "
        f"warm-up leads); routed "
        f"{routed:,}; leads with more than one assignment: {twice}; posting took "
        f"{spike['elapsed']:.1f} s; drained (first post to every lead routed) in {drained:.1f} s "
        f"({routed / max(drained, 1e-9):.0f} leads/s)\n"
    )
    print("| process | RSS before | RSS after | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for name in ("web", "workers"):
        before, after = rss_before[name] / 1024, rss_after[name] / 1024
        print(f"| {name} | {before:.0f} MiB | {after:.0f} MiB | {after / max(before, 1e-9):.2f} |")
    if samples:
        print("\nWhile draining (after the posting ended), once a minute:\n")
        print("| since first post | leads routed | web RSS | workers RSS |")
        print("| ---: | ---: | ---: | ---: |")
        for since, done, web_kib, workers_kib in samples:
            web_mib, workers_mib = web_kib / 1024, workers_kib / 1024
            print(f"| {since:.0f} s | {done:,} | {web_mib:.0f} MiB | {workers_mib:.0f} MiB |")
    ok = spike["errors"] == 0 and routed == total == spike["accepted"] + warm and twice == "0"
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
