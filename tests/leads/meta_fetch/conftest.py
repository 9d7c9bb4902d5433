"""A Meta Lead Ads source pointed at the Graph stand-in, and fresh shared fetch state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache

from leads import services as lead_services
from leads.models import Source
from routing import decisions
from routing.enrichment.store import redis_client
from routing.fetch.meta import KEY_PREFIX
from tests.leads.factories import SourceFactory
from tests.routing.enrichment.conftest import sent
from tests.routing.factories import RepFactory, published_ruleset, team_with
from tests.support.meta_graph import MetaGraphStandIn, meta_graph

__all__ = ["meta_graph", "sent"]


def _clear() -> None:
    cache.clear()
    lead_services.broker_breaker.reset()
    decisions.clear_live_config_cache()
    client = redis_client()
    if client is not None:
        keys = list(client.scan_iter(f"{KEY_PREFIX}*"))
        if keys:
            client.delete(*keys)


@pytest.fixture(autouse=True)
def _fresh_fetch_state() -> Iterator[None]:
    _clear()
    yield
    _clear()


def notification(*leadgen_ids: str, page_id: str = "230076207144371") -> dict[str, Any]:
    """A Page ``leadgen`` webhook notification naming these leads (Meta's documented shape)."""
    return {
        "object": "page",
        "entry": [
            {
                "id": page_id,
                "time": 1709631912,
                "changes": [
                    {
                        "field": "leadgen",
                        "value": {
                            "leadgen_id": leadgen_id,
                            "page_id": page_id,
                            "form_id": "734509821234567",
                            "ad_id": "23851234567890123",
                            "adgroup_id": "23851234567890456",
                            "created_time": 1709631910,
                        },
                    }
                    for leadgen_id in leadgen_ids
                ],
            }
        ],
    }


@pytest.fixture
def meta_source(meta_graph: MetaGraphStandIn, settings: Any) -> Source:
    """A Meta source with the stand-in's page token, fast test timings, and rules to route by."""
    settings.META_GRAPH_TIMEOUT_SECONDS = 0.5
    settings.META_FETCH_BACKOFF_SECONDS = 0
    settings.META_GRAPH_RATE_PER_MINUTE = 6000
    settings.META_GRAPH_BURST = 100
    team = team_with([RepFactory(email="ana@example.com"), RepFactory(email="ben@example.com")])
    published_ruleset({"name": "Everyone", "action": {"type": "team", "team": team.name}})
    return SourceFactory(
        slug="meta",
        kind="meta_lead_ads",
        kind_options={
            "verify_token": "vt-1",
            "page_access_token": meta_graph.token,
            "graph_base_url": meta_graph.url,
        },
    )
