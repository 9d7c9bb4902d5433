"""The realtime share of a vendor's rate limit (REALTIME_RESERVED_SHARE): calls for leads of any
other lane leave it untaken, so a bulk backlog drains the budget down to it and no further, and a
realtime lead's call still finds tokens. Against real Redis (the Lua bucket) and Django's cache
(the window), the two limiters every vendor stage uses."""

from __future__ import annotations

import uuid

import pytest
from django.core.cache import cache
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from leads import lanes
from routing.enrichment.ratelimit import CacheWindowLimiter, RedisTokenBucket, realtime_keep
from routing.enrichment.store import redis_client


def _bucket(burst: int) -> RedisTokenBucket:
    client = redis_client()
    if client is None:
        pytest.skip("needs Redis (REDIS_URL)")
    return RedisTokenBucket(
        client, f"leadrouter:test:{uuid.uuid4().hex}", rate_per_minute=0.001, burst=burst
    )


def test_the_keep_is_the_share_of_the_capacity_and_none_for_realtime(settings) -> None:
    settings.REALTIME_RESERVED_SHARE = 0.2
    window = CacheWindowLimiter("leadrouter:test:keep", rate_per_minute=100)
    assert realtime_keep(window, lanes.REALTIME) == 0
    assert realtime_keep(window, lanes.BULK) == 20
    assert realtime_keep(window, None) == 20  # a batch job (roster, first touch) keeps it too
    settings.REALTIME_RESERVED_SHARE = 0.01
    assert realtime_keep(CacheWindowLimiter("k", rate_per_minute=10), lanes.NORMAL) == 1
    settings.REALTIME_RESERVED_SHARE = 0
    assert realtime_keep(window, lanes.BULK) == 0


@pytest.mark.redis
def test_bulk_drains_the_redis_bucket_down_to_the_share_and_realtime_takes_the_rest(
    settings,
) -> None:
    settings.REALTIME_RESERVED_SHARE = 0.2
    bucket = _bucket(burst=10)
    keep = realtime_keep(bucket, lanes.BULK)
    assert keep == bucket.reserve == 2  # on top of the burst
    granted = sum(bucket.take(keep=keep).granted for _ in range(20))
    assert granted == 10  # the bulk backlog took the burst and stopped at the share
    refused = bucket.take(keep=keep)
    assert not refused.granted
    assert refused.wait_seconds > 0
    assert bucket.take().granted  # a realtime lead's call (keep=0)
    assert bucket.take().granted
    assert not bucket.take().granted  # and then the budget is spent


@pytest.mark.redis
def test_a_keep_larger_than_the_burst_never_locks_bulk_out_of_a_bucket() -> None:
    bucket = _bucket(burst=3)
    assert bucket.take(2, keep=50).granted  # keep is capped at burst + reserve - 1
    assert not bucket.take(2, keep=50).granted


@hsettings(max_examples=60, deadline=None)
@given(
    rate=st.integers(min_value=1, max_value=40),
    keep=st.integers(min_value=0, max_value=60),
    calls=st.lists(st.tuples(st.booleans(), st.integers(min_value=1, max_value=5)), max_size=40),
)
def test_the_cache_window_never_lets_others_into_the_share_nor_goes_over_the_rate(
    rate: int, keep: int, calls: list[tuple[bool, int]]
) -> None:
    cache.clear()
    limiter = CacheWindowLimiter(f"leadrouter:test:{uuid.uuid4().hex}", rate_per_minute=rate)
    key = f"{limiter.key}:window:fixed"  # one window, whatever minute the clock turns to
    limiter._window = lambda: (key, 30.0)  # type: ignore[method-assign]
    used = 0
    for realtime, n in calls:
        want = min(rate, n)
        grant = limiter.take(n, keep=0 if realtime else keep)
        if grant.granted:
            used += want
            if not realtime:
                # An other-lane call never leaves less than the share (capped at rate - want).
                assert rate - used >= min(keep, rate - want)
        assert used <= rate
        assert limiter.available() == rate - used  # refused takes give their tokens back


@pytest.mark.redis
def test_with_a_burst_of_one_bulk_still_cannot_take_the_realtime_share(settings) -> None:
    """The default burst is 1 (60 calls a minute): the share is ceil(1 * 0.2) = 1 token on top
    of the burst, so a bulk backlog hammering the bucket never gets it, and a realtime call
    does (the realtime lane may then exceed the burst by the share)."""
    settings.REALTIME_RESERVED_SHARE = 0.2
    bucket = _bucket(burst=1)
    keep = realtime_keep(bucket, lanes.BULK)
    assert keep == 1
    assert realtime_keep(bucket, lanes.REALTIME) == 0
    assert bucket.take(keep=keep).granted  # the burst itself is bulk's
    assert not any(bucket.take(keep=keep).granted for _ in range(50))
    assert bucket.take(keep=realtime_keep(bucket, lanes.REALTIME)).granted
    assert not bucket.take().granted  # burst + share spent; no refill at this rate


@pytest.mark.redis
def test_bulk_callers_racing_for_a_refilling_bucket_do_not_starve_a_realtime_caller(
    settings,
) -> None:
    """Four bulk threads take as fast as Redis answers from a bucket of burst 1 refilled at
    20/s; a realtime caller that calls every 0.25 s is granted every time, and bulk alone never
    takes more than burst + refill."""
    import threading
    import time

    settings.REALTIME_RESERVED_SHARE = 0.2
    client = redis_client()
    if client is None:
        pytest.skip("needs Redis (REDIS_URL)")
    key = f"leadrouter:test:{uuid.uuid4().hex}"
    bucket = RedisTokenBucket(client, key, rate_per_minute=1200, burst=1)
    keep = realtime_keep(bucket, lanes.BULK)
    stop = threading.Event()
    bulk_granted = [0]
    lock = threading.Lock()

    def bulk() -> None:
        own = RedisTokenBucket(client, key, rate_per_minute=1200, burst=1)
        while not stop.is_set():
            if own.take(keep=keep).granted:
                with lock:
                    bulk_granted[0] += 1

    threads = [threading.Thread(target=bulk) for _ in range(4)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    realtime = []
    try:
        time.sleep(0.25)
        for _ in range(6):
            realtime.append(bucket.take(keep=0).granted)
            time.sleep(0.25)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    elapsed = time.monotonic() - started
    assert realtime == [True] * 6, realtime
    assert bulk_granted[0] > 10  # bulk drained the refill meanwhile
    assert bulk_granted[0] <= 1 + 20 * elapsed + 1
