"""Webhook delivery against a real local HTTP server (pytest-httpserver on loopback)."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from pytest_httpserver import HTTPServer
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from werkzeug import Request, Response

from audit.models import Event
from routing.delivery.models import Delivery, DeliveryStatus, WebhookEndpoint
from routing.delivery.services import deliveries_schedule, delivery_attempt, payload_body
from routing.models import Assignment
from tests.routing.delivery.conftest import make_due, verify_standard_webhook, webhook_delivery
from tests.routing.factories import AssignmentFactory
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db


def _requests(httpserver: HTTPServer) -> list[Request]:
    return [request for request, _ in httpserver.log]


def test_a_delivered_webhook_is_signed_the_standard_webhooks_way(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer, published: list[int]
) -> None:
    httpserver.expect_request("/hook", method="POST").respond_with_data("thanks")
    delivery = webhook_delivery(assignment, endpoint)

    assert delivery_attempt(delivery_id=delivery.pk) == "delivered"

    (request,) = _requests(httpserver)
    body = request.get_data()
    verify_standard_webhook(secret=endpoint.secret, headers=dict(request.headers), body=body)
    assert request.headers["webhook-id"] == delivery.message_id
    assert request.headers["content-type"] == "application/json"
    document = json.loads(body)
    assert document["type"] == "lead.assigned"
    lead = document["data"]["lead"]
    assert lead["id"] == str(assignment.lead_id)
    assert lead["fields"]["company"] == "Acme GmbH"
    assert lead["fields"]["annual_revenue"] == 1250000.5
    the_assignment = document["data"]["assignment"]
    assert the_assignment["rep"] == {
        "id": assignment.rep_id,
        "email": "rep@example.com",
        "name": "Rita Rep",
    }
    assert the_assignment["kind"] == "initial"
    assert the_assignment["team"]["name"] == "EMEA SDR"
    assert the_assignment["ruleset_version"] == 3
    assert the_assignment["sla_due_at"] is not None

    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.DELIVERED
    assert delivery.delivered_at is not None
    assert delivery.last_status_code == 200
    (attempt,) = delivery.attempt_log.all()
    assert (attempt.number, attempt.outcome, attempt.status_code) == (1, "delivered", 200)
    assert attempt.response_excerpt == "thanks"
    event = Event.objects.get(lead_id=assignment.lead_id, type="delivered")
    assert event.data["message_id"] == delivery.message_id
    assert event.rep_id == assignment.rep_id


def test_a_tampered_body_or_another_secret_fails_the_independent_verifier(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer, published: list[int]
) -> None:
    """The verifier used above can fail: a negative control for the signature tests."""
    httpserver.expect_request("/hook").respond_with_data("")
    delivery_attempt(delivery_id=webhook_delivery(assignment, endpoint).pk)
    (request,) = _requests(httpserver)
    headers, body = dict(request.headers), request.get_data()
    with pytest.raises(AssertionError):
        verify_standard_webhook(secret=endpoint.secret, headers=headers, body=body + b" ")
    other = WebhookEndpoint(name="x", url=endpoint.url).secret
    with pytest.raises(AssertionError):
        verify_standard_webhook(secret=other, headers=headers, body=body)


def test_500_then_200_is_retried_with_the_same_id_a_new_timestamp_and_the_same_body(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer, published: list[int]
) -> None:
    httpserver.expect_oneshot_request("/hook").respond_with_data("boom", status=500)
    httpserver.expect_request("/hook").respond_with_data("ok")
    delivery = webhook_delivery(assignment, endpoint)

    before = timezone.now()
    assert delivery_attempt(delivery_id=delivery.pk) == "retry"
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.PENDING
    assert delivery.last_status_code == 500
    assert delivery.last_error == "HTTP 500"
    # First retry: within the first backoff step (30 s base), never immediately.
    assert before < delivery.next_attempt_at <= timezone.now() + timedelta(seconds=31)
    assert delivery_attempt(delivery_id=delivery.pk) is None  # not due yet: nothing sent

    time.sleep(1.1)  # webhook-timestamp is in whole seconds
    make_due(delivery)
    assert delivery_attempt(delivery_id=delivery.pk) == "delivered"

    first, second = _requests(httpserver)
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery.message_id
    assert int(second.headers["webhook-timestamp"]) > int(first.headers["webhook-timestamp"])
    assert first.get_data() == second.get_data() == payload_body(delivery.payload)
    for request in (first, second):
        verify_standard_webhook(
            secret=endpoint.secret, headers=dict(request.headers), body=request.get_data()
        )
    log = list(delivery.attempt_log.values_list("number", "outcome", "status_code"))
    assert log == [(1, "retry", 500), (2, "delivered", 200)]
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.DELIVERED, 2)


def test_a_slow_server_times_out_and_a_retry_is_scheduled(
    assignment: Assignment,
    endpoint: WebhookEndpoint,
    httpserver: HTTPServer,
    published: list[int],
    settings: Any,
) -> None:
    settings.DELIVERY_TIMEOUT_SECONDS = 0.5

    release = threading.Event()

    def slow(request: Request) -> Response:
        release.wait(5)
        return Response("late")

    httpserver.expect_request("/hook").respond_with_handler(slow)
    delivery = webhook_delivery(assignment, endpoint)
    started = time.monotonic()
    assert delivery_attempt(delivery_id=delivery.pk) == "retry"
    assert time.monotonic() - started < 1.8

    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.PENDING
    assert "timed out" in delivery.last_error
    assert delivery.next_attempt_at > timezone.now()
    (attempt,) = delivery.attempt_log.all()
    assert attempt.outcome == "retry"
    assert attempt.status_code is None
    assert 400 <= attempt.duration_ms < 1800
    release.set()  # let the server finish, so its log entry does not land in the next test
    wait_until(lambda: len(httpserver.log) == 1, timeout=5)


def test_410_disables_the_endpoint_and_cancels_its_pending_deliveries(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer, published: list[int]
) -> None:
    httpserver.expect_request("/hook").respond_with_data("gone", status=410)
    other_endpoint = WebhookEndpoint.objects.create(name="BI", url=endpoint.url)
    delivery = webhook_delivery(assignment, endpoint)
    later = another_assignment(assignment)
    waiting = webhook_delivery(later, endpoint)
    elsewhere = webhook_delivery(later, other_endpoint)

    assert delivery_attempt(delivery_id=delivery.pk) == "failed"

    endpoint.refresh_from_db()
    assert endpoint.active is False
    assert endpoint.disabled_at is not None
    assert "410" in endpoint.disabled_reason
    assert delivery.message_id in endpoint.disabled_reason
    delivery.refresh_from_db()
    waiting.refresh_from_db()
    elsewhere.refresh_from_db()
    assert delivery.status == DeliveryStatus.FAILED
    assert waiting.status == DeliveryStatus.CANCELLED
    assert elsewhere.status == DeliveryStatus.PENDING  # another endpoint is not affected
    assert delivery.attempt_log.get().outcome == "gone"
    assert Event.objects.filter(lead_id=assignment.lead_id, type="delivery_failed").count() == 1
    # Nothing more goes to the disabled endpoint, and new assignments skip it.
    assert delivery_attempt(delivery_id=waiting.pk) is None
    assert len(httpserver.log) == 1
    third = another_assignment(assignment)
    webhook_endpoints = {
        row.endpoint_id for row in services_schedule(third) if row.endpoint_id is not None
    }
    assert webhook_endpoints == {other_endpoint.pk}
    # The assignment is untouched by any of this.
    assignment.refresh_from_db()
    assert assignment.active is True


def test_429_retry_after_is_honoured(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer, published: list[int]
) -> None:
    httpserver.expect_request("/hook").respond_with_data(
        "slow down", status=429, headers={"Retry-After": "600"}
    )
    delivery = webhook_delivery(assignment, endpoint)
    before = timezone.now()
    assert delivery_attempt(delivery_id=delivery.pk) == "retry"
    delivery.refresh_from_db()
    assert delivery.last_status_code == 429
    # The backoff alone would be at most 30 s for a first failure: Retry-After wins.
    assert delivery.next_attempt_at >= before + timedelta(seconds=600)
    assert delivery.next_attempt_at <= timezone.now() + timedelta(seconds=601)


def test_after_the_max_age_a_failing_delivery_is_failed_with_an_audit_event(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer, published: list[int]
) -> None:
    httpserver.expect_request("/hook").respond_with_data("down", status=503)
    delivery = webhook_delivery(assignment, endpoint)
    assert delivery.give_up_at - delivery.created_at == timedelta(days=1)
    assert delivery_attempt(delivery_id=delivery.pk) == "retry"

    # A day later (moved back rather than waited for):
    Delivery.objects.filter(pk=delivery.pk).update(
        created_at=timezone.now() - timedelta(days=1, minutes=1),
        give_up_at=timezone.now() - timedelta(minutes=1),
        next_attempt_at=timezone.now(),
    )
    assert delivery_attempt(delivery_id=delivery.pk) == "failed"

    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.FAILED
    assert delivery.next_attempt_at is None
    assert list(delivery.attempt_log.values_list("outcome", flat=True)) == ["retry", "failed"]
    event = Event.objects.get(lead_id=assignment.lead_id, type="delivery_failed")
    assert event.data["message_id"] == delivery.message_id
    assert event.data["error"] == "HTTP 503"
    assert event.data["attempts"] == 2
    assert delivery_attempt(delivery_id=delivery.pk) is None
    assert len(httpserver.log) == 2
    assignment.refresh_from_db()
    assert assignment.active is True


def test_a_duplicate_task_message_is_a_no_op(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer, published: list[int]
) -> None:
    httpserver.expect_request("/hook").respond_with_data("")
    delivery = webhook_delivery(assignment, endpoint)
    assert delivery_attempt(delivery_id=delivery.pk) == "delivered"
    assert delivery_attempt(delivery_id=delivery.pk) is None
    assert len(httpserver.log) == 1
    assert Event.objects.filter(type="delivered").count() == 1


@pytest.mark.django_db(transaction=True)  # the server thread reads the committed row
def test_a_message_arriving_while_another_attempt_holds_the_lease_sends_nothing(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer, published: list[int]
) -> None:
    """Two copies of one task at once: the second finds the row claimed (leased) and stops."""
    seen: list[str | None] = []

    def handler(request: Request) -> Response:
        try:
            seen.append(delivery_attempt(delivery_id=delivery.pk))  # the duplicate, mid-attempt
        finally:
            connection.close()
        return Response("ok")

    httpserver.expect_request("/hook").respond_with_handler(handler)
    delivery = webhook_delivery(assignment, endpoint)
    assert delivery_attempt(delivery_id=delivery.pk) == "delivered"
    assert seen == [None]
    assert len(httpserver.log) == 1


def test_redirects_are_not_followed(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer, published: list[int]
) -> None:
    httpserver.expect_request("/hook").respond_with_data(
        "", status=302, headers={"Location": httpserver.url_for("/elsewhere")}
    )
    httpserver.expect_request("/elsewhere").respond_with_data("")
    delivery = webhook_delivery(assignment, endpoint)
    assert delivery_attempt(delivery_id=delivery.pk) == "retry"
    assert [request.path for request in _requests(httpserver)] == ["/hook"]
    delivery.refresh_from_db()
    assert "redirects are not followed" in delivery.last_error


def another_assignment(assignment: Assignment) -> Assignment:
    """Another lead assigned to the same rep."""
    return AssignmentFactory(rep=assignment.rep, rep_name=assignment.rep_name)


def services_schedule(assignment: Assignment) -> list[Delivery]:
    return deliveries_schedule(assignment=assignment)


def test_the_standardwebhooks_library_verifies_every_attempt(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer, published: list[int]
) -> None:
    """The reference implementation (``standardwebhooks`` on PyPI) accepts what we send."""
    httpserver.expect_oneshot_request("/hook").respond_with_data("", status=502)
    httpserver.expect_request("/hook").respond_with_data("")
    delivery = webhook_delivery(assignment, endpoint)
    delivery_attempt(delivery_id=delivery.pk)
    make_due(delivery)
    assert delivery_attempt(delivery_id=delivery.pk) == "delivered"

    receiver = Webhook(endpoint.secret)
    for request in _requests(httpserver):
        headers = dict(request.headers)
        assert receiver.verify(request.get_data(), headers) == delivery.payload
        with pytest.raises(WebhookVerificationError):
            receiver.verify(request.get_data() + b" ", headers)
        with pytest.raises(WebhookVerificationError):
            Webhook(WebhookEndpoint(name="x", url=endpoint.url).secret).verify(
                request.get_data(), headers
            )


class _Trickler:
    """A receiver that reads the request, then sends ``HTTP/1.1 200 OK`` and its headers one
    byte every 0.1 s: each read gets a byte in time, the answer never ends."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: Any) -> None:
        with conn:
            conn.recv(65536)
            answer = b"HTTP/1.1 200 OK\r\n" + b"X-Padding: " + b"x" * 200 + b"\r\n\r\nok"
            for i in range(len(answer)):
                if self.stop.is_set():
                    return
                try:
                    conn.sendall(answer[i : i + 1])
                except OSError:
                    return
                time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def test_a_receiver_trickling_its_headers_is_cut_at_the_timeout(
    assignment: Assignment, published: list[int], settings: Any, allow_private: None
) -> None:
    """The whole answer, status line and headers included, must arrive within
    DELIVERY_TIMEOUT_SECONDS: on the I/O worker a trickling receiver would hold a thread."""
    settings.DELIVERY_TIMEOUT_SECONDS = 0.5
    trickler = _Trickler()
    try:
        endpoint = WebhookEndpoint(name="Trickler", url=trickler.url)
        endpoint.full_clean()
        endpoint.save()
        delivery = webhook_delivery(assignment, endpoint)
        started = time.monotonic()
        assert delivery_attempt(delivery_id=delivery.pk) == "retry"
        took = time.monotonic() - started
        assert took < 2.0, took
        delivery.refresh_from_db()
        assert delivery.status == DeliveryStatus.PENDING
        assert "timed out" in delivery.last_error
    finally:
        trickler.close()
