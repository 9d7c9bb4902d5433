"""The fast lane: form leads' time to an owner on the page while a webinar batch drains.

    .venv/bin/python -m bench.lanes [--bulk 10000] [--rate 5] [--workers 2] [--modes lanes,fifo]

Needs PostgreSQL and Redis (BENCH_DATABASE_URL, default a fresh `leadrouter_lanes_bench` on
localhost; BENCH_REDIS_URL / BENCH_CACHE_URL, default databases 14 and 15 of the local Redis,
flushed). For each mode it recreates and migrates the database, imports one round-robin team of
10 reps with one rule, starts gunicorn (2 sync workers), the status process (uvicorn,
``config.asgi``) and ``--workers`` celery worker processes (concurrency 1, every queue, as
``celery -A config worker`` with no flags), then:

- posts ``--bulk`` leads to the ``webinar`` source as 1,000-record batches, as fast as they are
  accepted (a webinar platform's attendee upload);
- meanwhile posts one lead a second times ``--rate`` to the ``website`` source (a form) and, for
  each, waits on its status URL (``?wait=10``, asking again until it shows an owner), as the
  embed script does: the time from sending the form's post to the answer with the owner;
- stops the form posts once the batch is drained (every bulk lead routed).

Modes: ``lanes`` — the sources' lanes as a RevOps team sets them (the form realtime, the webinar
bulk: separate queues, realtime taken first); ``fifo`` — both sources in the normal lane, one
queue, the same as before lanes existed. Issue 20's goal: with lanes, p95 <= 1 s and p99 <= 2 s.
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
from urllib.parse import urlparse

from bench.intake import env_for, recreate_database, wait_ready
from bench.pipeline import Workers, _document
from bench.spike import _percentile

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TOKEN = "bench-lanes-token-0123456789abcdef0123456789abcd"  # noqa: S105 (throwaway local token)
BATCH = 1000


def _post(conn: http.client.HTTPConnection, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    conn.request(
        "POST",
        path,
        body=json.dumps(body),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    response = conn.getresponse()
    return response.status, json.loads(response.read() or b"{}")


class FormLead(threading.Thread):
    """One form post, then its status URL waited on until it shows the owner."""

    def __init__(self, port: int, status_port: int, index: int) -> None:
        super().__init__(daemon=True)
        self.port, self.status_port, self.index = port, status_port, index
        self.seconds: float | None = None
        self.error = ""

    def run(self) -> None:
        started = time.monotonic()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            status, body = _post(
                conn,
                "/api/v1/intake/website/",
                {"email": f"form{self.index}@prospect.example", "company": "Prospect"},
            )
            conn.close()
            if status != 202:
                self.error = f"intake {status}"
                return
            path = urlparse(body["status_url"]).path
            waiter = http.client.HTTPConnection("127.0.0.1", self.status_port, timeout=30)
            while time.monotonic() - started < 600:
                waiter.request("GET", f"{path}?wait=10")
                response = waiter.getresponse()
                answer = json.loads(response.read())
                if response.status != 200:
                    self.error = f"status {response.status}"
                    return
                if answer["status"] == "assigned" and answer["owner"]:
                    self.seconds = time.monotonic() - started
                    return
                if answer["status"] == "not_assigned":
                    self.error = "not assigned"
                    return
            self.error = "no owner in 600 s"
        except Exception as exc:  # reported, not raised: one lead's failure is a figure
            self.error = f"{type(exc).__name__}: {exc}"


def _routed(database_url: str, source: str) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as db:
        row = db.execute(
            "SELECT count(*) FILTER (WHERE l.status NOT IN ('received', 'processing')), count(*) "
            "FROM leads_lead l JOIN leads_source s ON s.id = l.source_id WHERE s.slug = %s",
            [source],
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_lanes_bench"
    )
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    cache_url = os.environ.get("BENCH_CACHE_URL", "redis://127.0.0.1:6379/15")
    var_dir = tempfile.mkdtemp(prefix=f"leadrouter-lanes-{mode}-")
    env = env_for(database_url, redis_url, cache_url, var_dir)
    env["DELIVERY_EMAIL_ENABLED"] = "false"
    port = 18700 + os.getpid() % 40 * 2
    status_port = port + 1
    env["PORT"] = str(port)
    env["STATUS_BASE_URL"] = f"http://127.0.0.1:{status_port}"
    env["WEB_CONCURRENCY"] = "2"

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
    form_lane, bulk_lane = ("realtime", "bulk") if mode == "lanes" else ("normal", "normal")
    setup = (
        "from leads.models import Source, token_digest\n"
        "from routing.models import Rep\n"
        f"for slug, lane in (('website', '{form_lane}'), ('webinar', '{bulk_lane}')):\n"
        f"    Source.objects.create(slug=slug, name=slug, token_hash=token_digest('{TOKEN}'),"
        " rate_limit_per_minute=100000000, lane=lane)\n"
        "Rep.objects.update(display_name='Rep')\n"
    )
    subprocess.run([*manage, "shell", "-c", setup], cwd=ROOT, env=env, check=True)

    server = subprocess.Popen(
        [str(BIN / "gunicorn"), "config.wsgi:application", "--config", "config/gunicorn.py"],
        cwd=ROOT,
        env={**env, "GUNICORN_CMD_ARGS": "--access-logfile /dev/null"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    status = subprocess.Popen(
        [
            *(str(BIN / "uvicorn"), "config.asgi:application", "--port", str(status_port)),
            *("--no-access-log", "--log-level", "warning", "--workers", "1"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    workers = Workers(args.workers, env, Path(var_dir))
    forms: list[FormLead] = []
    try:
        wait_ready(port)
        wait_ready(status_port)
        from celery import Celery

        workers.wait_ready(Celery(broker=redis_url).control.ping)
        # Warm-up: a few form leads through the whole path, not measured.
        warm = [FormLead(port, status_port, -1 - i) for i in range(5)]
        for lead in warm:
            lead.start()
        for lead in warm:
            lead.join(60)

        bulk_done = threading.Event()

        def upload() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            for first in range(0, args.bulk, BATCH):
                records = [
                    {"email": f"attendee{i}@webinar.example", "company": "Attendee"}
                    for i in range(first, min(first + BATCH, args.bulk))
                ]
                code, _ = _post(conn, "/api/v1/intake/webinar/batch/", records)
                assert code == 202, code
            bulk_done.set()

        started = time.monotonic()
        uploader = threading.Thread(target=upload, daemon=True)
        uploader.start()
        time.sleep(1.0)  # the batch's first thousands are queued before the first form
        interval = 1.0 / args.rate
        next_form = time.monotonic()
        drained_at: float | None = None
        last_check = 0.0
        while time.monotonic() - started < args.max_seconds:
            now = time.monotonic()
            if now >= next_form:
                lead = FormLead(port, status_port, len(forms))
                lead.start()
                forms.append(lead)
                next_form += interval
            if bulk_done.is_set() and now - last_check >= 1.0:
                last_check = now
                routed, total = _routed(database_url, "webinar")
                if total >= args.bulk and routed == total:
                    drained_at = now - started
                    break
            time.sleep(max(0.0, min(next_form - time.monotonic(), 0.05)))
        for lead in forms:
            lead.join(max(1.0, 620 - (time.monotonic() - started)))
    finally:
        workers.stop()
        for proc in (status, server):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    seconds = sorted(lead.seconds for lead in forms if lead.seconds is not None)
    errors = [lead.error for lead in forms if lead.error]
    return {
        "mode": mode,
        "forms": len(forms),
        "owned": len(seconds),
        "errors": errors,
        "p50": _percentile(seconds, 0.50),
        "p95": _percentile(seconds, 0.95),
        "p99": _percentile(seconds, 0.99),
        "max": seconds[-1] if seconds else float("nan"),
        "drained_s": drained_at,
        "bulk": args.bulk,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bulk", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=5.0, help="form leads per second")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", default="lanes,fifo")
    parser.add_argument("--max-seconds", type=float, default=900.0)
    args = parser.parse_args()
    results = [run_mode(mode, args) for mode in args.modes.split(",")]
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; gunicorn sync x2, uvicorn x1 (status), {args.workers} "
        f"celery worker processes (concurrency 1, every queue), PostgreSQL + Redis; "
        f"{args.bulk:,} bulk leads in {BATCH}-record batches, form leads at {args.rate:g}/s "
        "until the batch is drained\n"
    )
    print("| lanes | form leads | with an owner shown | p50 | p95 | p99 | max | bulk drained in |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        drained = f"{r['drained_s']:.0f} s" if r["drained_s"] is not None else "not drained"
        label = "realtime + bulk (lanes)" if r["mode"] == "lanes" else "one queue (no lanes)"
        print(
            f"| {label} | {r['forms']} | {r['owned']} | {r['p50'] * 1000:.0f} ms | "
            f"{r['p95'] * 1000:.0f} ms | {r['p99'] * 1000:.0f} ms | {r['max'] * 1000:.0f} ms | "
            f"{drained} |"
        )
        if r["errors"]:
            print(f"  errors ({len(r['errors'])}): {sorted(set(r['errors']))[:5]}")
    return 0 if all(not r["errors"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
