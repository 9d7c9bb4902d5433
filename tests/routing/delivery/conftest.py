"""Fixtures for delivery: an assignment worth announcing, endpoints on a real local server."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from pytest_httpserver import HTTPServer

from leads.services import broker_breaker
from routing.delivery import services
from routing.delivery.models import Delivery, WebhookEndpoint
from routing.models import Assignment
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, RepFactory


def verify_standard_webhook(
    *, secret: str, headers: dict[str, str], body: bytes, tolerance: int = 300
) -> None:
    """Verify a request the way a Standard Webhooks receiver does, written from the spec.

    Independent of the code under test on purpose: the secret is the base64 after ``whsec_``,
    the signed content is ``{id}.{timestamp}.{body}``, the header holds space-separated
    ``v1,<base64>`` signatures and one must match (constant-time compare).
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id = lowered["webhook-id"]
    timestamp = lowered["webhook-timestamp"]
    assert timestamp.isdigit(), timestamp
    now = int(timezone.now().timestamp())
    assert abs(now - int(timestamp)) <= tolerance, "timestamp outside tolerance"
    key = base64.b64decode(secret.split("_", 1)[1])
    expected = base64.b64encode(
        hmac.new(
            key, msg_id.encode() + b"." + timestamp.encode() + b"." + body, hashlib.sha256
        ).digest()
    ).decode()
    candidates = [s.split(",", 1) for s in lowered["webhook-signature"].split(" ")]
    assert any(
        version == "v1" and hmac.compare_digest(sig, expected) for version, sig in candidates
    ), "no signature matched"


@pytest.fixture(autouse=True)
def _fresh_breaker() -> Iterator[None]:
    broker_breaker.reset()
    yield
    broker_breaker.reset()


@pytest.fixture
def allow_private(settings: Any) -> None:
    """The local test server listens on loopback, which production refuses."""
    settings.DELIVERY_ALLOW_PRIVATE_URLS = True


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Capture ``delivery.deliver`` publications instead of sending them."""
    sent: list[int] = []

    def fake_send_task(name: str, args: list[Any], **kwargs: Any) -> None:
        assert kwargs.get("retry") is False
        assert name == "delivery.deliver"
        sent.append(args[0])

    @contextlib.contextmanager
    def no_producer(*args: Any, **kwargs: Any) -> Iterator[None]:
        yield None

    monkeypatch.setattr(services.celery_app, "send_task", fake_send_task)
    monkeypatch.setattr(services.celery_app, "producer_or_acquire", no_producer)
    return sent


@pytest.fixture
def assignment(db: None) -> Assignment:
    lead = LeadFactory(
        email="ada@acme.com",
        first_name="Ada",
        last_name="Lovelace",
        company="Acme GmbH",
        country="DE",
        employees=250,
        annual_revenue="1250000.50",
    )
    rep = RepFactory(email="rep@example.com", name="Rita Rep")
    return AssignmentFactory(
        lead=lead,
        rep=rep,
        rep_name=rep.name,
        team_name="EMEA SDR",
        rule_name="Germany to EMEA",
        ruleset_version=3,
        reason="rule 'Germany to EMEA' matched: country = DE",
        sla_minutes=30,
        sla_due_at=timezone.now() + timedelta(minutes=30),
    )


@pytest.fixture
def endpoint(db: None, httpserver: HTTPServer, allow_private: None) -> WebhookEndpoint:
    endpoint = WebhookEndpoint(name="CRM", url=httpserver.url_for("/hook"))
    endpoint.full_clean()
    endpoint.save()
    return endpoint


def webhook_delivery(assignment: Assignment, endpoint: WebhookEndpoint) -> Delivery:
    """Schedule for ``assignment`` and return the row for ``endpoint``."""
    rows = services.deliveries_schedule(assignment=assignment, event="lead.assigned")
    return next(row for row in rows if row.endpoint_id == endpoint.pk)


def make_due(delivery: Delivery) -> None:
    """Bring a delivery's retry forward to now (instead of waiting out the backoff)."""
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
