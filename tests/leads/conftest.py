from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache

from leads import services, source_auth
from tests.leads.factories import SourceFactory


@pytest.fixture(autouse=True)
def _fresh_rate_limits_and_breaker() -> None:
    cache.clear()
    services.broker_breaker.reset()
    source_auth.cache_breaker.reset()


@pytest.fixture
def source(db):  # type: ignore[no-untyped-def]
    return SourceFactory(slug="webform", field_map={"Org": "company"})


class Published(list[str]):
    """Lead ids published, in order; ``messages`` lists the task name of each message, ``queues``
    the queue each lead id was sent to (by id)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self.queues: dict[str, str] = {}


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> Published:
    """Capture task publications instead of sending them (for tests about the kickoff only).

    Through kombu's ``send_task`` even on Redis (not the raw LPUSH of leads.broker_publish,
    which tests/leads/test_broker_publish.py checks against it)."""
    from django.conf import settings

    monkeypatch.setattr(settings, "ENQUEUE_RAW_REDIS", False)
    sent = Published()
    messages = sent.messages

    def fake_send_task(name: str, args: list[Any], **kwargs: Any) -> None:
        assert kwargs.get("retry") is False  # a kickoff never waits on publish retries
        if name == "routing.process_lead":
            ids = [args[0]]
        else:
            assert name == "routing.process_leads"
            assert 1 < len(args[0]) <= 100
            ids = list(args[0])
        sent.extend(ids)
        sent.queues.update(dict.fromkeys(ids, kwargs.get("queue", "")))
        messages.append(name)

    monkeypatch.setattr(services.celery_app, "send_task", fake_send_task)
    monkeypatch.setattr(services.celery_app, "producer_or_acquire", _no_producer)
    return sent


@contextlib.contextmanager
def _no_producer(*args: Any, **kwargs: Any) -> Iterator[None]:
    yield None


def auth(source_slug: str = "webform") -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer token-{source_slug}"}
