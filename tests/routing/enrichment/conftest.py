from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.utils import timezone

from config.celery import app as celery_app
from leads import services as lead_services
from leads.models import Lead, LeadStatus
from routing.enrichment import breaker as breaker_module
from routing.enrichment import ratelimit
from routing.enrichment.store import redis_client
from tests.leads.factories import LeadFactory


def _clear_shared_state() -> None:
    cache.clear()
    lead_services.broker_breaker.reset()
    client = redis_client()
    if client is not None:
        for prefix in (ratelimit.KEY_PREFIX, breaker_module.KEY_PREFIX):
            keys = list(client.scan_iter(f"{prefix}*"))
            if keys:
                client.delete(*keys)


@pytest.fixture(autouse=True)
def _fresh_enrichment_state() -> Iterator[None]:
    _clear_shared_state()
    yield
    _clear_shared_state()


class Sent(list[tuple[str, Any, dict[str, Any]]]):
    """Every task published: (name, args, options)."""

    def names(self) -> list[str]:
        return [name for name, _, _ in self]

    def ids(self, name: str) -> list[str]:
        found: list[str] = []
        for sent_name, args, _ in self:
            if sent_name == name:
                found.extend(args[0] if isinstance(args[0], list) else [args[0]])
        return found


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    """Capture publications (enrichment and routing) instead of sending them.

    Through kombu's ``send_task`` even on Redis, not the raw LPUSH of leads.broker_publish
    (tests/leads/test_broker_publish.py checks that one against ``send_task``)."""
    from django.conf import settings

    monkeypatch.setattr(settings, "ENQUEUE_RAW_REDIS", False)
    captured = Sent()

    def fake_send_task(name: str, args: list[Any], **kwargs: Any) -> None:
        assert kwargs.pop("retry") is False
        kwargs.pop("producer", None)
        captured.append((name, args, kwargs))

    @contextlib.contextmanager
    def no_producer(*args: Any, **kwargs: Any) -> Iterator[None]:
        yield None

    monkeypatch.setattr(celery_app, "send_task", fake_send_task)
    monkeypatch.setattr(celery_app, "producer_or_acquire", no_producer)
    return captured


@pytest.fixture
def http(settings: Any, httpserver: Any) -> Any:
    """The HTTP provider pointed at a real local server, with fast test timings."""
    settings.ENRICHMENT_PROVIDERS = ["account", "email", "geo", "http"]
    settings.ENRICHMENT_HTTP_URL = httpserver.url_for("/enrich")
    settings.ENRICHMENT_HTTP_HEADERS = {"Authorization": "Bearer provider-key"}
    settings.ENRICHMENT_HTTP_TIMEOUT_SECONDS = 0.5
    settings.ENRICHMENT_HTTP_RATE_PER_MINUTE = 6000
    settings.ENRICHMENT_HTTP_BURST = 100
    settings.ENRICHMENT_HTTP_MAX_ATTEMPTS = 4
    settings.ENRICHMENT_HTTP_BACKOFF_SECONDS = 2.0
    settings.ENRICHMENT_HTTP_BACKOFF_MAX_SECONDS = 300.0
    settings.ENRICHMENT_HTTP_MAX_WAIT_SECONDS = 900.0
    settings.ENRICHMENT_BREAKER_FAILURES = 3
    settings.ENRICHMENT_BREAKER_COOLDOWN_SECONDS = 60.0
    settings.ENRICHMENT_LEASE_SECONDS = 30
    return httpserver


def parked_lead(**fields: Any) -> Lead:
    """A lead as the pipeline parks it for the HTTP provider (due now)."""
    values: dict[str, Any] = {
        "status": LeadStatus.PROCESSING,
        "claimed_until": None,
        "enrichment_status": "pending",
        "enrichment_next_at": timezone.now() - timedelta(milliseconds=1),
        "email": "ana@acme.com",
        "email_domain": "acme.com",
        "domain": "acme.com",
    }
    values.update(fields)
    lead: Lead = LeadFactory(**values)
    return lead


def make_due(lead: Lead) -> None:
    """Let time pass: its scheduled next try is due now."""
    Lead.objects.filter(id=lead.id).update(
        enrichment_next_at=timezone.now() - timedelta(milliseconds=1)
    )
