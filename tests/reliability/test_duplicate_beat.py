"""Two beat schedulers at once (reliability guide, test 19 "Duplicate beat").

A second ``celery beat`` started by mistake (two replicas of the scheduler, a forgotten one on
another host) sends every periodic task twice: ``check_sla`` then runs twice per interval, often
at the same moment in the worker's two pool processes. The product's answer is that a breach
is handled exactly once whoever runs the check (routing/monitoring/sla.py): the ``SlaBreach``
row is one-to-one with the assignment, written under the lead's row lock, and the team's alert
is one open row per (kind, subject).

The unit of uniqueness is the **assignment**: there is one SLA type (first touch), and its
window is the assignment (a reassignment starts a new assignment with an SLA of its own). So
"(lead, sla type, window)" is checked as: per assignment, one ``SlaBreach``, one
``sla_breached`` audit event, one breach notice on the alert webhook; per lead, one
reassignment where the rule reassigns; per team, one ``sla`` alert, opened (and announced)
once.

Real processes on loopback: a throwaway ``redis-server`` broker, one worker (concurrency 2)
and two ``celery beat`` processes (django-celery-beat's database scheduler, as in production)
with a test-only ``SLA_CHECK_INTERVAL_SECONDS``. The alert webhook is a real HTTP server in
this process that stamps each request's arrival. The leads are routed here first, then their
due times are moved into the next seconds (in clumps, so that both beats' runs find the same
rows due at once): ``24 x RELIABILITY_SCALE`` breaches over ``12 x RELIABILITY_SCALE`` seconds.
At scale 10 (``make reliability``) that is 240 breaches (the guide: 200) over 120 s instead of
its 10 minutes (each beat still sends ``check_sla`` some 25 times over them, the worker running
the two beats' checks side by side); CI (scale 1) takes under a minute once the processes are up.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from audit.models import Event, EventType
from audit.verify import audit_verify
from leads.models import Lead
from routing.decisions import clear_live_config_cache
from routing.models import Assignment, AssignmentKind, Team
from routing.monitoring.models import Alert, AlertKind, SlaBreach, SlaBreachAction
from routing.rules_io import rules_import
from routing.services import lead_process
from tests.leads.factories import LeadFactory, SourceFactory
from tests.reliability.harness import WAIT_SCALE, report_figures, scaled
from tests.support.processes import wait_until

pytestmark = [
    pytest.mark.worker,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.reliability,
    pytest.mark.django_db(transaction=True),
]

INTERVAL = 5.0  # SLA_CHECK_INTERVAL_SECONDS for the beats (production: 60)
BOUND = INTERVAL + 30.0  # the guide: every breach detected within one interval + 30 s
BREACHES = scaled(24, least=8)
SPREAD = 12.0 * WAIT_SCALE  # seconds over which the due times fall
CLUMP = 8  # breaches sharing one due instant
LEAD_IN = 3.0  # seconds from moving the due times to the first of them
# Each lead's first rule decides what a breach does (its e-mail domain picks the rule).
GROUPS = ("notify", "reassign", "kept")


def _rules() -> dict[str, Any]:
    reps = [
        {"email": f"rep{i}@example.com", "name": f"Rep {i}", "timezone": "UTC"} for i in range(5)
    ]
    solo = {"email": "solo@example.com", "name": "Solo Rep", "timezone": "UTC"}

    def domain(name: str) -> dict[str, Any]:
        return {"all": [{"field": "email_domain", "op": "eq", "value": f"{name}.example"}]}

    return {
        "reps": [*reps, solo],
        "teams": [
            {
                "name": "Inbound",
                "strategy": "round_robin",
                "members": [{"rep": rep["email"]} for rep in reps],
            },
            # Nobody else to take a breached lead: it stays, under the team's one alert.
            {"name": "Solo", "strategy": "round_robin", "members": [{"rep": solo["email"]}]},
        ],
        "ruleset": {
            "name": "SLA",
            "rules": [
                {
                    "name": "Reassign",
                    "priority": 10,
                    "when": domain("reassign"),
                    "action": {"type": "team", "team": "Inbound"},
                    "on_sla_breach": "reassign",
                },
                {
                    "name": "Kept",
                    "priority": 20,
                    "when": domain("kept"),
                    "action": {"type": "team", "team": "Solo"},
                    "on_sla_breach": "reassign",
                },
                {"name": "Notify", "priority": 30, "action": {"type": "team", "team": "Inbound"}},
            ],
        },
    }


class Hook:
    """What the alert webhook received: (arrival time, JSON body), in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[tuple[datetime, dict[str, Any]]] = []

    def handle(self, request: Request) -> Response:
        arrived = datetime.now(UTC)
        body = json.loads(request.get_data())
        with self.lock:
            self.received.append((arrived, body))
        return Response('{"ok": true}', status=200, content_type="application/json")

    def events(self, event: str) -> list[tuple[datetime, dict[str, Any]]]:
        with self.lock:
            return [(at, body) for at, body in self.received if body.get("event") == event]


def _route_leads() -> tuple[list[int], dict[str, list[int]]]:
    """Route BREACHES leads here (the worker's pipeline, in this process); their assignments
    in order (the groups take turns) and by group. Their SLA (60 min) is far off until the test
    moves it."""
    source = SourceFactory(slug="sla")
    ordered: list[int] = []
    by_group: dict[str, list[int]] = {group: [] for group in GROUPS}
    for i in range(BREACHES):
        group = GROUPS[i % len(GROUPS)]
        lead = cast(
            Lead, LeadFactory(source=source, raw_payload={"email": f"p{i}@{group}.example"})
        )
        assert lead_process(lead_id=lead.pk) == "assigned"
        assignment = Assignment.objects.get(lead=lead, active=True)
        assert assignment.sla_due_at is not None
        assert assignment.sla_due_at > timezone.now() + timedelta(minutes=30)
        by_group[group].append(assignment.pk)
        ordered.append(assignment.pk)
    return ordered, by_group


def _due_times(ids: list[int], start: datetime) -> dict[int, datetime]:
    """Clumps of CLUMP breaches sharing one due instant, the clumps spread over SPREAD."""
    clumps = max(1, -(-len(ids) // CLUMP))
    step = SPREAD / max(1, clumps - 1)
    return {
        assignment_id: start + timedelta(seconds=(k // CLUMP) * step)
        for k, assignment_id in enumerate(ids)
    }


_LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*Task maintenance\.check_sla\[([0-9a-f-]+)\] "
    r"(received|succeeded)",
    re.MULTILINE,
)


def _check_runs(log: str) -> list[tuple[datetime, datetime]]:
    """(received, succeeded) of each check_sla the worker ran, from its log."""
    seen: dict[str, dict[str, datetime]] = {}
    for stamp, task_id, what in _LOG_LINE.findall(log):
        at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")  # noqa: DTZ007 (both local)
        seen.setdefault(task_id, {})[what] = at
    return sorted(
        (run["received"], run["succeeded"])
        for run in seen.values()
        if "received" in run and "succeeded" in run
    )


def _overlapping(runs: list[tuple[datetime, datetime]]) -> int:
    """How many runs started before the one before them had finished (two checks at once)."""
    return sum(1 for before, after in itertools.pairwise(runs) if after[0] < before[1])


def test_two_beats_handle_every_breach_once_and_in_time(  # type: ignore[no-untyped-def]
    stack, httpserver: HTTPServer, settings: Any
) -> None:
    settings.DELIVERY_EMAIL_ENABLED = False  # routing here must publish nothing
    clear_live_config_cache()
    rules_import(_rules(), publish=True)
    all_ids, by_group = _route_leads()
    clear_live_config_cache()
    solo = Team.objects.get(name="Solo")

    hook = Hook()
    httpserver.expect_request("/alerts", method="POST").respond_with_handler(hook.handle)
    s = stack(
        SLA_CHECK_INTERVAL_SECONDS=str(INTERVAL),
        SLA_CHECK_MAX_SECONDS=str(INTERVAL),  # below the harness's soft time limit (8 s)
        ALERT_WEBHOOK_URL=httpserver.url_for("/alerts"),
        ALERT_WEBHOOK_FORMAT="json",
        ALERT_ALLOW_PRIVATE_URLS="1",
        EMAIL_URL="dummymail://",
    )
    s.start_redis()
    processes_started = time.monotonic()
    worker = s.worker("sla", concurrency=2)
    # Both beats at once, as two replicas of a scheduler deployment would start.
    beats = [s.beat("beat-a"), s.beat("beat-b")]
    worker.wait_ready()
    for beat in beats:
        beat.wait_for_output("beat: Starting...", timeout=60)
    ready_s = time.monotonic() - processes_started

    # The SLA clocks now run out over the next SPREAD seconds, in clumps, the groups mixed.
    started = timezone.now()
    due = _due_times(all_ids, started + timedelta(seconds=LEAD_IN))
    for assignment_id, due_at in due.items():
        Assignment.objects.filter(pk=assignment_id).update(sla_due_at=due_at)
    last_due = max(due.values())

    def all_handled() -> bool:
        return (
            SlaBreach.objects.count() >= BREACHES
            and len(hook.events("sla.breached")) >= BREACHES
            and len(hook.events("alert.opened")) >= 1
        )

    try:
        wait_until(
            all_handled,
            timeout=(last_due - timezone.now()).total_seconds() + BOUND + 10,
            interval=0.5,
            message=f"{SlaBreach.objects.count()} of {BREACHES} breaches handled, "
            f"{len(hook.events('sla.breached'))} notices\n{s.logs()}",
        )
        done_at = timezone.now()
        # Both beats go on for two more intervals: a duplicate would show up now.
        time.sleep(2 * INTERVAL + 1)
    finally:
        for beat in beats:
            beat.stop()
        worker.stop()
    connection.close()

    beat_runs = [beat.text().count("Sending due task monitoring-check-sla") for beat in beats]
    check_runs = _check_runs(worker.text())
    tracebacks = [beat.text().count("Traceback") for beat in beats]
    assert tracebacks == [0, 0], s.logs()
    assert "Traceback" not in worker.text(), worker.text()[-6000:]
    # Both schedulers really were running the check all along, not one of them.
    expected_runs = int((done_at - started).total_seconds() // INTERVAL)
    assert min(beat_runs) >= expected_runs - 2, (beat_runs, expected_runs)

    # One breach per assignment (the unit of uniqueness), none for anything else.
    breaches = list(
        SlaBreach.objects.values_list("assignment_id", "lead_id", "breached_at", "action")
    )
    assert len(breaches) == BREACHES
    assert sorted(b[0] for b in breaches) == sorted(all_ids)
    assert max(Counter(b[1] for b in breaches).values()) == 1  # ... and per lead
    actions = Counter((b[3]) for b in breaches)
    expected_actions = {
        SlaBreachAction.NOTIFIED: len(by_group["notify"]),
        SlaBreachAction.REASSIGNED: len(by_group["reassign"]),
        SlaBreachAction.KEPT: len(by_group["kept"]),
    }
    assert dict(actions) == {k: v for k, v in expected_actions.items() if v}
    handled = dict(Assignment.objects.filter(pk__in=all_ids).values_list("id", "sla_breached_at"))
    assert {pk: at for pk, _, at, _ in breaches} == handled

    # One sla_breached event per assignment; one reassignment per reassigned lead.
    events = Event.objects.filter(type=EventType.SLA_BREACHED)
    assert events.count() == BREACHES
    per_lead = events.values("lead").annotate(n=Count("id"))
    assert per_lead.count() == BREACHES
    assert {row["n"] for row in per_lead} == {1}
    reassignments = Assignment.objects.filter(kind=AssignmentKind.REASSIGNMENT)
    assert reassignments.count() == len(by_group["reassign"])
    assert Event.objects.filter(type=EventType.REASSIGNED).count() == len(by_group["reassign"])
    assert sorted(reassignments.values_list("supersedes_id", flat=True)) == sorted(
        by_group["reassign"]
    )

    # One breach notice per assignment on the webhook, exactly.
    notices = hook.events("sla.breached")
    notified = Counter(int(body["assignment"]) for _, body in notices)
    assert sorted(notified) == sorted(all_ids)
    assert set(notified.values()) == {1}, notified.most_common(3)
    assert len(notices) == BREACHES
    # One sla alert for the team whose leads stay, opened and announced once.
    sla_alerts = Alert.objects.filter(kind=AlertKind.SLA)
    if by_group["kept"]:
        assert list(sla_alerts.values_list("subject", "status")) == [(f"team:{solo.pk}", "open")]
        (alert,) = sla_alerts
        assert alert.data["count"] == len(by_group["kept"])
        opened = [b for _, b in hook.events("alert.opened") if b["alert"]["kind"] == "sla"]
        assert [b["alert"]["subject"] for b in opened] == [f"team:{solo.pk}"]
    else:
        assert not sla_alerts.exists()

    # Every breach detected within one interval + 30 s of its due time: recorded (the run's
    # clock) and announced (the webhook's arrival stamp, after the commit).
    recorded_lag = [(at - due[pk]).total_seconds() for pk, _, at, _ in breaches]
    notice_lag = [
        (arrived - due[int(body["assignment"])]).total_seconds() for arrived, body in notices
    ]
    assert min(recorded_lag) >= 0
    assert max(recorded_lag) <= BOUND, sorted(recorded_lag)[-5:]
    assert max(notice_lag) <= BOUND, sorted(notice_lag)[-5:]

    report = audit_verify()
    assert report.ok, [str(f) for f in report.findings[:10]]
    # The two beats' checks did run at the same time (else this proves nothing about duplicates).
    assert _overlapping(check_runs) > 0, check_runs
    report_figures(
        "duplicate_beat",
        {
            "beats": len(beats),
            "interval_s": INTERVAL,
            "breaches": BREACHES,
            "recorded": len(breaches),
            "duplicates": 0,
            "by_action": {str(k): v for k, v in actions.items()},
            "notices": len(notices),
            "sla_alerts": sla_alerts.count(),
            "check_sla_sent_per_beat": beat_runs,
            "check_sla_runs": len(check_runs),
            "check_sla_runs_overlapping_another": _overlapping(check_runs),
            "max_recorded_lag_s": round(max(recorded_lag), 1),
            "max_notice_lag_s": round(max(notice_lag), 1),
            "median_recorded_lag_s": round(sorted(recorded_lag)[len(recorded_lag) // 2], 1),
            "spread_s": SPREAD,
            "processes_ready_s": round(ready_s, 1),
            "breach_phase_s": round((timezone.now() - started).total_seconds(), 1),
        },
    )
