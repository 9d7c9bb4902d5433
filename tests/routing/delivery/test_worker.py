"""A real celery worker drains the delivery queue: retried, then delivered, duplicates ignored."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from pytest_httpserver import HTTPServer

from config.celery import app
from routing.delivery.models import Delivery, DeliveryChannel, DeliveryStatus, WebhookEndpoint
from routing.delivery.services import deliveries_schedule, deliveries_sweep_due
from routing.models import Assignment
from tests.routing.delivery.conftest import make_due, verify_standard_webhook
from tests.support.processes import celery_worker, wait_until

pytestmark = [
    pytest.mark.worker,
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def succeeded(log: str, task: str) -> int:
    return sum(1 for line in log.splitlines() if f"Task {task}[" in line and "succeeded" in line)


def test_a_worker_delivers_after_a_failure_and_ignores_duplicate_messages(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer
) -> None:
    httpserver.expect_oneshot_request("/hook").respond_with_data("", status=500)
    httpserver.expect_request("/hook").respond_with_data("ok")
    extra_env = {"DELIVERY_ALLOW_PRIVATE_URLS": "1", "EMAIL_URL": "consolemail://"}
    # Messages earlier tests left in the shared broker (a routed lead schedules deliveries)
    # would be counted below: start from an empty broker.
    app.control.purge()
    with celery_worker(concurrency=2, queues=["delivery"], extra_env=extra_env) as worker:
        with transaction.atomic():
            rows = deliveries_schedule(assignment=assignment)
        webhook = next(row for row in rows if row.channel == DeliveryChannel.WEBHOOK)
        email = next(row for row in rows if row.channel == DeliveryChannel.EMAIL)

        def attempts() -> int:
            return Delivery.objects.get(pk=webhook.pk).attempt_log.count()

        wait_until(lambda: attempts() == 1, 60, message=worker.text()[-3000:])
        wait_until(
            lambda: Delivery.objects.get(pk=email.pk).status == DeliveryStatus.DELIVERED,
            60,
            message=worker.text()[-3000:],
        )
        webhook.refresh_from_db()
        assert webhook.status == DeliveryStatus.PENDING
        assert webhook.last_status_code == 500

        make_due(webhook)
        assert deliveries_sweep_due() == 1  # what beat's delivery.sweep_due does
        wait_until(
            lambda: Delivery.objects.get(pk=webhook.pk).status == DeliveryStatus.DELIVERED,
            60,
            message=worker.text()[-3000:],
        )
        for _ in range(3):  # duplicate messages after delivery
            app.send_task("delivery.deliver", args=[webhook.pk])
        app.send_task("delivery.sweep_due")
        # Every message done: webhook, e-mail, the sweep's, three duplicates; and the sweep.
        wait_until(lambda: succeeded(worker.text(), "delivery.deliver") == 6, 30)
        wait_until(lambda: succeeded(worker.text(), "delivery.sweep_due") == 1, 30)

    assert len(httpserver.log) == 2
    first, second = (request for request, _ in httpserver.log)
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == webhook.message_id
    verify_standard_webhook(
        secret=endpoint.secret, headers=dict(second.headers), body=second.get_data()
    )
    log = list(Delivery.objects.get(pk=webhook.pk).attempt_log.values_list("number", "outcome"))
    assert log == [(1, "retry"), (2, "delivered")]


def test_a_worker_dms_the_rep_in_slack_after_a_429_and_never_twice(
    assignment: Assignment, httpserver: HTTPServer
) -> None:
    """The whole path through a real worker: the outbox row, slack-sdk's WebClient, a 429 with
    Retry-After honoured (then the sweep), delivered once despite duplicate messages."""
    from routing.crm.secrets import secret_seal
    from routing.delivery.models import NotificationChannel, NotificationKind
    from tests.support.chat_standins import SLACK_TOKEN, SlackStandin

    slack = SlackStandin(httpserver, users={"rep@example.com": "U0REP1"})
    slack.rate_limited_for, slack.retry_after = 1, 2
    channel = NotificationChannel.objects.create(
        name="Rita DM",
        kind=NotificationKind.SLACK_BOT,
        rep=assignment.rep,
        secret_encrypted=secret_seal(SLACK_TOKEN),
    )
    extra_env = {
        "DELIVERY_ALLOW_PRIVATE_URLS": "1",
        "EMAIL_URL": "consolemail://",
        "SLACK_API_BASE_URL": slack.base_url,
    }
    app.control.purge()
    with celery_worker(concurrency=2, queues=["delivery"], extra_env=extra_env) as worker:
        with transaction.atomic():
            rows = deliveries_schedule(assignment=assignment)
        dm = next(row for row in rows if row.notification_channel_id == channel.pk)

        def status() -> str:
            return Delivery.objects.get(pk=dm.pk).status

        wait_until(
            lambda: Delivery.objects.get(pk=dm.pk).attempt_log.count() == 1,
            60,
            message=worker.text()[-3000:],
        )
        dm.refresh_from_db()
        assert dm.status == DeliveryStatus.PENDING
        assert dm.last_status_code == 429
        assert dm.next_attempt_at is not None
        assert dm.next_attempt_at >= dm.attempt_log.get().at + timedelta(seconds=2)
        make_due(dm)
        assert deliveries_sweep_due() >= 1
        wait_until(lambda: status() == DeliveryStatus.DELIVERED, 60, message=worker.text()[-3000:])
        for _ in range(3):
            app.send_task("delivery.deliver", args=[dm.pk])
        wait_until(lambda: succeeded(worker.text(), "delivery.deliver") >= 6, 30)

    assert len(slack.posted) == 1
    assert slack.posted[0]["channel"] == "U0REP1"
    log = list(Delivery.objects.get(pk=dm.pk).attempt_log.values_list("number", "outcome"))
    assert log == [(1, "retry"), (2, "delivered")]
