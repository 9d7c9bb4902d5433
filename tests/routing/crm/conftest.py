"""Fresh shared CRM state for every test: rate limits, breakers, caches."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.cache import cache

from leads import services as lead_services
from routing.crm import health
from routing.crm.limits import KEY_PREFIX
from routing.crm.lookup import clear_connection_cache
from routing.enrichment.store import redis_client


def _clear() -> None:
    cache.clear()
    lead_services.broker_breaker.reset()
    health._ok_written.clear()
    clear_connection_cache()
    client = redis_client()
    if client is not None:
        keys = list(client.scan_iter(f"{KEY_PREFIX}*"))
        if keys:
            client.delete(*keys)


@pytest.fixture(autouse=True)
def _fresh_crm_state() -> Iterator[None]:
    _clear()
    yield
    _clear()
