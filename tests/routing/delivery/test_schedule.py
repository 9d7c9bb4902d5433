"""Scheduling the outbox rows, publishing them after commit, e-mail, the sweeper and retries."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core import mail
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone
from pytest_httpserver import HTTPServer

from audit.models import Event
from config.celery import app
from leads.services import broker_breaker
from routing.delivery import services
from routing.delivery.models import (
    Delivery,
    DeliveryChannel,
    DeliveryStatus,
    WebhookEndpoint,
)
from routing.delivery.services import (
    deliveries_retry,
    deliveries_schedule,
    deliveries_sweep_due,
    delivery_attempt,
)
from routing.models import Assignment, AssignmentKind
from tests.routing.factories import AssignmentFactory

pytestmark = pytest.mark.django_db


def test_one_row_per_subscribed_active_endpoint_plus_an_email_published_after_commit(
    assignment: Assignment,
    published: list[int],
    django_capture_on_commit_callbacks: Any,
    allow_private: None,
) -> None:
    crm = WebhookEndpoint.objects.create(name="CRM", url="http://127.0.0.1:9/a")
    WebhookEndpoint.objects.create(name="Off", url="http://127.0.0.1:9/b", active=False)
    WebhookEndpoint.objects.create(
        name="Only reassignments", url="http://127.0.0.1:9/c", events=["lead.reassigned"]
    )
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        rows = deliveries_schedule(assignment=assignment, event="assigned")
        assert published == []  # nothing leaves before the commit
    assert len(callbacks) == 1
    assert {(row.channel, row.endpoint_id) for row in rows} == {
        (DeliveryChannel.WEBHOOK, crm.pk),
        (DeliveryChannel.EMAIL, None),
    }
    assert sorted(published) == sorted(row.pk for row in rows)
    email = next(row for row in rows if row.channel == DeliveryChannel.EMAIL)
    assert email.recipient == "rep@example.com"
    assert all(row.event == "lead.assigned" for row in rows)
    assert all(row.status == DeliveryStatus.PENDING for row in rows)
    assert len({row.message_id for row in rows}) == 2

    # Scheduling again (a retried pipeline) creates and publishes nothing new.
    with django_capture_on_commit_callbacks(execute=True):
        again = deliveries_schedule(assignment=assignment, event="lead.assigned")
    assert {row.pk for row in again} == {row.pk for row in rows}
    assert len(published) == 2
    assert Delivery.objects.count() == 2


def test_a_reassignment_announces_lead_reassigned_under_new_message_ids(
    assignment: Assignment, published: list[int], allow_private: None
) -> None:
    WebhookEndpoint.objects.create(name="CRM", url="http://127.0.0.1:9/a")
    first = deliveries_schedule(assignment=assignment)
    Assignment.objects.filter(pk=assignment.pk).update(active=False)
    reassignment = AssignmentFactory(
        lead=assignment.lead,
        rep=assignment.rep,
        kind=AssignmentKind.REASSIGNMENT,
        supersedes=assignment,
    )
    second = deliveries_schedule(assignment=reassignment)
    assert {row.event for row in second} == {"lead.reassigned"}
    assert second[0].payload["type"] == "lead.reassigned"
    assert second[0].payload["data"]["assignment"]["supersedes"] == assignment.pk
    assert not {row.message_id for row in first} & {row.message_id for row in second}


def test_email_can_be_turned_off(
    assignment: Assignment, published: list[int], settings: Any
) -> None:
    settings.DELIVERY_EMAIL_ENABLED = False
    assert deliveries_schedule(assignment=assignment) == []


def test_an_unknown_event_is_a_programming_error(assignment: Assignment) -> None:
    with pytest.raises(ValueError, match="unknown delivery event"):
        deliveries_schedule(assignment=assignment, event="lead.touched")


def test_a_broker_outage_never_raises_and_leaves_the_rows_to_the_sweeper(
    assignment: Assignment,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("broker down")

    monkeypatch.setattr(services.celery_app, "producer_or_acquire", broken)
    with django_capture_on_commit_callbacks(execute=True):
        (row,) = deliveries_schedule(assignment=assignment)
    assert not broker_breaker.allows()
    row.refresh_from_db()
    assert row.status == DeliveryStatus.PENDING


def test_the_email_names_the_lead_company_country_reason_sla_and_links_the_history(
    assignment: Assignment, published: list[int], mailoutbox: list[Any], settings: Any
) -> None:
    settings.DELIVERY_LINK_BASE_URL = "https://leads.example.com/"
    (row,) = deliveries_schedule(assignment=assignment)
    assert delivery_attempt(delivery_id=row.pk) == "delivered"
    (message,) = mailoutbox
    assert message.to == ["rep@example.com"]
    assert "Ada Lovelace" in message.subject
    assert "Acme GmbH" in message.subject
    for text in ("Acme GmbH", "DE", "Germany to EMEA", "EMEA SDR", "Rita Rep"):
        assert text in message.body
    # The rep's zone (UTC here) is named; docs/revops.md, "Notifications".
    due = assignment.sla_due_at.strftime("%a %d %b %Y, %H:%M")
    assert f"SLA due:   {due} UTC (UTC)" in message.body
    assert f"https://leads.example.com/history/{assignment.lead_id}/" in message.body
    row.refresh_from_db()
    assert row.status == DeliveryStatus.DELIVERED
    assert Event.objects.filter(type="delivered", data__channel="email").count() == 1


def test_a_failing_mail_server_is_retried(
    assignment: Assignment, published: list[int], settings: Any
) -> None:
    # A real SMTP backend pointed at a loopback port nobody listens on: connection refused.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", port, 2
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    (row,) = deliveries_schedule(assignment=assignment)
    assert delivery_attempt(delivery_id=row.pk) == "retry"
    row.refresh_from_db()
    assert row.status == DeliveryStatus.PENDING
    assert "ConnectionRefusedError" in row.last_error
    assert mail.outbox == []


def test_the_sweeper_publishes_due_rows_once_per_due_time_and_again_if_lost(
    assignment: Assignment, published: list[int], settings: Any
) -> None:
    (row,) = deliveries_schedule(assignment=assignment)
    now = timezone.now()
    # Just published on commit (dispatched_at = created): not again within the redispatch time.
    assert deliveries_sweep_due(now=now) == 0
    # The message was lost: after DELIVERY_REDISPATCH_SECONDS the sweeper sends it again.
    later = now + timedelta(seconds=settings.DELIVERY_REDISPATCH_SECONDS + 1)
    assert deliveries_sweep_due(now=later) == 1
    assert published == [row.pk]
    assert deliveries_sweep_due(now=later) == 0
    # A retry falling due is published at once, whatever the last dispatch.
    Delivery.objects.filter(pk=row.pk).update(next_attempt_at=later + timedelta(seconds=5))
    assert deliveries_sweep_due(now=later + timedelta(seconds=1)) == 0  # not due yet
    assert deliveries_sweep_due(now=later + timedelta(seconds=6)) == 1
    assert published == [row.pk, row.pk]


def test_the_sweeper_works_in_bounded_batches(
    assignment: Assignment, published: list[int], settings: Any
) -> None:
    settings.DELIVERY_REDISPATCH_SECONDS = 0
    for _ in range(5):
        deliveries_schedule(assignment=AssignmentFactory())
    published.clear()
    later = timezone.now() + timedelta(seconds=1)
    assert deliveries_sweep_due(now=later, batch_size=2, max_batches=2) == 4
    assert deliveries_sweep_due(now=later, batch_size=2, max_batches=2) == 1
    assert len(set(published)) == 5


def test_the_sweep_command_can_send_inline(
    assignment: Assignment,
    endpoint: WebhookEndpoint,
    httpserver: HTTPServer,
    published: list[int],
    settings: Any,
    mailoutbox: list[Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    httpserver.expect_request("/hook").respond_with_data("")
    settings.DELIVERY_REDISPATCH_SECONDS = 0
    deliveries_schedule(assignment=assignment)
    Delivery.objects.update(dispatched_at=timezone.now() - timedelta(seconds=5))
    call_command("delivery_sweep", "--inline")
    assert "2 due delivery(ies) attempted" in capsys.readouterr().out
    assert len(httpserver.log) == 1
    assert len(mailoutbox) == 1
    assert set(Delivery.objects.values_list("status", flat=True)) == {DeliveryStatus.DELIVERED}


def test_retry_now_revives_a_failed_delivery_with_a_fresh_deadline(
    assignment: Assignment,
    endpoint: WebhookEndpoint,
    httpserver: HTTPServer,
    published: list[int],
    django_capture_on_commit_callbacks: Any,
) -> None:
    httpserver.expect_oneshot_request("/hook").respond_with_data("", status=500)
    httpserver.expect_request("/hook").respond_with_data("")
    row = next(r for r in deliveries_schedule(assignment=assignment) if r.endpoint_id)
    Delivery.objects.filter(pk=row.pk).update(give_up_at=timezone.now())
    assert delivery_attempt(delivery_id=row.pk) == "failed"
    published.clear()

    with django_capture_on_commit_callbacks(execute=True):
        assert deliveries_retry(delivery_ids=[row.pk]) == 1
    assert published == [row.pk]
    row.refresh_from_db()
    assert row.status == DeliveryStatus.PENDING
    assert row.give_up_at > timezone.now() + timedelta(hours=23)
    assert delivery_attempt(delivery_id=row.pk) == "delivered"
    assert deliveries_retry(delivery_ids=[row.pk]) == 0  # delivered stays delivered


def test_tasks_are_registered_routed_to_the_delivery_queue_and_swept_by_beat() -> None:
    import routing.tasks  # noqa: F401  (what the worker's autodiscovery imports)

    assert {"delivery.deliver", "delivery.sweep_due"} <= set(app.tasks)
    for name in ("delivery.deliver", "delivery.sweep_due"):
        assert app.amqp.router.route({}, name)["queue"].name == "delivery"
    entry = django_settings.CELERY_BEAT_SCHEDULE["delivery-sweep-due"]
    assert entry["task"] == "delivery.sweep_due"
    assert entry["schedule"] <= 30


def test_delivery_never_changes_the_assignment(
    assignment: Assignment,
    endpoint: WebhookEndpoint,
    httpserver: HTTPServer,
    published: list[int],
) -> None:
    httpserver.expect_request("/hook").respond_with_data("", status=410)
    before = Assignment.objects.filter(pk=assignment.pk).values().get()
    with transaction.atomic():
        rows = deliveries_schedule(assignment=assignment)
    for row in rows:
        delivery_attempt(delivery_id=row.pk)
    assert Assignment.objects.filter(pk=assignment.pk).values().get() == before
