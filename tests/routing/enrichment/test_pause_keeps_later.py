"""A pause of the shared budget keeps the later expiry: a worker told a shorter Retry-After does
not shorten the longer pause another worker set (review of issue 17). On Redis (an atomic
script) and in the cache fallback (the same rule)."""

from __future__ import annotations

import uuid

import pytest

from routing.enrichment.ratelimit import CacheWindowLimiter, RedisTokenBucket
from routing.enrichment.store import redis_url


@pytest.mark.redis
def test_a_shorter_pause_does_not_shorten_a_longer_one_on_redis():
    import redis

    url = redis_url()
    assert url is not None
    client = redis.Redis.from_url(url)
    key = f"leadrouter:test-pause:{uuid.uuid4().hex}"
    one = RedisTokenBucket(client, key, rate_per_minute=600, burst=5)
    two = RedisTokenBucket(redis.Redis.from_url(url), key, rate_per_minute=600, burst=5)
    try:
        one.pause(30)
        two.pause(1)  # another worker, a shorter Retry-After
        left = client.pttl(one.pause_key)
        assert 28_000 < left <= 30_000
        grant = two.take()
        assert not grant.granted
        assert grant.wait_seconds > 28
        two.pause(60)  # a longer one still extends it
        assert 58_000 < client.pttl(one.pause_key) <= 60_000
    finally:
        client.delete(one.pause_key, one.bucket_key)


def test_a_shorter_pause_does_not_shorten_a_longer_one_in_the_cache_fallback():
    key = f"leadrouter:test-pause:{uuid.uuid4().hex}"
    one = CacheWindowLimiter(key, rate_per_minute=60)
    two = CacheWindowLimiter(key, rate_per_minute=60)
    one.pause(30)
    two.pause(1)
    grant = two.take()
    assert not grant.granted
    assert grant.wait_seconds > 28
    two.pause(60)
    assert two.take().wait_seconds > 58
