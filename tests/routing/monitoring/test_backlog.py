"""The backlog check: depth, age, stale heartbeats, broker, enrichment and unassigned alerts."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone
from pytest_httpserver import HTTPServer

from audit.models import EventType
from audit.services import event_record
from config.celery import app as celery_app
from leads.models import Lead, LeadStatus
from routing.models import QueueHeartbeat
from routing.monitoring import backlog as backlog_module
from routing.monitoring.backlog import backlog_check, backlog_measure, broker_queue_lengths
from routing.monitoring.models import Alert, AlertKind, AlertStatus
from routing.tasks import heartbeat
from tests.leads.factories import LeadFactory
from tests.routing.monitoring.conftest import hook_bodies
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db


def _open(kind: str) -> list[Alert]:
    return list(Alert.objects.filter(kind=kind, status=AlertStatus.OPEN))


@pytest.fixture(autouse=True)
def _thresholds(settings: Any) -> None:
    settings.BACKLOG_ALERT_DEPTH = 3
    settings.BACKLOG_ALERT_AGE_SECONDS = 300
    settings.HEARTBEAT_STALE_SECONDS = 120
    settings.ENRICHMENT_ALERT_FAILURES = 3
    settings.UNASSIGNED_ALERT_COUNT = 2
    settings.UNASSIGNED_ALERT_AGE_SECONDS = 3600


@pytest.fixture(autouse=True)
def _empty_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker is shared by the whole run (Redis keeps messages of earlier tests): the checks
    here see empty queues unless a test says otherwise; the length readers have their own tests.
    """
    monkeypatch.setattr(
        backlog_module,
        "broker_queue_lengths",
        lambda: (dict.fromkeys((q.name for q in celery_app.conf.task_queues), 0), None),
    )


def test_depth_opens_one_backlog_alert_and_clearing_resolves_it(
    alert_hook: HTTPServer, django_capture_on_commit_callbacks: Any
) -> None:
    leads = [LeadFactory() for _ in range(4)]
    with django_capture_on_commit_callbacks(execute=True):
        report = backlog_check()
    assert report.received == 4
    (alert,) = _open(AlertKind.BACKLOG)
    assert "4 leads waiting" in alert.message
    with django_capture_on_commit_callbacks(execute=True):
        backlog_check()  # still bad: the same alert, no new notification
    assert len(_open(AlertKind.BACKLOG)) == 1
    Lead.objects.filter(pk__in=[lead.pk for lead in leads[:2]]).update(status=LeadStatus.ASSIGNED)
    with django_capture_on_commit_callbacks(execute=True):
        backlog_check()
    assert _open(AlertKind.BACKLOG) == []
    alert.refresh_from_db()
    assert alert.status == AlertStatus.RESOLVED
    texts = [body["text"] for body in hook_bodies(alert_hook)]
    assert len(texts) == 2, texts
    assert "resolved" in texts[1]


def test_the_oldest_lead_waiting_too_long_opens_the_alert() -> None:
    now = timezone.now()
    LeadFactory(received_at=now - timedelta(seconds=301))
    report = backlog_check(now=now)
    assert report.received == 1
    assert report.oldest_received_seconds == pytest.approx(301, abs=1)
    (alert,) = _open(AlertKind.BACKLOG)
    assert "waited 301 s" in alert.message
    # Just under the limit: fine.
    backlog_check(now=now - timedelta(seconds=2))
    assert _open(AlertKind.BACKLOG) == []


def test_leads_left_processing_by_a_dead_worker_count_as_waiting() -> None:
    now = timezone.now()
    for _ in range(4):
        LeadFactory(status=LeadStatus.PROCESSING, claimed_until=now - timedelta(seconds=5))
    LeadFactory(status=LeadStatus.PROCESSING, claimed_until=now + timedelta(seconds=60))
    report = backlog_check(now=now)
    assert report.stuck_processing == 4
    assert len(_open(AlertKind.BACKLOG)) == 1


def test_a_stale_heartbeat_opens_a_worker_alert_per_queue_until_a_worker_is_back() -> None:
    now = timezone.now()
    QueueHeartbeat.objects.create(queue="routing", last_seen_at=now - timedelta(seconds=200))
    QueueHeartbeat.objects.create(queue="delivery", last_seen_at=now - timedelta(seconds=10))
    report = backlog_check(now=now)
    assert set(report.stale_queues) == {"routing"}
    (alert,) = _open(AlertKind.WORKER)
    assert alert.subject == "routing"
    assert '"routing" queue for 200 s' in alert.message
    QueueHeartbeat.objects.filter(queue="routing").update(last_seen_at=now)
    backlog_check(now=now)
    assert _open(AlertKind.WORKER) == []


def test_filesystem_broker_queue_lengths_count_messages(settings: Any) -> None:
    if not settings.BROKER_IS_FILESYSTEM:
        pytest.skip("the filesystem broker is not in use")
    before, error = broker_queue_lengths()
    assert error is None
    for _ in range(3):
        heartbeat.apply_async(args=["maintenance"], queue="maintenance")
    after, _ = broker_queue_lengths()
    assert (after["maintenance"] or 0) - (before["maintenance"] or 0) == 3
    assert set(after) == {q.name for q in celery_app.conf.task_queues}


@pytest.mark.redis
def test_redis_broker_queue_lengths_count_messages(settings: Any) -> None:
    if settings.BROKER_IS_FILESYSTEM:
        pytest.skip("the broker is not Redis")
    before, error = broker_queue_lengths()
    assert error is None, error
    for _ in range(3):
        heartbeat.apply_async(args=["maintenance"], queue="maintenance")
    after, _ = broker_queue_lengths()
    assert (after["maintenance"] or 0) - (before["maintenance"] or 0) == 3


def test_a_long_broker_queue_opens_the_backlog_alert(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "routing.monitoring.backlog.broker_queue_lengths",
        lambda: ({"routing": 10, "delivery": 0}, None),
    )
    backlog_check()
    (alert,) = _open(AlertKind.BACKLOG)
    assert "10 messages in the routing queue" in alert.message


def test_a_dead_redis_broker_opens_a_broker_alert_without_raising(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Redis URL on a port nothing listens on: the check must report, not crash.
    settings.BROKER_IS_FILESYSTEM = False
    settings.READYZ_BROKER_TIMEOUT_SECONDS = 0.5
    monkeypatch.setitem(celery_app.conf, "broker_url", f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setitem(celery_app.conf, "broker_read_url", None)
    monkeypatch.setitem(celery_app.conf, "broker_transport", None)  # the embedded one's class
    monkeypatch.setitem(
        celery_app.conf,
        "broker_transport_options",
        {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
    )
    monkeypatch.setattr(backlog_module, "broker_queue_lengths", broker_queue_lengths)
    lengths, error = broker_queue_lengths()
    assert error is not None
    assert "onnect" in error or "refused" in error, error
    assert all(value is None for value in lengths.values())
    backlog_check()
    (alert,) = _open(AlertKind.BROKER)
    assert "does not answer" in alert.message


def test_many_enrichment_failures_open_an_enrichment_alert() -> None:
    now = timezone.now()
    for _ in range(3):
        lead = LeadFactory()
        event_record(
            type=EventType.ENRICHMENT_FAILED,
            lead=lead,
            at=now - timedelta(minutes=1),
            data={"provider": "http", "reason": "timeout after 10 s (attempt 5 of 5)"},
        )
    Lead.objects.update(status=LeadStatus.ASSIGNED)
    report = backlog_check(now=now)
    assert report.enrichment_failures == 3
    (alert,) = _open(AlertKind.ENRICHMENT)
    assert "3 enrichment failures" in alert.message
    # Ten minutes later those failures are out of the window.
    backlog_check(now=now + timedelta(minutes=10))
    assert _open(AlertKind.ENRICHMENT) == []


def test_an_expired_credential_opens_the_alert_at_the_first_refusal_and_a_success_clears_it(
    settings: Any,
) -> None:
    settings.ENRICHMENT_ALERT_FAILURES = 100
    now = timezone.now()
    lead = LeadFactory(status=LeadStatus.ASSIGNED)
    event_record(
        type=EventType.ENRICHMENT_FAILED,
        lead=lead,
        at=now - timedelta(seconds=20),
        data={"provider": "http", "reason": "provider refused the request (HTTP 401)"},
    )
    report = backlog_check(now=now)
    assert report.enrichment_refused
    (alert,) = _open(AlertKind.ENRICHMENT)
    assert "refuses our credentials" in alert.message
    assert "HTTP 401" in alert.message
    event_record(
        type=EventType.ENRICHED,
        lead=lead,
        at=now,
        data={"provider": "http", "status": "done", "filled": []},
    )
    backlog_check(now=now + timedelta(seconds=1))
    assert _open(AlertKind.ENRICHMENT) == []


def test_other_refusals_do_not_count_as_credential_problems() -> None:
    now = timezone.now()
    event_record(
        type=EventType.ENRICHMENT_FAILED,
        lead=LeadFactory(status=LeadStatus.ASSIGNED),
        at=now,
        data={"provider": "http", "reason": "provider refused the request (HTTP 422)"},
    )
    backlog_check(now=now)
    assert _open(AlertKind.ENRICHMENT) == []


def test_an_open_enrichment_breaker_opens_an_enrichment_alert(settings: Any) -> None:
    from django.core.cache import cache

    from routing.enrichment.breaker import http_breaker

    settings.ENRICHMENT_HTTP_URL = "https://enrich.example.com/v1"
    settings.ENRICHMENT_BREAKER_FAILURES = 2
    breaker = http_breaker()
    try:
        breaker.record_failure()
        breaker.record_failure()
        assert backlog_measure().enrichment_breaker_open
        backlog_check()
        (alert,) = _open(AlertKind.ENRICHMENT)
        assert "circuit breaker is open" in alert.message
        breaker.record_success()
        event_record(  # what the successful probe records
            type=EventType.ENRICHED,
            lead=LeadFactory(status=LeadStatus.ASSIGNED),
            data={"provider": "http", "status": "done", "filled": []},
        )
        backlog_check()
        assert _open(AlertKind.ENRICHMENT) == []
    finally:
        breaker.record_success()
        cache.clear()


def test_unassigned_leads_piling_up_open_an_unassigned_alert() -> None:
    for _ in range(3):
        LeadFactory(status=LeadStatus.UNASSIGNED)
    backlog_check()
    (alert,) = _open(AlertKind.UNASSIGNED)
    assert alert.message.startswith("3 unassigned leads")
    Lead.objects.update(status=LeadStatus.ASSIGNED)
    backlog_check()
    assert _open(AlertKind.UNASSIGNED) == []


def test_an_old_unassigned_lead_opens_the_alert_too() -> None:
    now = timezone.now()
    LeadFactory(status=LeadStatus.UNASSIGNED, received_at=now - timedelta(hours=2))
    backlog_check(now=now)
    assert len(_open(AlertKind.UNASSIGNED)) == 1


def test_a_healthy_pipeline_opens_nothing() -> None:
    LeadFactory(status=LeadStatus.ASSIGNED)
    LeadFactory()
    QueueHeartbeat.objects.create(queue="routing", last_seen_at=timezone.now())
    backlog_check()
    assert Alert.objects.count() == 0


def test_the_command_runs_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(4):
        LeadFactory()
    call_command("check_backlog")
    out = capsys.readouterr().out
    assert '"received": 4' in out
    assert "Backlog: 4 leads waiting" in out
    assert len(_open(AlertKind.BACKLOG)) == 1


@pytest.mark.django_db
def test_published_rules_that_no_longer_compile_open_a_rules_alert_until_fixed():
    from routing.decisions import clear_live_config_cache
    from routing.models import Team
    from routing.monitoring.backlog import rules_check
    from routing.monitoring.models import Alert
    from routing.rules_io import rules_import
    from tests.routing.test_pipeline import RULES

    clear_live_config_cache()
    rules_import(RULES, publish=True)
    assert rules_check() == ()
    # Renamed behind the admin's back (the admin refuses it): the team rule cannot compile.
    Team.objects.filter(name="EMEA SDR").update(name="EMEA Sales")
    broken = rules_check()
    assert len(broken) == 1
    assert "Everyone" in broken[0]
    alert = Alert.objects.get(kind="rules", status="open")
    assert "no longer compile" in alert.message
    assert rules_check() == broken  # still one alert
    assert Alert.objects.filter(kind="rules").count() == 1
    Team.objects.filter(name="EMEA Sales").update(name="EMEA SDR")
    assert rules_check() == ()
    assert Alert.objects.get(kind="rules").status == "resolved"
    clear_live_config_cache()


@pytest.mark.django_db
def test_a_queue_no_worker_ever_drained_raises_a_worker_alert_within_two_minutes(settings):
    """With no heartbeat row at all (a fresh deployment with no worker, or -Q leaving a queue
    out) no worker alert ever opened."""
    from datetime import timedelta

    from config.settings import base

    settings.HEARTBEAT_STALE_SECONDS = base.HEARTBEAT_STALE_SECONDS  # the default, 90 s

    from django.utils import timezone

    from routing.models import QueueHeartbeat
    from routing.monitoring.backlog import backlog_check
    from routing.monitoring.models import Alert

    assert not QueueHeartbeat.objects.exists()
    start = timezone.now()
    backlog_check(now=start)
    assert not Alert.objects.filter(kind="worker").exists()
    # The routing queue is drained; the others are not.
    QueueHeartbeat.objects.filter(queue="routing").update(
        last_seen_at=start + timedelta(seconds=90)
    )
    backlog_check(now=start + timedelta(seconds=120))
    stale = set(
        Alert.objects.filter(kind="worker", status="open").values_list("subject", flat=True)
    )
    assert stale == {
        "routing.realtime",
        "routing.bulk",
        "enrichment",
        "enrichment.realtime",
        "crm",
        "crm.realtime",
        "delivery",
        "maintenance",
    }


@pytest.mark.django_db
def test_a_backlog_hovering_at_its_threshold_notifies_once_not_every_minute(
    settings, alert_hook, django_capture_on_commit_callbacks
):
    """With no hold-down, a queue alternating 4/3 around a depth limit of 3 opened and resolved
    the alert on every check, one notification each time (6 posts in 6 minutes)."""
    from datetime import timedelta

    from django.utils import timezone

    from routing.monitoring.backlog import backlog_check

    settings.ALERT_RESOLVE_AFTER_SECONDS = 90
    start = timezone.now()
    leads = [LeadFactory() for _ in range(4)]
    for minute in range(6):
        waiting = 4 if minute % 2 == 0 else 3
        Lead.objects.filter(pk__in=[lead.pk for lead in leads[waiting:]]).update(status="assigned")
        Lead.objects.filter(pk__in=[lead.pk for lead in leads[:waiting]]).update(status="received")
        with django_capture_on_commit_callbacks(execute=True):
            backlog_check(now=start + timedelta(minutes=minute))
    assert Alert.objects.filter(kind="backlog").count() == 1
    assert Alert.objects.get(kind="backlog").status == "open"
    backlog_posts = [b for b in hook_bodies(alert_hook) if "Backlog" in json.dumps(b)]
    assert len(backlog_posts) == 1
    # Clear for longer than the hold-down: resolved, one more notification.
    Lead.objects.update(status="assigned")
    with django_capture_on_commit_callbacks(execute=True):
        backlog_check(now=start + timedelta(minutes=6))
        backlog_check(now=start + timedelta(minutes=8))
    assert Alert.objects.get(kind="backlog").status == "resolved"
    backlog_posts = [b for b in hook_bodies(alert_hook) if "Backlog" in json.dumps(b)]
    assert len(backlog_posts) == 2


def test_the_enrichment_alert_stays_open_while_nothing_shows_the_credential_works(
    settings: Any,
) -> None:
    """It resolved once the refusal left the window (or ALERT_RESOLVE_AFTER_SECONDS passed
    quietly), though no call had succeeded: with no lead enriched lately the key was still
    expired. Only an answer from the provider resolves it."""
    settings.ENRICHMENT_HTTP_URL = "https://enrich.example.com/v1"
    settings.ENRICHMENT_ALERT_FAILURES = 100
    settings.ALERT_RESOLVE_AFTER_SECONDS = 90
    now = timezone.now()
    lead = LeadFactory(status=LeadStatus.ASSIGNED)
    event_record(
        type=EventType.ENRICHMENT_FAILED,
        lead=lead,
        at=now - timedelta(seconds=20),
        data={"provider": "http", "reason": "provider refused the request (HTTP 401)"},
    )
    backlog_check(now=now)
    (alert,) = _open(AlertKind.ENRICHMENT)
    # An hour of quiet: nobody tried, nothing failed, nothing succeeded.
    for minutes in (5, 11, 30, 60):
        backlog_check(now=now + timedelta(minutes=minutes))
        assert _open(AlertKind.ENRICHMENT) == [alert], minutes
    # A failure of another kind is not evidence either.
    event_record(
        type=EventType.ENRICHMENT_FAILED,
        lead=lead,
        at=now + timedelta(minutes=61),
        data={"provider": "http", "reason": "timeout after 10 s (attempt 1 of 5)"},
    )
    backlog_check(now=now + timedelta(minutes=62))
    assert _open(AlertKind.ENRICHMENT) == [alert]
    # The provider answers: resolved.
    event_record(
        type=EventType.ENRICHED,
        lead=lead,
        at=now + timedelta(minutes=63),
        data={"provider": "http", "status": "done", "filled": []},
    )
    backlog_check(now=now + timedelta(minutes=64))
    assert _open(AlertKind.ENRICHMENT) == []


def test_an_open_breaker_alert_resolves_only_after_a_probe_succeeds(settings: Any) -> None:
    """The breaker's open mark expiring, or no lead arriving to probe, is not recovery."""
    from django.core.cache import cache

    from routing.enrichment.breaker import http_breaker

    settings.ENRICHMENT_HTTP_URL = "https://enrich.example.com/v1"
    settings.ENRICHMENT_BREAKER_FAILURES = 1
    now = timezone.now()
    breaker = http_breaker()
    try:
        breaker.record_failure()
        backlog_check(now=now)
        (alert,) = _open(AlertKind.ENRICHMENT)
        # The breaker state is lost (store flushed, or its keys expired), no call was made.
        breaker.record_success()
        backlog_check(now=now + timedelta(minutes=30))
        assert _open(AlertKind.ENRICHMENT) == [alert]
        event_record(
            type=EventType.ENRICHED,
            lead=LeadFactory(status=LeadStatus.ASSIGNED),
            at=now + timedelta(minutes=31),
            data={"provider": "http", "status": "no_match", "filled": []},
        )
        backlog_check(now=now + timedelta(minutes=32))
        assert _open(AlertKind.ENRICHMENT) == []
    finally:
        breaker.record_success()
        cache.clear()


def test_an_unassigned_lead_retried_now_is_not_a_late_backlog(settings: Any) -> None:
    """Its wait starts when it re-enters the queue, not when it was first received (2 h ago):
    retrying unassigned leads must not open (and then resolve) a backlog alert every cycle."""
    from routing.monitoring.unassigned import unassigned_retry

    settings.UNASSIGNED_RETRY_SECONDS = 300
    now = timezone.now()
    lead = LeadFactory(
        status=LeadStatus.UNASSIGNED,
        received_at=now - timedelta(hours=2),
        processed_at=now - timedelta(hours=2),
    )
    assert unassigned_retry() == 1
    lead.refresh_from_db()
    assert lead.status == LeadStatus.RECEIVED
    assert lead.received_at == now - timedelta(hours=2)  # kept: when it arrived
    report = backlog_check()
    assert report.received == 1
    assert report.oldest_received_seconds < 60
    assert _open(AlertKind.BACKLOG) == []
    # It still counts as late once it has waited too long since it was queued again.
    later = backlog_check(now=timezone.now() + timedelta(seconds=301))
    assert any("the oldest lead has waited" in problem for problem in later.problems)


def test_each_lane_is_reported_and_a_realtime_lead_waiting_a_minute_opens_the_alert(
    settings: Any,
) -> None:
    """Issue 20: a bulk backlog within its limits, but a form lead stuck behind it for over a
    minute, is a backlog (the prospect left the page long ago)."""
    settings.BACKLOG_ALERT_DEPTH = 100
    settings.BACKLOG_ALERT_REALTIME_AGE_SECONDS = 60
    now = timezone.now()
    for _ in range(5):
        LeadFactory(lane="bulk", received_at=now - timedelta(seconds=200))
    LeadFactory(lane="realtime", received_at=now - timedelta(seconds=30))
    LeadFactory(lane="normal", status=LeadStatus.ASSIGNED, received_at=now - timedelta(hours=1))
    report = backlog_check(now=now)
    assert report.lanes["bulk"].received == 5
    assert report.lanes["bulk"].oldest_received_seconds == pytest.approx(200, abs=1)
    assert report.lanes["realtime"].received == 1
    assert report.lanes["normal"].received == 0
    assert report.lanes["normal"].oldest_received_seconds == 0
    assert report.lanes["realtime"].queue_length == 0  # routing.realtime's length
    assert report.as_data()["lanes"]["bulk"] == {
        "received": 5,
        "oldest_received_seconds": pytest.approx(200, abs=1),
        "queue_length": 0,
    }
    assert _open(AlertKind.BACKLOG) == []  # bulk 200 s < 300 s, realtime 30 s < 60 s

    report = backlog_check(now=now + timedelta(seconds=40))
    (alert,) = _open(AlertKind.BACKLOG)
    assert "the oldest realtime lead has waited 70 s (1 realtime waiting)" in alert.message
    assert alert.data["lanes"]["realtime"]["received"] == 1


def test_a_batch_upload_in_the_bulk_lane_is_watched_by_its_own_limits(settings: Any) -> None:
    """A webinar upload is a backlog by design: over the general depth and age limits it opens
    no alert, past the bulk lane's own limits it does; normal leads still count as before."""
    settings.BACKLOG_ALERT_DEPTH = 3
    settings.BACKLOG_ALERT_AGE_SECONDS = 300
    settings.BACKLOG_ALERT_BULK_DEPTH = 6
    settings.BACKLOG_ALERT_BULK_AGE_SECONDS = 900
    now = timezone.now()
    for _ in range(5):
        LeadFactory(lane="bulk", received_at=now - timedelta(seconds=600))
    report = backlog_check(now=now)
    assert report.problems == []
    assert _open(AlertKind.BACKLOG) == []

    later = backlog_check(now=now + timedelta(seconds=301))  # bulk waited 901 s
    assert later.problems == [
        "the oldest bulk lead has waited 901 s (5 bulk waiting), more than 900 s"
    ]
    for _ in range(2):
        LeadFactory(lane="bulk", received_at=now)
    assert "7 bulk leads waiting, more than 6" in backlog_check(now=now).problems

    for _ in range(4):
        LeadFactory(lane="normal", received_at=now)
    assert backlog_check(now=now).problems[0] == (
        "4 leads waiting (4 received, 0 left by a dead worker), more than 3"
    )
