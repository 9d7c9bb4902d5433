"""SLA breaches: one event each, notification, reassignment within the team, the cap, alerts.

The clock is injected (``now=``): nothing sleeps.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any, cast

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.management import call_command
from django.db import connection
from pytest_httpserver import HTTPServer

from audit.models import Event, EventType
from leads.models import Lead
from routing.decisions import clear_live_config_cache
from routing.models import Assignment, AssignmentKind, Rep, Rule, Team
from routing.monitoring.models import Alert, AlertKind, AlertStatus, SlaBreach, SlaBreachAction
from routing.monitoring.sla import assignment_sla_breach, sla_check
from routing.services import assignment_touch, lead_process
from tests.leads.factories import LeadFactory
from tests.routing.factories import RuleSetFactory, make_rep, publish_as_is, team_with
from tests.routing.monitoring.conftest import hook_bodies


@pytest.fixture(autouse=True)
def _fresh_config() -> Any:
    clear_live_config_cache()
    yield
    clear_live_config_cache()


def _setup(
    *, reps: int = 3, policy: str = "reassign", sla: int = 30, manager: User | None = None
) -> tuple[list[Rep], Team]:
    members = [make_rep() for _ in range(reps)]
    team = team_with(members, manager=manager)
    ruleset = RuleSetFactory()
    Rule.objects.create(
        ruleset=ruleset,
        priority=10,
        name="everyone",
        action={"type": "team", "team": team.name},
        sla_minutes=sla,
        on_sla_breach=policy,
    )
    publish_as_is(ruleset)
    return members, team


def _routed() -> Assignment:
    lead = cast(Lead, LeadFactory())
    lead_process(lead_id=lead.pk)
    return Assignment.objects.get(lead=lead, active=True)


def _events(lead_id: Any, type: str) -> int:
    return Event.objects.filter(lead_id=lead_id, type=type).count()


def _after_due(assignment: Assignment, minutes: int = 1) -> datetime:
    assert assignment.sla_due_at is not None
    return assignment.sla_due_at + timedelta(minutes=minutes)


@pytest.mark.django_db
def test_a_breach_is_recorded_once_however_often_the_check_runs(
    alert_hook: HTTPServer, django_capture_on_commit_callbacks: Any
) -> None:
    manager = User.objects.create_user("boss", email="boss@example.com")
    _setup(policy="notify", manager=manager)
    assignment = _routed()
    assert assignment.sla_minutes == 30
    before_due = assignment.sla_due_at - timedelta(seconds=1)  # type: ignore[operator]
    assert sla_check(now=before_due).breached == 0
    now = _after_due(assignment)
    with django_capture_on_commit_callbacks(execute=True):
        first = sla_check(now=now)
    with django_capture_on_commit_callbacks(execute=True):
        second = sla_check(now=now + timedelta(minutes=5))
    call_command("check_sla")
    assert (first.breached, second.breached) == (1, 0)
    assert _events(assignment.lead_id, EventType.SLA_BREACHED) == 1
    breach = SlaBreach.objects.get()
    assert breach.assignment_id == assignment.pk
    assert breach.action == SlaBreachAction.NOTIFIED
    # Notify policy: the owner keeps the lead; rep and manager get one e-mail, the hook one post.
    assert Assignment.objects.get(lead_id=assignment.lead_id, active=True).pk == assignment.pk
    (message,) = mail.outbox
    assert sorted(message.to) == sorted([assignment.rep.email, "boss@example.com"])
    (body,) = hook_bodies(alert_hook)
    assert "SLA missed" in body["text"]
    assert str(assignment.lead_id) in body["text"]


@pytest.mark.django_db
def test_a_touched_assignment_never_breaches() -> None:
    _setup(policy="reassign")
    assignment = _routed()
    assignment_touch(lead_id=assignment.lead_id, actor="user:rep")
    assert sla_check(now=_after_due(assignment, 600)).breached == 0
    assert SlaBreach.objects.count() == 0
    assert _events(assignment.lead_id, EventType.SLA_BREACHED) == 0


@pytest.mark.django_db
def test_reassign_goes_to_other_members_never_back_then_stops_at_the_cap(
    settings: Any,
) -> None:
    settings.SLA_MAX_REASSIGNMENTS = 2
    _setup(reps=4, policy="reassign", sla=30)
    first = _routed()
    owners = [first.rep_id]

    current = first
    for _round in range(2):
        now = _after_due(current)
        result = sla_check(now=now)
        assert (result.breached, result.reassigned) == (1, 1)
        new = Assignment.objects.get(lead_id=first.lead_id, active=True)
        assert new.kind == AssignmentKind.REASSIGNMENT
        assert new.supersedes_id == current.pk
        assert new.rep_id not in owners, "the lead went back to a rep who already had it"
        assert new.team_id == first.team_id
        assert new.rule_id == first.rule_id
        assert new.sla_due_at == now + timedelta(minutes=30)
        owners.append(new.rep_id)
        current = new

    # Third breach: the cap (2) is reached; it stays and an `sla` alert opens.
    now = _after_due(current)
    result = sla_check(now=now)
    assert (result.breached, result.reassigned, result.kept) == (1, 0, 1)
    assert Assignment.objects.get(lead_id=first.lead_id, active=True).pk == current.pk
    (alert,) = Alert.objects.filter(kind=AlertKind.SLA, status=AlertStatus.OPEN)
    assert alert.subject == f"team:{current.team_id}"
    assert "limit 2" in alert.message
    assert str(first.lead_id) in alert.message
    assert _events(first.lead_id, EventType.SLA_BREACHED) == 3
    reassigned = Event.objects.filter(lead_id=first.lead_id, type=EventType.REASSIGNED)
    assert reassigned.count() == 2
    assert all(e.data["manual"] is False for e in reassigned)
    assert len(set(owners)) == 3
    # Touching the lead clears the alert on the next check.
    assignment_touch(lead_id=first.lead_id, actor="user:rep")
    assert sla_check(now=now + timedelta(minutes=1)).alerts_resolved == 1
    alert.refresh_from_db()
    assert alert.status == AlertStatus.RESOLVED


@pytest.mark.django_db
def test_with_nobody_left_who_never_had_the_lead_it_stays_with_an_alert(settings: Any) -> None:
    settings.SLA_MAX_REASSIGNMENTS = 5
    _setup(reps=2, policy="reassign")
    first = _routed()
    sla_check(now=_after_due(first))
    second = Assignment.objects.get(lead_id=first.lead_id, active=True)
    assert second.rep_id != first.rep_id
    result = sla_check(now=_after_due(second))
    assert result.kept == 1
    assert Assignment.objects.get(lead_id=first.lead_id, active=True).pk == second.pk
    breach = SlaBreach.objects.get(assignment=second)
    assert breach.action == SlaBreachAction.KEPT
    assert "who has not had this lead" in breach.note
    assert Alert.objects.filter(kind=AlertKind.SLA, status=AlertStatus.OPEN).count() == 1


@pytest.mark.django_db
def test_ineligible_members_are_skipped(settings: Any) -> None:
    reps, _team = _setup(reps=3, policy="reassign")
    first = _routed()
    others = [rep for rep in reps if rep.pk != first.rep_id]
    Rep.objects.filter(pk=others[0].pk).update(active=False)
    sla_check(now=_after_due(first))
    new = Assignment.objects.get(lead_id=first.lead_id, active=True)
    assert new.rep_id == others[1].pk


@pytest.mark.django_db
def test_a_lead_without_a_reassign_rule_is_only_notified() -> None:
    _setup(reps=3, policy="notify")
    first = _routed()
    sla_check(now=_after_due(first))
    assert Assignment.objects.get(lead_id=first.lead_id, active=True).pk == first.pk
    assert not Alert.objects.exists()


@pytest.mark.django_db
def test_calling_the_service_twice_for_one_assignment_records_one_breach() -> None:
    _setup(policy="notify")
    assignment = _routed()
    now = _after_due(assignment)
    assert assignment_sla_breach(assignment_id=assignment.pk, now=now) is not None
    assert assignment_sla_breach(assignment_id=assignment.pk, now=now) is None
    assert _events(assignment.lead_id, EventType.SLA_BREACHED) == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_schedulers_at_once_record_one_event_per_breach(settings: Any) -> None:
    """Two beat schedulers by mistake: concurrent check_sla runs write no double events."""
    assert connection.vendor == "postgresql"
    settings.SLA_MAX_REASSIGNMENTS = 1
    _setup(reps=4, policy="reassign")
    assignments = [_routed() for _ in range(6)]
    now = max(_after_due(a) for a in assignments)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=10)
            sla_check(now=now)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    for assignment in assignments:
        assert _events(assignment.lead_id, EventType.SLA_BREACHED) == 1
        assert _events(assignment.lead_id, EventType.REASSIGNED) == 1
        assert Assignment.objects.filter(lead_id=assignment.lead_id).count() == 2
    assert SlaBreach.objects.count() == 6


@pytest.mark.django_db
def test_a_poisoned_row_does_not_stall_the_breaches_behind_it(
    settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An assignment whose handling always raised was picked first on every run (oldest due
    first); with the batch full of it, the breaches behind it were never handled."""
    from routing.monitoring import sla as sla_module
    from routing.monitoring.models import SlaCheckFailure

    settings.SLA_CHECK_ALERT_AFTER_FAILURES = 2
    _setup(reps=3, policy="notify")
    poison = _routed()
    later = [_routed() for _ in range(5)]
    Assignment.objects.filter(pk=poison.pk).update(
        sla_due_at=poison.sla_due_at - timedelta(hours=1)  # type: ignore[operator]
    )
    real = sla_module._breach_locked

    def breach_locked(assignment_id: int, now: datetime) -> Any:
        if assignment_id == poison.pk:
            raise RuntimeError("notification template is broken")
        return real(assignment_id, now)

    monkeypatch.setattr(sla_module, "_breach_locked", breach_locked)
    now = max(_after_due(a) for a in later)
    with caplog.at_level("ERROR", logger="routing.monitoring.sla"):
        result = sla_check(now=now, batch_size=1)
    assert (result.breached, result.failed) == (5, 1)
    for assignment in later:
        assert _events(assignment.lead_id, EventType.SLA_BREACHED) == 1
    assert _events(poison.lead_id, EventType.SLA_BREACHED) == 0
    assert f"SLA check of assignment {poison.pk} failed" in caplog.text
    failure = SlaCheckFailure.objects.get(assignment=poison)
    assert failure.failures == 1
    assert "notification template is broken" in failure.last_error
    # Paused, not retried on every run; retried after the pause, then an alert.
    assert sla_check(now=now + timedelta(seconds=10)).failed == 0
    assert sla_check(now=failure.retry_at).failed == 1
    (alert,) = Alert.objects.filter(kind=AlertKind.SLA, status=AlertStatus.OPEN)
    assert alert.subject == f"failing:{poison.pk}"
    assert "failed 2 times" in alert.message
    # Fixed: handled on its next try; the failure is forgotten and the alert resolved.
    monkeypatch.setattr(sla_module, "_breach_locked", real)
    retry = SlaCheckFailure.objects.get(assignment=poison).retry_at
    assert sla_check(now=retry).breached == 1
    assert _events(poison.lead_id, EventType.SLA_BREACHED) == 1
    assert not SlaCheckFailure.objects.exists()
    alert.refresh_from_db()
    assert alert.status == AlertStatus.RESOLVED


@pytest.mark.django_db
def test_one_run_handles_every_due_breach_in_batches() -> None:
    _setup(reps=3, policy="notify")
    assignments = [_routed() for _ in range(5)]
    now = max(_after_due(a) for a in assignments)
    assert sla_check(now=now, batch_size=2).breached == 5
    assert sla_check(now=now, batch_size=2, limit=10).breached == 0


@pytest.mark.django_db
def test_a_soft_time_limit_inside_the_loop_propagates_and_records_no_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It used to be caught as the row's failure (a false SlaCheckFailure), and the task ran on
    into the hard limit and was killed."""
    from celery.exceptions import SoftTimeLimitExceeded

    from routing.monitoring import sla as sla_module
    from routing.monitoring.models import SlaCheckFailure

    _setup(reps=2, policy="notify")
    assignment = _routed()

    def out_of_time(assignment_id: int, now: datetime) -> Any:
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(sla_module, "_breach_locked", out_of_time)
    with pytest.raises(SoftTimeLimitExceeded):
        sla_check(now=_after_due(assignment))
    assert not SlaCheckFailure.objects.exists()
    assert not SlaBreach.objects.exists()
    monkeypatch.undo()
    assert sla_check(now=_after_due(assignment)).breached == 1


@pytest.mark.django_db
def test_the_run_stops_at_its_deadline_and_the_next_run_carries_on(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from routing.monitoring import sla as sla_module

    settings.SLA_CHECK_MAX_SECONDS = 2.5
    _setup(reps=3, policy="notify")
    assignments = [_routed() for _ in range(3)]
    now = max(_after_due(a) for a in assignments)
    ticks = iter(range(1000))  # every look at the clock: one second later
    monkeypatch.setattr(sla_module, "_clock", lambda: float(next(ticks)))
    first = sla_check(now=now)
    assert (first.breached, first.out_of_time) == (2, True)
    second = sla_check(now=now)
    assert (second.breached, second.out_of_time) == (1, False)
    assert SlaBreach.objects.count() == 3


@pytest.mark.django_db
def test_a_slow_webhook_does_not_slow_the_check(
    httpserver: HTTPServer,
    settings: Any,
    breach_notices: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Each notification was sent inside the loop (SMTP, then the webhook, seconds each when
    slow): a mass breach crawled. Now each is a task message; the check only queues it."""
    import time

    from routing.monitoring.tasks import notify_sla_breach

    def slow(request: Any) -> Any:
        time.sleep(1.5)
        from werkzeug import Response

        return Response("{}", status=200, content_type="application/json")

    httpserver.expect_request("/alerts", method="POST").respond_with_handler(slow)
    settings.ALERT_WEBHOOK_URL = httpserver.url_for("/alerts")
    settings.ALERT_ALLOW_PRIVATE_URLS = True
    settings.ALERT_WEBHOOK_TIMEOUT_SECONDS = 5
    breach_notices.inline = False
    _setup(reps=3, policy="notify")
    assignments = [_routed() for _ in range(3)]
    now = max(_after_due(a) for a in assignments)
    started = time.monotonic()
    with django_capture_on_commit_callbacks(execute=True):
        assert sla_check(now=now).breached == 3
    assert time.monotonic() - started < 1.5
    assert httpserver.log == []
    assert len(breach_notices.queued) == 3
    # The delivery worker sends each: the rep's e-mail and the webhook post.
    notify_sla_breach(**breach_notices.queued[0])
    assert len(httpserver.log) == 1
    assert "SLA missed" in mail.outbox[0].subject


def test_a_breach_notice_is_a_task_message_on_the_delivery_queue(breach_notices: Any) -> None:
    from routing.monitoring import sla as sla_module
    from routing.monitoring.backlog import broker_queue_lengths
    from routing.monitoring.tasks import notify_sla_breach

    assert notify_sla_breach.name == sla_module.BREACH_NOTICE_TASK
    before = broker_queue_lengths()[0]["delivery"]
    assert before is not None
    breach_notices.real({"subject": "s", "text": "t", "recipients": [], "payload": {}})
    assert broker_queue_lengths()[0]["delivery"] == before + 1


@pytest.mark.django_db
def test_a_handled_breach_leaves_the_due_set() -> None:
    """The due query anti-joined every breach ever recorded, every minute; a handled breach is
    now stamped on its assignment and leaves the partial index the query reads."""
    from routing.monitoring.sla import _due

    _setup(reps=2, policy="notify")
    assignment = _routed()
    now = _after_due(assignment)
    assert list(_due(now).values_list("pk", flat=True)) == [assignment.pk]
    assert sla_check(now=now).breached == 1
    assignment.refresh_from_db()
    assert assignment.sla_breached_at == now
    assert not _due(now + timedelta(hours=1)).exists()


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_due_query_reads_the_partial_index() -> None:
    """A few thousand assignments, most of them handled long ago: the plan uses
    assignment_sla_due_idx (with sequential scans off, as the planner would on a large table)."""
    from django.utils import timezone

    from leads.models import LeadStatus
    from routing.monitoring.sla import _due
    from tests.leads.factories import SourceFactory

    rep = make_rep()
    source = SourceFactory()
    now = timezone.now()
    leads = Lead.objects.bulk_create(
        [
            Lead(
                source=source,
                raw_payload={},
                request_fingerprint=f"{i:064x}",
                status=LeadStatus.ASSIGNED,
            )
            for i in range(3000)
        ]
    )
    Assignment.objects.bulk_create(
        [
            Assignment(
                lead=lead,
                rep=rep,
                rep_name=rep.name,
                kind=AssignmentKind.INITIAL,
                sla_minutes=30,
                sla_due_at=now - timedelta(minutes=i % 500),
                sla_breached_at=None if i % 100 == 0 else now,
            )
            for i, lead in enumerate(leads)
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE routing_assignment")
        cursor.execute("SET LOCAL enable_seqscan = off")
    query = _due(now).order_by("sla_due_at", "id").values_list("sla_due_at", "id")[:500]
    plan = query.explain()
    assert "assignment_sla_due_idx" in plan, plan
    assert len(list(query)) == 30


@pytest.mark.django_db
def test_a_team_that_cannot_take_its_breached_leads_is_one_alert_not_one_per_lead(
    alert_hook: HTTPServer, django_capture_on_commit_callbacks: Any
) -> None:
    """A whole team out of office: each breached lead opened its own alert (a webhook post and
    an e-mail each, on top of the breach notice). Now one alert for the team, updated as more
    leads join and resolved when none is left; each rep still gets their lead's breach notice."""
    _reps, team = _setup(reps=1, policy="reassign")  # nobody else to reassign to
    assignments = [_routed() for _ in range(30)]
    now = max(_after_due(a) for a in assignments)
    with django_capture_on_commit_callbacks(execute=True):
        result = sla_check(now=now)
    assert (result.breached, result.kept) == (30, 30)
    (alert,) = Alert.objects.filter(kind=AlertKind.SLA)
    assert alert.subject == f"team:{team.pk}"
    assert alert.message.startswith(f"30 lead(s) of {team.name} missed their SLA")
    assert alert.data["count"] == 30
    assert len(alert.data["leads"]) == 20
    assert "(and 10 more)" in alert.message
    texts = [body["text"] for body in hook_bodies(alert_hook)]
    assert sum("LeadRouter alert" in text for text in texts) == 1
    assert sum("SLA missed" in text for text in texts) == 30  # the per-lead breach notices
    assert sum("ALERT" in message.subject for message in mail.outbox) == 1
    # Touched one by one: the alert stays (no new notification) until none is left.
    for assignment in assignments[:-1]:
        assignment_touch(lead_id=assignment.lead_id, actor="user:rep")
    with django_capture_on_commit_callbacks(execute=True):
        assert sla_check(now=now + timedelta(minutes=1)).alerts_resolved == 0
    assignment_touch(lead_id=assignments[-1].lead_id, actor="user:rep")
    with django_capture_on_commit_callbacks(execute=True):
        assert sla_check(now=now + timedelta(minutes=2)).alerts_resolved == 1
    alert.refresh_from_db()
    assert alert.status == AlertStatus.RESOLVED
    texts = [body["text"] for body in hook_bodies(alert_hook)]
    assert sum("LeadRouter alert" in text for text in texts) == 2  # opened, resolved


@pytest.mark.django_db
def test_the_failures_of_an_assignment_no_longer_due_are_forgotten(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row whose handling failed, then was touched (or reassigned) by hand, kept its
    SlaCheckFailure forever (and its `failing` alert open)."""
    from routing.monitoring import sla as sla_module
    from routing.monitoring.models import SlaCheckFailure

    settings.SLA_CHECK_ALERT_AFTER_FAILURES = 1
    _setup(reps=2, policy="notify")
    assignment = _routed()

    def broken(assignment_id: int, now: datetime) -> Any:
        raise RuntimeError("broken")

    monkeypatch.setattr(sla_module, "_breach_locked", broken)
    now = _after_due(assignment)
    assert sla_check(now=now).failed == 1
    assert SlaCheckFailure.objects.filter(assignment=assignment).exists()
    assignment_touch(lead_id=assignment.lead_id, actor="user:rep")
    sla_check(now=now + timedelta(seconds=10))  # paused: not tried again, but swept
    assert not SlaCheckFailure.objects.exists()
    assert not Alert.objects.filter(kind=AlertKind.SLA, status=AlertStatus.OPEN).exists()
