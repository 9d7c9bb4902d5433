"""The delivery admin: endpoints with their secret, read-only deliveries with attempts, retry."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from pytest_httpserver import HTTPServer

from routing.delivery.models import Delivery, DeliveryStatus, WebhookEndpoint
from routing.delivery.services import delivery_attempt
from routing.models import Assignment
from tests.routing.delivery.conftest import verify_standard_webhook, webhook_delivery

pytestmark = pytest.mark.django_db


def test_endpoint_pages_show_the_secret_and_refuse_a_private_url(
    admin_client: Client, endpoint: WebhookEndpoint, settings: Any
) -> None:
    page = admin_client.get(reverse("admin:routing_webhookendpoint_change", args=[endpoint.pk]))
    assert page.status_code == 200
    assert endpoint.secret in page.content.decode()
    listing = admin_client.get(reverse("admin:routing_webhookendpoint_changelist"))
    assert endpoint.secret not in listing.content.decode()  # masked in the list

    settings.DELIVERY_ALLOW_PRIVATE_URLS = False
    response = admin_client.post(
        reverse("admin:routing_webhookendpoint_add"),
        {"name": "Metadata", "url": "http://169.254.169.254/", "events": ["lead.assigned"]},
    )
    assert response.status_code == 200  # the form again, with the error
    assert "link-local" in response.content.decode()
    assert not WebhookEndpoint.objects.filter(name="Metadata").exists()


def test_a_delivery_page_lists_its_attempts_and_failed_ones_can_be_retried(
    admin_client: Client,
    assignment: Assignment,
    endpoint: WebhookEndpoint,
    httpserver: HTTPServer,
    published: list[int],
) -> None:
    httpserver.expect_request("/hook").respond_with_data("nope", status=500)
    delivery = webhook_delivery(assignment, endpoint)
    Delivery.objects.filter(pk=delivery.pk).update(give_up_at=timezone.now())
    assert delivery_attempt(delivery_id=delivery.pk) == "failed"

    listing = admin_client.get(
        reverse("admin:routing_delivery_changelist"), {"status__exact": "failed"}
    )
    assert delivery.message_id in listing.content.decode()
    page = admin_client.get(reverse("admin:routing_delivery_change", args=[delivery.pk]))
    assert page.status_code == 200
    assert "nope" in page.content.decode()  # the attempt's response excerpt
    assert admin_client.get(reverse("admin:routing_delivery_add")).status_code == 403

    response = admin_client.post(
        reverse("admin:routing_delivery_changelist"),
        {"action": "retry_now", "_selected_action": [delivery.pk]},
        follow=True,
    )
    assert "1 delivery(ies) queued" in response.content.decode()
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.PENDING


def test_a_delivery_to_an_endpoint_disabled_meanwhile_is_cancelled_unsent(
    assignment: Assignment, endpoint: WebhookEndpoint, httpserver: HTTPServer, published: list[int]
) -> None:
    delivery = webhook_delivery(assignment, endpoint)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(active=False)
    assert delivery_attempt(delivery_id=delivery.pk) == "cancelled"
    assert httpserver.log == []
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.CANCELLED


def test_send_test_posts_a_signed_test_message(
    admin_client: Client, endpoint: WebhookEndpoint, httpserver: HTTPServer
) -> None:
    httpserver.expect_request("/hook").respond_with_data("hello")
    response = admin_client.post(
        reverse("admin:routing_webhookendpoint_changelist"),
        {"action": "send_test", "_selected_action": [endpoint.pk]},
        follow=True,
    )
    assert "CRM: HTTP 200 hello" in response.content.decode()
    ((request, _),) = httpserver.log
    assert json.loads(request.get_data())["type"] == "test"
    verify_standard_webhook(
        secret=endpoint.secret, headers=dict(request.headers), body=request.get_data()
    )
    assert not Delivery.objects.exists()


def test_endpoint_changes_and_test_sends_are_audited_without_the_secret(
    admin_client: Client, endpoint: WebhookEndpoint, httpserver: HTTPServer
) -> None:
    from audit.models import Event, EventType

    httpserver.expect_request("/hook").respond_with_data("ok")
    admin_client.post(
        reverse("admin:routing_webhookendpoint_change", args=[endpoint.pk]),
        {"name": "CRM 2", "url": endpoint.url, "active": "on", "events": ["lead.assigned"]},
    )
    admin_client.post(
        reverse("admin:routing_webhookendpoint_changelist"),
        {"action": "send_test", "_selected_action": [endpoint.pk]},
    )
    events = {
        e.data["action"]: e
        for e in Event.objects.filter(type=EventType.CONFIG_CHANGED, actor="user:admin")
    }
    assert events["changed"].data["changes"]["name"] == {"before": "CRM", "after": "CRM 2"}
    assert "send_test" in events
    assert endpoint.secret not in str([e.data for e in events.values()])
