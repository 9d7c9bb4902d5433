"""The nightly export of the audit chain heads: a beat job, files kept, an alert when it fails."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from audit.heads import EXPORT_ALERT_SUBJECT, audit_heads_check
from audit.models import EventType
from audit.services import event_record
from audit.tasks import audit_export_heads
from config.celery import app as celery_app
from routing.monitoring.models import Alert, AlertKind, AlertStatus

pytestmark = pytest.mark.django_db


def _open_alerts() -> list[Alert]:
    return list(Alert.objects.filter(kind=AlertKind.AUDIT, status=AlertStatus.OPEN))


def test_beat_runs_the_export_nightly_on_the_maintenance_queue():
    from celery.schedules import crontab

    entry = django_settings.CELERY_BEAT_SCHEDULE["audit-export-heads"]
    assert entry["task"] == "maintenance.audit_nightly"
    assert entry["options"]["queue"] == "maintenance"
    schedule = entry["schedule"]
    assert isinstance(schedule, crontab)
    assert str(schedule).startswith("<crontab: 30 2 * * *")
    celery_app.loader.import_default_modules()
    assert "maintenance.audit_nightly" in celery_app.tasks
    assert "maintenance.audit_export_heads" in celery_app.tasks  # messages queued before


def test_the_task_writes_a_signed_heads_file(settings, tmp_path):
    settings.AUDIT_HEADS_DIR = tmp_path / "heads"
    settings.AUDIT_HEADS_KEEP = 3
    first = event_record(type=EventType.RULES_PUBLISHED, actor="user:ana", data={"version": 1})
    audit_export_heads.apply()  # as a worker runs it
    (written,) = (tmp_path / "heads").glob("heads-*.json")
    document = json.loads(written.read_text(encoding="utf-8"))
    assert document["heads"] == {"routing": [1, first.hash]}
    assert audit_heads_check(document).findings == []


def test_only_the_newest_files_are_kept(settings, tmp_path):
    from audit.heads import audit_heads_export_scheduled

    settings.AUDIT_HEADS_DIR = tmp_path
    settings.AUDIT_HEADS_KEEP = 3
    (tmp_path / "notes.txt").write_text("not a heads file: left alone")
    night = datetime(2026, 11, 1, 2, 30, tzinfo=UTC)
    names = []
    for day in range(5):
        event_record(type=EventType.RULES_PUBLISHED, actor="user:ana", data={"version": day})
        path = audit_heads_export_scheduled(now=night + timedelta(days=day))
        assert path is not None
        names.append(path.name)
    assert names[0] == "heads-20261101T023000Z.json"
    remaining = sorted(p.name for p in tmp_path.iterdir())
    assert remaining == [*names[2:], "notes.txt"]  # no partial file left behind either
    assert _open_alerts() == []


def test_a_failed_export_opens_an_alert_and_the_next_success_resolves_it(
    settings, tmp_path, caplog, django_capture_on_commit_callbacks
):
    from audit.heads import audit_heads_export_scheduled

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    settings.AUDIT_HEADS_DIR = blocker / "heads"
    with (
        caplog.at_level(logging.ERROR, logger="audit.heads"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert audit_heads_export_scheduled() is None
    (alert,) = _open_alerts()
    assert alert.subject == EXPORT_ALERT_SUBJECT
    assert "export of the audit chain heads" in alert.message
    assert "NotADirectoryError" in alert.message or "FileExistsError" in alert.message
    assert any("exporting the audit chain heads" in r.getMessage() for r in caplog.records)
    assert audit_heads_export_scheduled() is None  # still failing: the same alert, refreshed
    assert len(_open_alerts()) == 1
    settings.AUDIT_HEADS_DIR = tmp_path / "heads"
    assert audit_heads_export_scheduled() is not None
    assert _open_alerts() == []
    assert Alert.objects.get(pk=alert.pk).status == AlertStatus.RESOLVED


def test_the_nightly_job_verifies_the_log_and_last_nights_heads_then_exports(
    settings, tmp_path, django_capture_on_commit_callbacks
):
    from django.db import connection

    from audit.heads import VERIFY_ALERT_SUBJECT
    from audit.models import Event
    from audit.tasks import audit_nightly

    settings.AUDIT_HEADS_DIR = tmp_path
    for version in (1, 2, 3):
        event_record(type=EventType.RULES_PUBLISHED, actor="user:ana", data={"version": version})
    with django_capture_on_commit_callbacks(execute=True):
        audit_nightly.apply()
    assert _open_alerts() == []
    assert len(list(tmp_path.glob("heads-*.json"))) == 1

    # Someone with the database's keys deletes the newest event: the chain alone still holds
    # (nothing after it), but last night's heads file names it.
    last = Event.objects.filter(chain="routing").order_by("-seq").first()
    assert last is not None
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # As a superuser would: triggers off for this session only.
            cursor.execute("SET session_replication_role = replica")
            cursor.execute("DELETE FROM audit_event WHERE id = %s", [last.pk])
            cursor.execute("SET session_replication_role = DEFAULT")
        else:
            names = [
                row[0]
                for row in cursor.execute(
                    "SELECT name FROM sqlite_master WHERE type='trigger' AND tbl_name='audit_event'"
                ).fetchall()
            ]
            sql = {
                row[0]: row[1]
                for row in cursor.execute(
                    "SELECT name, sql FROM sqlite_master WHERE type='trigger' "
                    "AND tbl_name='audit_event'"
                ).fetchall()
            }
            for name in names:
                cursor.execute(f'DROP TRIGGER "{name}"')
            cursor.execute("DELETE FROM audit_event WHERE id = %s", [last.pk])
            for name in names:
                cursor.execute(sql[name])
    with django_capture_on_commit_callbacks(execute=True):
        audit_nightly.apply()
    (alert,) = _open_alerts()
    assert alert.subject == VERIFY_ALERT_SUBJECT
    assert "truncated routing #3" in alert.message
    # The damaged log is not signed: the next night still compares with the good heads.
    assert len(list(tmp_path.glob("heads-*.json"))) == 1
    with django_capture_on_commit_callbacks(execute=True):
        audit_nightly.apply()
    assert [a.subject for a in _open_alerts()] == [VERIFY_ALERT_SUBJECT]

    # Once understood, an operator writes a new baseline; the next clean night resolves it.
    from audit.heads import audit_heads_export_scheduled

    assert audit_heads_export_scheduled(now=timezone.now() + timedelta(seconds=1)) is not None
    with django_capture_on_commit_callbacks(execute=True):
        audit_nightly.apply()
    assert _open_alerts() == []
