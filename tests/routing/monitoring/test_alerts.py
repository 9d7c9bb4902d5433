"""Alerts: one open per kind and subject, one notification per opening and per resolution."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.db import IntegrityError, transaction
from django.utils import timezone
from pytest_httpserver import HTTPServer

from routing.monitoring.alerts import alert_raise, alert_resolve
from routing.monitoring.models import Alert, AlertStatus
from tests.routing.monitoring.conftest import hook_bodies

pytestmark = pytest.mark.django_db


def test_raising_twice_keeps_one_open_alert_and_notifies_once(
    alert_hook: HTTPServer, django_capture_on_commit_callbacks: Any
) -> None:
    start = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        first = alert_raise(kind="backlog", subject="pipeline", message="600 leads waiting")
    with django_capture_on_commit_callbacks(execute=True):
        second = alert_raise(
            kind="backlog",
            subject="pipeline",
            message="700 leads waiting",
            now=start + timedelta(minutes=1),
        )
    assert first.pk == second.pk
    alert = Alert.objects.get()
    assert alert.status == AlertStatus.OPEN
    assert alert.message == "700 leads waiting"
    assert alert.last_seen_at == start + timedelta(minutes=1)
    bodies = hook_bodies(alert_hook)
    assert len(bodies) == 1
    assert set(bodies[0]) == {"text"}  # the Slack shape
    assert "backlog:pipeline" in bodies[0]["text"]
    assert "600 leads waiting" in bodies[0]["text"]
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["ops@example.com"]


def test_resolving_notifies_once_and_a_new_problem_opens_a_new_alert(
    alert_hook: HTTPServer, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        alert_raise(kind="worker", subject="routing", message="no worker")
    with django_capture_on_commit_callbacks(execute=True):
        resolved = alert_resolve(kind="worker", subject="routing")
    with django_capture_on_commit_callbacks(execute=True):
        again = alert_resolve(kind="worker", subject="routing")
    assert resolved is not None
    assert resolved.status == AlertStatus.RESOLVED
    assert resolved.resolved_at is not None
    assert again is None
    texts = [body["text"] for body in hook_bodies(alert_hook)]
    assert len(texts) == 2
    assert "resolved" in texts[1]
    assert len(mail.outbox) == 2
    with django_capture_on_commit_callbacks(execute=True):
        reopened = alert_raise(kind="worker", subject="routing", message="no worker again")
    assert reopened.pk != resolved.pk
    assert Alert.objects.filter(status=AlertStatus.OPEN).count() == 1
    assert Alert.objects.count() == 2
    assert len(hook_bodies(alert_hook)) == 3


def test_different_subjects_are_different_alerts(
    alert_hook: HTTPServer, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        alert_raise(kind="worker", subject="routing", message="x")
        alert_raise(kind="worker", subject="delivery", message="y")
        alert_raise(kind="backlog", subject="routing", message="z")
    assert Alert.objects.filter(status=AlertStatus.OPEN).count() == 3
    assert len(hook_bodies(alert_hook)) == 3


def test_the_database_refuses_a_second_open_alert() -> None:
    Alert.objects.create(kind="backlog", subject="pipeline", message="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        Alert.objects.create(kind="backlog", subject="pipeline", message="b")
    # A resolved one with the same kind and subject is fine.
    Alert.objects.create(
        kind="backlog",
        subject="pipeline",
        message="old",
        status=AlertStatus.RESOLVED,
        resolved_at=timezone.now(),
    )


def test_json_format_sends_the_alert_document(
    alert_hook: HTTPServer, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.ALERT_WEBHOOK_FORMAT = "json"
    with django_capture_on_commit_callbacks(execute=True):
        alert = alert_raise(kind="sla", subject="assignment:7", message="m", data={"n": 1})
    (body,) = hook_bodies(alert_hook)
    assert body["event"] == "alert.opened"
    assert body["alert"]["id"] == alert.pk
    assert body["alert"]["kind"] == "sla"
    assert body["alert"]["data"] == {"n": 1}
    assert "text" in body


def test_a_failing_webhook_is_logged_and_never_raises(
    httpserver: HTTPServer,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Any,
) -> None:
    httpserver.expect_request("/alerts").respond_with_data("boom", status=500)
    settings.ALERT_WEBHOOK_URL = httpserver.url_for("/alerts")
    settings.ALERT_ALLOW_PRIVATE_URLS = True
    with django_capture_on_commit_callbacks(execute=True):
        alert_raise(kind="backlog", subject="pipeline", message="m")
    assert Alert.objects.filter(status=AlertStatus.OPEN).count() == 1
    assert len(httpserver.log) == 1
    assert "alert webhook answered HTTP 500" in caplog.text
    assert "ALERT opened [backlog:pipeline]" in caplog.text


def test_a_loopback_webhook_is_refused_unless_allowed(
    httpserver: HTTPServer,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Any,
) -> None:
    httpserver.expect_request("/alerts").respond_with_json({})
    settings.ALERT_WEBHOOK_URL = httpserver.url_for("/alerts")
    settings.ALERT_ALLOW_PRIVATE_URLS = False
    with django_capture_on_commit_callbacks(execute=True):
        alert_raise(kind="backlog", subject="pipeline", message="m")
    assert len(httpserver.log) == 0
    assert "alert webhook failed: UrlRefused" in caplog.text


def test_nothing_is_sent_when_the_transaction_rolls_back(
    alert_hook: HTTPServer, django_capture_on_commit_callbacks: Any
) -> None:
    class Boom(Exception):
        pass

    def raise_then_fail() -> None:
        with transaction.atomic():
            alert_raise(kind="backlog", subject="pipeline", message="m")
            raise Boom

    with django_capture_on_commit_callbacks(execute=True), pytest.raises(Boom):
        raise_then_fail()
    assert Alert.objects.count() == 0
    assert hook_bodies(alert_hook) == []


def test_opening_sends_one_sentry_message_when_sentry_is_initialised(
    monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    import sentry_sdk

    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(sentry_sdk, "is_initialized", lambda: True)
    monkeypatch.setattr(
        sentry_sdk, "capture_message", lambda message, level=None: sent.append((message, level))
    )
    with django_capture_on_commit_callbacks(execute=True):
        alert_raise(kind="broker", subject="broker", message="Redis down")
        alert_raise(kind="broker", subject="broker", message="Redis still down")
    with django_capture_on_commit_callbacks(execute=True):
        alert_resolve(kind="broker", subject="broker")
    assert sent == [("LeadRouter alert [broker:broker]: Redis down", "error")]
