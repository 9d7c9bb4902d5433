from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache

from leads import services
from tests.leads.factories import SourceFactory


@pytest.fixture(autouse=True)
def _fresh_rate_limits_and_breaker() -> None:
    cache.clear()
    services.broker_breaker.reset()


@pytest.fixture
def source(db):  # type: ignore[no-untyped-def]
    return SourceFactory(slug="webform", field_map={"Org": "company"})


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Capture task publications instead of sending them (for tests about the kickoff only)."""
    sent: list[str] = []

    def fake_send_task(name: str, args: list[Any], **kwargs: Any) -> None:
        assert name == "routing.process_lead"
        sent.append(args[0])

    monkeypatch.setattr(services.celery_app, "send_task", fake_send_task)
    return sent


def auth(source_slug: str = "webform") -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer token-{source_slug}"}
