"""A CRM stage takes the tokens for a whole answer at once, or none: when many leads wait for a
short budget, none spends tokens on a first request and then waits for the rest (which, with
enough of them, finishes nothing: every attempt half-done, every token wasted)."""

from __future__ import annotations

import uuid

import pytest
from django.core.cache import cache

from routing.crm.base import CrmError
from routing.crm.limits import spender
from routing.crm.models import CrmConnection
from routing.enrichment.ratelimit import CacheWindowLimiter, RedisTokenBucket
from routing.enrichment.store import redis_client

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_realtime_share(settings):  # type: ignore[no-untyped-def]
    """These count a stage's own reservation; the realtime share has tests of its own
    (tests/routing/enrichment/test_realtime_share.py)."""
    settings.REALTIME_RESERVED_SHARE = 0


def _bucket(burst: int = 3) -> RedisTokenBucket:
    client = redis_client()
    if client is None:
        pytest.skip("needs Redis (REDIS_URL)")
    return RedisTokenBucket(
        client, f"leadrouter:test:{uuid.uuid4().hex}", rate_per_minute=0.001, burst=burst
    )


@pytest.mark.redis
def test_the_redis_bucket_grants_several_tokens_all_or_none():
    bucket = _bucket(burst=3)
    assert bucket.take(2).granted
    refused = bucket.take(2)  # one left: not half of it
    assert not refused.granted
    assert refused.wait_seconds > 0
    assert bucket.available() == 1
    assert bucket.take(1).granted
    assert bucket.available() == 0


@pytest.mark.redis
def test_more_than_the_burst_is_capped_at_the_burst():
    bucket = _bucket(burst=2)
    assert bucket.take(5).granted
    assert bucket.available() == 0


def test_the_cache_window_grants_several_tokens_all_or_none():
    cache.clear()
    limiter = CacheWindowLimiter(f"leadrouter:test:{uuid.uuid4().hex}", rate_per_minute=3)
    assert limiter.take(2).granted
    assert not limiter.take(2).granted
    assert limiter.available() == 1  # the refused take gave its tokens back
    assert limiter.take(1).granted
    assert not limiter.take(1).granted


def _connection(burst: int) -> CrmConnection:
    return CrmConnection.objects.create(
        kind="hubspot", name=f"HubSpot {uuid.uuid4().hex[:6]}", rate_per_minute=1, burst=burst
    )


@pytest.mark.redis
def test_a_stage_reserves_its_requests_at_the_first_one():
    if redis_client() is None:
        pytest.skip("needs Redis (REDIS_URL)")
    connection = _connection(burst=5)
    first = spender(connection, reserve=3)
    first(1)  # takes 3
    first(1)
    first(1)  # the reserved ones
    second = spender(connection, reserve=3)
    with pytest.raises(CrmError) as info:
        second(1)  # 2 left: not enough for a whole lookup, so it takes none
    assert info.value.kind == "rate_limited"
    assert info.value.retry_after
    third = spender(connection, reserve=1)
    third(1)
    third(1)  # the two the second stage did not take are still there
    with pytest.raises(CrmError):
        third(1)
    with pytest.raises(CrmError):
        first(1)  # beyond its reservation it takes from the bucket like anyone


@pytest.mark.redis
def test_many_stages_on_a_short_budget_each_finish_or_wait_before_starting():
    """The starvation this prevents: ten leads, each needing 3 requests, on a budget of 5."""
    if redis_client() is None:
        pytest.skip("needs Redis (REDIS_URL)")
    connection = _connection(burst=5)
    finished = started_unfinished = 0
    for _ in range(10):
        spend = spender(connection, reserve=3)
        done = 0
        try:
            for _ in range(3):
                spend(1)
                done += 1
        except CrmError:
            pass
        if done == 3:
            finished += 1
        elif done:
            started_unfinished += 1
    assert (finished, started_unfinished) == (1, 0)  # 5 tokens: one whole lookup, no half ones


def test_hubspots_default_budget_fits_in_its_search_limit_in_any_second():
    """A token bucket lets the burst plus a second's refill through in one second."""
    from routing.crm.limits import LOOKUP_REQUESTS
    from routing.crm.models import (
        DEFAULT_BURST,
        DEFAULT_RATE_PER_MINUTE,
        HUBSPOT_SEARCHES_PER_SECOND,
    )

    per_second = DEFAULT_BURST["hubspot"] + DEFAULT_RATE_PER_MINUTE["hubspot"] / 60
    assert per_second <= HUBSPOT_SEARCHES_PER_SECOND
    assert DEFAULT_BURST["hubspot"] >= LOOKUP_REQUESTS["hubspot"]  # a lookup reserved whole
