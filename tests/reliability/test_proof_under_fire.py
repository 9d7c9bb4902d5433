"""Proof under fire (issue 9): the fault tests 3-7 of the reliability guide's test plan, with real
processes on loopback (tests/reliability/harness.py).

- a task that outlives the broker's visibility timeout (Redis redelivers it while it runs);
- the broker paused (``CLIENT PAUSE``) during an intake burst;
- the web process crashing between the lead's commit and its publish;
- a throwaway PostgreSQL cluster stopped during a burst;
- warm worker restarts (the deploy signal) during a burst.

Each test is bounded in traffic and time, ends with exact counts read from the database, and
prints its figures (``[fault figures] ...``; also appended to ``FAULT_FIGURES_FILE`` if set).
``RELIABILITY_SCALE`` multiplies the lead counts: 1 is CI's small version, ``make reliability``
runs 10.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from django.db import connection
from django.db.models import Max, Sum

from audit.verify import audit_verify
from leads.models import Lead, LeadStatus
from routing.rules_io import rules_import
from tests.leads.factories import SourceFactory
from tests.reliability import crash, stall
from tests.reliability.harness import (
    BATCH,
    REPS,
    SCALE,
    WAIT_SCALE,
    Stack,
    ThrowawayPostgres,
    assert_exact_routing,
    assert_one_received_event_each,
    log_signs,
    post,
    post_batch,
    postgres_bindir,
    report_figures,
    rules,
    scaled,
    unfinished,
)
from tests.support.processes import BIN, ROOT, wait_until

pytestmark = [
    pytest.mark.worker,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.reliability,
    pytest.mark.django_db(transaction=True),
]

RECEIVED = re.compile(r"Task (routing\.process_leads?)\[([0-9a-f-]+)\] received")


def deliveries(text: str) -> Counter[str]:
    """How often each task id was received by a worker (above 1: a redelivery)."""
    return Counter(match.group(2) for match in RECEIVED.finditer(text))


def statuses() -> dict[str, int]:
    return dict(Counter(Lead.objects.values_list("status", flat=True)))


# --- 3. A task that outlives the broker's visibility timeout -----------------------------------

STALL_SECONDS = 14  # well past the 8 s visibility timeout


def test_task_outliving_the_visibility_timeout_is_redelivered_and_the_stale_run_writes_nothing(
    stack,
):  # type: ignore[no-untyped-def]
    """The first attempt at two leads stalls 14 s (tests/reliability/stall.py) with a visibility
    timeout of 8 s and a lease of 4 s: Redis hands each stalled message to the other worker,
    which claims the lead (lease expired) and routes the chunk; the stalled execution then finds
    its lease gone and writes nothing. Test-only settings: the task time limit (40 s) is set
    above the visibility timeout on purpose, which the guide forbids in production, to make the
    redelivery of a live task happen. No sweeper runs: the broker's redelivery alone must do."""
    rules_import(rules(REPS), publish=True)
    SourceFactory(slug="stall")
    s = stack(
        CELERY_VISIBILITY_TIMEOUT="8",
        CELERY_TASK_TIME_LIMIT="40",
        CELERY_TASK_SOFT_TIME_LIMIT="35",
        LEAD_LEASE_SECONDS="4",
        LEADROUTER_TEST_STALL_SECONDS=str(STALL_SECONDS),
        LEADROUTER_TEST_STALL_PREFIX="stall",
    )
    s.start_redis()
    s.start_web()
    workers = [s.worker(f"stall-{n}", include="tests.reliability.stall") for n in "ab"]
    for w in workers:
        w.wait_ready()

    total = scaled(100, least=100) // BATCH * BATCH  # CI 100
    # The first lead of a 20-lead chunk: claimed as soon as the message is delivered, so its
    # lease (4 s) has surely expired when the message comes back (8 s); the stalled run finds the
    # rest of its chunk taken when it wakes.
    stalled = {20, total // 2 + 20}
    started = time.monotonic()
    try:
        for first in range(0, total, BATCH):
            records = [
                {"email": f"{'stall' if i in stalled else 'ok'}{i}@acme.example"}
                for i in range(first, first + BATCH)
            ]
            assert post_batch(s, "stall", records)[0] == 202
        wait_until(
            lambda: unfinished() == 0,
            timeout=80 * WAIT_SCALE,
            interval=0.5,
            message=f"{statuses()}\n{s.logs()}",
        )
        all_final_s = time.monotonic() - started
        # The stalled executions wake up after the leads were routed: wait for them to finish,
        # each saying its stalled lead's lease was lost (a stalled batch says so for every lead
        # of its batch: counting the lines, the first batch to wake was enough).
        stalled_ids = list(
            Lead.objects.filter(raw_payload__email__startswith="stall").values_list("pk", flat=True)
        )
        wait_until(
            lambda: all(
                f"lease on lead {pk} lost; writing nothing" in "".join(w.text() for w in workers)
                for pk in stalled_ids
            ),
            timeout=STALL_SECONDS + 20,
            interval=0.5,
            message=s.logs(),
        )
        time.sleep(1)
    finally:
        for w in workers:
            w.stop()
    connection.close()

    text = "".join(w.text() for w in workers)
    assert text.count(stall.MARKER) == len(stalled), s.logs()
    assert Lead.objects.count() == total
    assert statuses() == {"assigned": total}
    assert_exact_routing(total)
    assert_one_received_event_each(total)
    report = audit_verify()
    assert report.ok, [str(f) for f in report.findings[:10]]
    stalled_leads = Lead.objects.filter(raw_payload__email__startswith="stall")
    assert stalled_leads.count() == len(stalled)
    # Claimed by the stalled run, then by the redelivery once its lease had expired.
    assert sorted(stalled_leads.values_list("attempts", flat=True)) == [2] * len(stalled)
    for lead in stalled_leads:
        assert f"lease on lead {lead.pk} lost; writing nothing" in text, s.logs()
    # A stall holds its whole batch (routing.batch): the other leads of the stalled leads' chunks
    # (one batch each) lost their leases too and were claimed once more, one by one; no other
    # lead was claimed twice.
    stalled_chunks = {i // BATCH for i in stalled}
    in_stalled_batches = [
        lead.pk
        for lead in Lead.objects.filter(raw_payload__email__startswith="ok")
        if int(lead.raw_payload["email"].removeprefix("ok").split("@")[0]) // BATCH
        in stalled_chunks
    ]
    assert not (
        Lead.objects.exclude(pk__in=stalled_leads)
        .exclude(pk__in=in_stalled_batches)
        .filter(attempts__gt=1)
        .exists()
    )
    assert not Lead.objects.filter(pk__in=in_stalled_batches, attempts__gt=2).exists()
    redelivered = {task: n for task, n in deliveries(text).items() if n > 1}
    assert len(redelivered) >= len(stalled), redelivered
    report_figures(
        "visibility-timeout",
        {
            "leads": total,
            "assigned": total,
            "stalled_first_attempts": len(stalled),
            "stall_s": STALL_SECONDS,
            "visibility_timeout_s": 8,
            "lease_s": 4,
            "messages_redelivered": len(redelivered),
            "stale_runs_writing_nothing": text.count("writing nothing"),
            "assignments_per_lead_max": 1,
            "attempts_total": Lead.objects.aggregate(t=Sum("attempts"))["t"],
            "all_final_s": round(all_final_s, 1),
            "logged": log_signs(workers),
        },
    )


# --- 4. The broker paused (CLIENT PAUSE) during an intake burst -------------------------------

PAUSE_SECONDS = 6 if SCALE < 5 else 30  # the guide's 30 s under `make reliability`


def post_singles(
    s: Stack, slug: str, emails: list[str], threads: int, on_sent: Callable[[int], None]
) -> list[tuple[str, int, float, float]]:
    """Post one lead per request from ``threads`` clients; (e-mail, status, started, seconds)."""
    url = f"{s.base}/api/v1/intake/{slug}/"
    results: list[tuple[str, int, float, float]] = []
    lock = threading.Lock()
    todo = iter(emails)

    def client() -> None:
        while True:
            with lock:
                email = next(todo, None)
            if email is None:
                return
            started = time.monotonic()
            status, seconds = post(url, {"email": email}, f"token-{slug}")
            with lock:
                results.append((email, status, started, seconds))
                on_sent(len(results))

    pool = [threading.Thread(target=client) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(300 * WAIT_SCALE)
    return results


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def test_broker_paused_during_a_burst_intake_stays_fast_and_every_lead_is_assigned_once(stack):  # type: ignore[no-untyped-def]
    """``CLIENT PAUSE`` (6 s; 30 s under ``make reliability``) on the test's redis-server while
    four clients post single leads to gunicorn (2 workers, base settings: background publisher,
    breaker): no intake 5xx,
    no request hangs, intake p99 during the pause bounded; once the broker answers again, the
    worker and the sweeper get every lead assigned exactly once."""
    rules_import(rules(REPS), publish=True)
    SourceFactory(slug="pause")
    s = stack()
    s.start_redis()
    s.start_web(concurrency=2)
    worker = s.worker("pause")
    worker.wait_ready()
    s.start_sweeper(every=1, older_than=5, duration=200 * WAIT_SCALE)

    total = scaled(160, least=60)  # CI 160
    paused: list[float] = []

    def on_sent(count: int) -> None:
        if count == total // 6 and not paused:
            paused.append(time.monotonic())
            s.redis_cli("CLIENT", "PAUSE", str(PAUSE_SECONDS * 1000), "ALL")

    started = time.monotonic()
    try:
        results = post_singles(s, "pause", [f"p{i}@acme.example" for i in range(total)], 4, on_sent)
        posted_s = time.monotonic() - started
        assert paused, "the burst ended before the pause"
        resumed_at = paused[0] + PAUSE_SECONDS
        wait_until(
            lambda: unfinished() == 0,
            timeout=120 * WAIT_SCALE,
            interval=1,
            message=f"{statuses()}\n{s.logs()}",
        )
        all_final_after_pause_s = time.monotonic() - resumed_at
    finally:
        worker.stop()
    connection.close()

    codes = Counter(status for _, status, _, _ in results)
    assert codes == {202: total}, codes
    during = [sec for _, _, at, sec in results if paused[0] <= at < resumed_at]
    assert len(during) >= 20, len(during)  # the pause did fall into the burst
    slowest = max(sec for _, _, _, sec in results)
    assert p99(during) < 2.0, sorted(during)[-10:]
    if SCALE >= 5:
        # At the guide's size (30 s pause) its bound holds: kickoff p99 < 300 ms during the
        # fault. CI's small run shares 2 cores with the other lane, hence 2 s above.
        assert p99(during) < 0.3, sorted(during)[-10:]
    assert slowest < 5.0  # nothing hung (the client would wait 30 s)
    assert Lead.objects.count() == total
    assert statuses() == {"assigned": total}
    assert_exact_routing(total)
    assert_one_received_event_each(total)
    report = audit_verify()
    assert report.ok, [str(f) for f in report.findings[:10]]
    attempts = Lead.objects.aggregate(total=Sum("attempts"), most=Max("attempts"))
    assert attempts["most"] <= 2
    report_figures(
        "broker-paused",
        {
            "leads": total,
            "assigned": total,
            "lost": 0,
            "intake_5xx": 0,
            "pause_s": PAUSE_SECONDS,
            "posted_during_pause": len(during),
            "intake_p50_during_pause_ms": round(1000 * sorted(during)[len(during) // 2]),
            "intake_p99_during_pause_ms": round(1000 * p99(during)),
            "intake_max_during_pause_ms": round(1000 * max(during)),
            "intake_p99_overall_ms": round(1000 * p99([r[3] for r in results])),
            "burst_s": round(posted_s, 1),
            "all_final_after_pause_s": round(all_final_after_pause_s, 1),
            "attempts_total": attempts["total"],
            "attempts_max": attempts["most"],
            "logged": log_signs([worker]),
        },
    )


# --- 5. The web process crashes between commit and publish ------------------------------------

CRASH_ONE_IN = 20  # 5 %


def test_web_crash_between_commit_and_publish_every_committed_lead_is_routed_by_the_sweeper(
    stack,
):  # type: ignore[no-untyped-def]
    """gunicorn runs with a test-only hook (tests/reliability/gunicorn_crash.py, crash.py) that
    ends the worker process with ``os._exit`` right after a lead's transaction commits and before
    its id reaches the publisher, for one lead in 20 (by id). Those clients see the connection
    drop; the lead is stored and no message exists. The stale sweeper must route every one:
    N of N committed leads assigned, none twice, within its interval + threshold + 30 s."""
    rules_import(rules(REPS), publish=True)
    SourceFactory(slug="crash")
    s = stack(LEADROUTER_TEST_CRASH_ONE_IN=str(CRASH_ONE_IN))
    s.start_redis()
    s.start_web(concurrency=2, config="tests/reliability/gunicorn_crash.py")
    worker = s.worker("crash")
    worker.wait_ready()
    every, older_than = 2.0, 5.0
    s.start_sweeper(every=every, older_than=older_than, duration=200 * WAIT_SCALE)

    total = scaled(120, least=60)  # CI 120
    started = time.monotonic()
    try:
        results = post_singles(
            s, "crash", [f"c{i}@acme.example" for i in range(total)], 3, lambda n: None
        )
        posted_s = time.monotonic() - started
        wait_until(
            lambda: unfinished() == 0,
            timeout=90 * WAIT_SCALE,
            interval=1,
            message=f"{statuses()}\n{s.logs()}",
        )
    finally:
        worker.stop()
    connection.close()

    assert s.web is not None
    web_log = s.web.text()
    dropped = {email for email, status, _, _ in results if status == 0}
    codes = Counter(status for _, status, _, _ in results)
    assert set(codes) <= {202, 0}, codes
    # Every request's lead was committed, whether or not its client got the answer.
    assert Lead.objects.count() == total
    emails = list(Lead.objects.values_list("raw_payload__email", flat=True))
    assert len(set(emails)) == total
    doomed = {email for email in emails if crash.doomed(email, CRASH_ONE_IN)}
    assert dropped == doomed  # exactly the leads whose commit was followed by the crash
    assert web_log.count(crash.MARKER) == len(doomed)
    assert len(doomed) == total // CRASH_ONE_IN  # the fault did happen: exactly 5 %
    assert statuses() == {"assigned": total}
    assert_exact_routing(total)
    assert_one_received_event_each(total)
    report = audit_verify()
    assert report.ok, [str(f) for f in report.findings[:10]]
    recovery = [
        (lead.processed_at - lead.received_at).total_seconds()
        for lead in Lead.objects.filter(raw_payload__email__in=doomed)
    ]
    bound = every + older_than + 30
    assert max(recovery) <= bound, sorted(recovery)[-5:]
    assert Lead.objects.aggregate(most=Max("attempts"))["most"] == 1
    report_figures(
        "commit-then-crash",
        {
            "leads": total,
            "committed": total,
            "assigned": total,
            "lost": 0,
            "web_crashes": len(doomed),
            "crash_share_pct": round(100 * len(doomed) / total, 1),
            "recovered_by_sweeper": len(recovery),
            "max_recovery_s": round(max(recovery), 1),
            "median_recovery_s": round(sorted(recovery)[len(recovery) // 2], 1),
            "recovery_bound_s": bound,
            "burst_s": round(posted_s, 1),
        },
    )


# --- 6. PostgreSQL stopped during a burst -------------------------------------------------------

# CI 6 s; the guide's 30 s at scale 10 (`make reliability`).
PG_DOWN_SECONDS = min(30, max(6, round(3 * SCALE)))


def post_answer(url: str, body: object, token: str) -> tuple[int, dict[str, str], str, float]:
    """POST JSON; (status, headers, body text, seconds); status 0 when no answer came."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return (
                int(response.status),
                dict(response.headers),
                response.read().decode(errors="replace"),
                time.monotonic() - started,
            )
    except urllib.error.HTTPError as exc:
        return (
            exc.code,
            dict(exc.headers),
            exc.read().decode(errors="replace"),
            time.monotonic() - started,
        )
    except OSError as exc:
        return 0, {}, f"{type(exc).__name__}: {exc}", time.monotonic() - started


@pytest.fixture
def throwaway_postgres() -> Iterator[ThrowawayPostgres]:
    bindir = postgres_bindir()
    if bindir is None:
        pytest.fail("initdb/pg_ctl not found (set PG_BINDIR): cannot start a throwaway cluster")
    pg = ThrowawayPostgres(bindir)
    try:
        pg.init()
        pg.start()
        yield pg
    finally:
        pg.close()


def test_postgres_stopped_during_a_burst_intake_answers_503_json_and_no_accepted_lead_is_lost(
    stack, throwaway_postgres
):  # type: ignore[no-untyped-def]
    """A PostgreSQL cluster of the test's own (initdb + pg_ctl on a free port; never the
    machine's) is stopped with ``pg_ctl stop -m fast`` in the middle of a burst of single leads
    and started again PG_DOWN_SECONDS later (CI 6 s, 30 s at scale 10). Every intake answer is
    202, or 503 JSON with ``Retry-After`` (never an HTML 500, never a hang); every accepted lead
    ends assigned exactly once; no lead the intake refused exists (so no message was published
    for a row that is not there)."""
    pg = throwaway_postgres
    url = pg.create_database("leadrouter")
    s = stack(DATABASE_URL=url)
    migrate = subprocess.run(
        [str(BIN / "python"), "manage.py", "migrate", "--noinput", "-v", "0"],
        env=s.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    seeded = subprocess.run(
        [str(BIN / "python"), "-m", "tests.reliability.seed", "--source", "pg"],
        env=s.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert seeded.returncode == 0, seeded.stdout + seeded.stderr
    s.start_redis()
    s.start_web(concurrency=2)
    worker = s.worker("pg")
    worker.wait_ready()
    s.start_sweeper(every=1, older_than=5, duration=200 * WAIT_SCALE)

    per_phase = scaled(60, least=30)  # CI 60
    results: list[tuple[str, int, dict[str, str], str, float, float]] = []
    lock = threading.Lock()
    sent = 0
    intake = f"{s.base}/api/v1/intake/pg/"

    def burst(count: int, until: float | None = None, threads: int = 3) -> None:
        """Post single leads from ``threads`` clients: ``count`` of them, or until ``until``."""

        def client() -> None:
            nonlocal sent
            while True:
                with lock:
                    if sent >= phase_end or (until is not None and time.monotonic() >= until):
                        return
                    email = f"pg{sent}@acme.example"
                    sent += 1
                at = time.monotonic()
                status, headers, body, seconds = post_answer(intake, {"email": email}, "token-pg")
                with lock:
                    results.append((email, status, headers, body, at, seconds))
                if until is not None:
                    time.sleep(0.05)  # a steady trickle through the whole outage

        phase_end = sent + count
        clients = [threading.Thread(target=client) for _ in range(threads)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(240 * WAIT_SCALE)

    started = time.monotonic()
    burst(per_phase)  # the database up
    before = len(results)
    stopped_at = time.monotonic()
    pg.stop("fast")
    burst(4 * per_phase, until=stopped_at + PG_DOWN_SECONDS)  # the database down
    time.sleep(max(0.0, stopped_at + PG_DOWN_SECONDS - time.monotonic()))  # down that long
    pg.start()
    restarted_at = time.monotonic()
    during = results[before:]
    burst(per_phase)  # the database back
    after = results[before + len(during) :]
    posted_s = time.monotonic() - started
    total = len(results)

    def counts() -> dict[str, int]:
        with pg.connect("leadrouter") as conn:
            rows = conn.execute(
                "SELECT status, count(*) FROM leads_lead GROUP BY status"
            ).fetchall()
        return dict(rows)

    final = {"assigned", "duplicate", "excluded", "unassigned", "failed"}
    try:
        wait_until(
            lambda: set(counts()) <= final,
            timeout=120 * WAIT_SCALE,
            interval=1,
            message=f"{counts()}\n{s.logs()}",
        )
        all_final_after_restart_s = time.monotonic() - restarted_at
    finally:
        worker.stop()

    codes = Counter(r[1] for r in results)
    assert set(codes) <= {202, 503}, (codes, [r for r in results if r[1] not in (202, 503)][:5])
    assert [r[1] for r in results[:before]] == [202] * before
    assert len(during) >= 10, len(during)  # requests did meet the outage
    assert {r[1] for r in during} == {503}, Counter(r[1] for r in during)
    # Once pg_ctl says the cluster is back, intake is: no stale connection answers 503.
    assert Counter(r[1] for r in after) == {202: len(after)}, [r[:4] for r in after if r[1] != 202]
    refused = [r for r in results if r[1] == 503]
    for _, _, headers, body, _, _ in refused:
        assert headers.get("Content-Type", "").startswith("application/json"), (headers, body)
        assert json.loads(body)["error"]["code"] == "service_unavailable", body
        assert int(headers["Retry-After"]) > 0, headers
    slowest = max(r[5] for r in results)
    assert slowest < 10.0  # nothing hung (gunicorn's timeout is 30 s, the client's too)
    accepted = {r[0] for r in results if r[1] == 202}
    refused_emails = {r[0] for r in refused}
    with pg.connect("leadrouter") as conn:
        leads = dict(
            conn.execute("SELECT raw_payload->>'email', status FROM leads_lead").fetchall()
        )
        per_lead = conn.execute(
            "SELECT count(*), count(DISTINCT lead_id), coalesce(max(n), 0) FROM"
            " (SELECT lead_id, count(*) n FROM routing_assignment GROUP BY lead_id) a"
        ).fetchone()
        assigned_events = conn.execute(
            "SELECT count(*), count(DISTINCT lead_id) FROM audit_event WHERE type = 'assigned'"
        ).fetchone()
        per_rep = [
            n
            for (n,) in conn.execute(
                "SELECT count(*) FROM routing_assignment GROUP BY rep_id ORDER BY 1"
            ).fetchall()
        ]
        attempts = conn.execute("SELECT sum(attempts), max(attempts) FROM leads_lead").fetchone()
    assert set(leads) == accepted  # every 202 is stored; nothing the intake refused is
    assert not refused_emails & set(leads)
    assert set(leads.values()) == {"assigned"}
    n = len(accepted)
    assert per_lead == (n, n, 1)
    assert assigned_events == (n, n)
    assert len(per_rep) == REPS
    assert sum(per_rep) == n
    assert per_rep[-1] - per_rep[0] <= 1  # round robin, exact
    down_s = restarted_at - stopped_at
    report_figures(
        "postgres-stopped",
        {
            "requests": total,
            "accepted_202": n,
            "refused_503": len(refused),
            "other": total - n - len(refused),
            "assigned": n,
            "lost": 0,
            "refused_but_stored": 0,
            "db_down_s": round(down_s, 1),
            "posted_while_down": len(during),
            "max_answer_during_outage_ms": round(1000 * max(r[5] for r in during)),
            "max_answer_ms": round(1000 * slowest),
            "retry_after_s": refused[0][2].get("Retry-After"),
            "attempts_total": attempts[0],
            "attempts_max": attempts[1],
            "burst_s": round(posted_s, 1),
            "all_final_after_restart_s": round(all_final_after_restart_s, 1),
            "logged": log_signs([worker]),
        },
    )


# --- 7. Warm worker restarts during a burst -----------------------------------------------------


def test_warm_worker_restarts_during_a_burst_lose_nothing_and_redeliver_little(stack):  # type: ignore[no-untyped-def]
    """Two workers (concurrency 2) are restarted during a burst (CI: twice, during 300 leads; five
    times at scale 10), as a deploy does: a replacement is started, the old worker gets the stop
    signal on its main process (alternately SIGQUIT, which docker-compose.yml sends: soft
    shutdown, running tasks get CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT, here 5 s, then are
    requeued; and SIGTERM, the warm shutdown). Nothing is lost, every lead is assigned once,
    extra claims stay within what was in flight at each stop, and each worker exits within its
    grace period."""
    rules_import(rules(REPS), publish=True)
    SourceFactory(slug="deploy")
    s = stack(CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT="5")
    s.start_redis()
    s.start_web()
    workers = [s.worker("deploy-0"), s.worker("deploy-1")]
    for w in workers:
        w.wait_ready()
    s.start_sweeper(every=2, older_than=10, duration=200 * WAIT_SCALE)

    total = scaled(300, least=100) // BATCH * BATCH  # CI 300
    statuses_posted: list[int] = []

    def post_burst() -> None:
        for first in range(0, total, BATCH):
            records = [{"email": f"d{i}@acme.example"} for i in range(first, first + BATCH)]
            statuses_posted.append(post_batch(s, "deploy", records)[0])
            time.sleep(0.4)

    poster = threading.Thread(target=post_burst)
    started = time.monotonic()
    poster.start()
    restarts: list[dict[str, object]] = []
    # CI: one of each signal; the guide's five deploys under `make reliability`.
    plan = ([signal.SIGQUIT, signal.SIGTERM] * 3)[: 2 if SCALE < 2 else 5]
    try:
        for n, sig in enumerate(plan):
            time.sleep(2)
            old = workers[n % 2]
            replacement = s.worker(f"deploy-{n + 2}")
            in_flight = Lead.objects.filter(status=LeadStatus.PROCESSING).count()
            waiting = Lead.objects.filter(status=LeadStatus.RECEIVED).count()
            took = old.shut_down(sig, timeout=60)
            replacement.wait_ready()
            workers[n % 2] = replacement
            restarts.append(
                {
                    "signal": sig.name,
                    "in_flight": in_flight,
                    "waiting": waiting,
                    "exit_s": round(took, 1),
                }
            )
        poster.join(120 * WAIT_SCALE)
        wait_until(
            lambda: unfinished() == 0,
            timeout=120 * WAIT_SCALE,
            interval=1,
            message=f"{statuses()}\n{s.logs()}",
        )
        finished_s = time.monotonic() - started
    finally:
        poster.join(60)
        for w in s.workers:
            w.stop()
    connection.close()

    assert statuses_posted == [202] * (total // BATCH)
    assert Lead.objects.count() == total
    assert statuses() == {"assigned": total}
    assert_exact_routing(total)
    assert_one_received_event_each(total)
    report = audit_verify()
    assert report.ok, [str(f) for f in report.findings[:10]]
    attempts = Lead.objects.aggregate(total=Sum("attempts"), most=Max("attempts"))
    extra_claims = attempts["total"] - total
    # A stop interrupts at most the leads in flight at that moment (the guide's bound). (Under
    # heavy load a lead can also outlive its 10 s test lease and be claimed again, which is
    # why this is not "2 per stop", the pool size.)
    assert extra_claims <= sum(int(str(r["in_flight"])) for r in restarts), restarts
    # The stops met the burst under way (else the test proves nothing about deploys): leads in
    # flight, or waiting for a worker. (A batch holds its leads in `processing` for a fraction of
    # a second (routing.batch): a stop seldom finds some there, though it stops a worker busy
    # with the burst.)
    assert sum(int(str(r["in_flight"])) + int(str(r["waiting"])) for r in restarts) > 0, restarts
    assert attempts["most"] <= 2
    for r in restarts:
        assert float(r["exit_s"]) < 5 + 15, restarts  # the soft timeout plus start-up slack
    text = "".join(w.text() for w in s.workers)
    redelivered = sum(1 for n in deliveries(text).values() if n > 1)
    report_figures(
        "warm-restarts",
        {
            "leads": total,
            "assigned": total,
            "lost": 0,
            "restarts": restarts,
            "extra_claims": extra_claims,
            "messages_redelivered": redelivered,
            "attempts_max": attempts["most"],
            "all_final_s": round(finished_s, 1),
            "logged": log_signs(s.workers),
        },
    )
