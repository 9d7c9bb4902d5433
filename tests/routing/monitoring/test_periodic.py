"""Periodic jobs: installed into django-celery-beat from code; unassigned retries; beat watchdog."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler

from audit.models import Event, EventType
from config.celery import app as celery_app
from leads.models import Lead, LeadStatus
from routing.models import QueueHeartbeat
from routing.monitoring.models import Alert, AlertKind, AlertStatus
from routing.monitoring.unassigned import unassigned_retry
from tests.leads.factories import LeadFactory
from tests.support.processes import child_env, start, wait_until

MONITORING_JOBS = {
    "monitoring-check-backlog": "maintenance.check_backlog",
    "monitoring-check-sla": "maintenance.check_sla",
    "monitoring-retry-unassigned": "maintenance.retry_unassigned",
}


@pytest.mark.django_db(transaction=True)  # the scheduler closes and reopens connections
def test_beat_start_installs_a_periodic_task_for_every_declared_job() -> None:
    assert not PeriodicTask.objects.filter(name__in=settings.CELERY_BEAT_SCHEDULE).exists()
    DatabaseScheduler(app=celery_app)  # what `celery beat` builds at start-up
    installed = dict(PeriodicTask.objects.values_list("name", "task"))
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        assert installed.get(name) == entry["task"], name
    for name, task in MONITORING_JOBS.items():
        assert installed[name] == task
        assert PeriodicTask.objects.get(name=name).enabled


def test_every_scheduled_task_exists() -> None:
    celery_app.loader.import_default_modules()
    missing = {
        entry["task"]
        for entry in settings.CELERY_BEAT_SCHEDULE.values()
        if entry["task"] not in celery_app.tasks
    }
    assert not missing


@pytest.mark.django_db
def test_unassigned_leads_are_sent_through_routing_again_in_bounded_batches(
    settings: Any,
) -> None:
    settings.UNASSIGNED_RETRY_SECONDS = 300
    now = timezone.now()
    old = [
        LeadFactory(status=LeadStatus.UNASSIGNED, processed_at=now - timedelta(minutes=10))
        for _ in range(3)
    ]
    recent = LeadFactory(status=LeadStatus.UNASSIGNED, processed_at=now - timedelta(minutes=1))
    assigned = LeadFactory(status=LeadStatus.ASSIGNED, processed_at=now - timedelta(hours=1))
    assert unassigned_retry(now=now, batch_size=2) == 2
    assert unassigned_retry(now=now, batch_size=2) == 1
    assert unassigned_retry(now=now, batch_size=2) == 0
    for lead in old:
        lead.refresh_from_db()
        assert lead.status == LeadStatus.RECEIVED
        assert lead.unassigned_retries == 1
        # An automatic retry is no event: the outcome is, when it changes (test_unassigned_retry).
        assert not Event.objects.filter(lead=lead, type=EventType.REROUTE_REQUESTED).exists()
    assert Lead.objects.get(pk=recent.pk).status == LeadStatus.UNASSIGNED
    assert Lead.objects.get(pk=assigned.pk).status == LeadStatus.ASSIGNED


@pytest.mark.worker
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_beat_itself_reports_a_queue_nobody_drains_with_no_worker_running() -> None:
    """No worker at all, so the check_backlog task never runs: beat's watchdog still alerts."""
    QueueHeartbeat.objects.create(
        queue="routing", last_seen_at=timezone.now() - timedelta(minutes=10)
    )
    beat = start(
        [str(_celery()), "-A", "config", "beat", "--loglevel", "INFO"],
        child_env(BACKLOG_CHECK_INTERVAL_SECONDS="1", HEARTBEAT_STALE_SECONDS="120"),
    )
    try:
        wait_until(
            lambda: Alert.objects.filter(
                kind=AlertKind.WORKER, subject="routing", status=AlertStatus.OPEN
            ).exists(),
            timeout=60,
            message=lambda: f"beat did not raise the worker alert:\n{beat.text()[-4000:]}",
        )
    finally:
        beat.stop()
    assert "Traceback" not in beat.text(), beat.text()[-4000:]
    assert Alert.objects.filter(kind=AlertKind.WORKER).count() == 1


def _celery() -> Any:
    from tests.support.processes import BIN

    return BIN / "celery"


@pytest.mark.django_db
def test_every_periodic_monitoring_job_is_also_a_command(
    settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from django.core.management import call_command, get_commands

    for task in MONITORING_JOBS.values():
        assert task.removeprefix("maintenance.") in get_commands(), task
    settings.UNASSIGNED_RETRY_SECONDS = 300
    old = timezone.now() - timedelta(minutes=10)
    leads = [LeadFactory(status=LeadStatus.UNASSIGNED, processed_at=old) for _ in range(3)]
    call_command("retry_unassigned", "--batch-size", "2")
    assert "2 unassigned lead(s) sent through routing again." in capsys.readouterr().out
    call_command("retry_unassigned")
    assert "1 unassigned lead(s)" in capsys.readouterr().out
    assert all(Lead.objects.get(pk=lead.pk).status == LeadStatus.RECEIVED for lead in leads)
