"""The rate limit and the breaker are global: several processes share one budget and one state."""

from __future__ import annotations

import multiprocessing
import time
import uuid

import pytest

from routing.enrichment.breaker import RedisBreaker
from routing.enrichment.ratelimit import RedisTokenBucket
from routing.enrichment.store import redis_url

pytestmark = [pytest.mark.redis, pytest.mark.slow]

RATE_PER_MINUTE = 600  # 10 a second
BURST = 5
SECONDS = 3.0
PROCESSES = 4


def _take_tokens(url: str, key: str, start_at: float, out: multiprocessing.Queue) -> None:
    import redis

    bucket = RedisTokenBucket(
        redis.Redis.from_url(url), key, rate_per_minute=RATE_PER_MINUTE, burst=BURST
    )
    while time.time() < start_at:
        time.sleep(0.001)
    granted: list[float] = []
    while time.time() < start_at + SECONDS:
        if bucket.take().granted:
            granted.append(time.time())
        else:
            time.sleep(0.002)
    out.put(granted)


def test_the_token_bucket_holds_across_processes():
    url = redis_url()
    assert url is not None
    key = f"leadrouter:test-bucket:{uuid.uuid4().hex}"
    context = multiprocessing.get_context("fork")  # the children inherit Django, set up
    out: multiprocessing.Queue = context.Queue()
    start_at = time.time() + 1.0  # after every child has started
    children = [
        context.Process(target=_take_tokens, args=(url, key, start_at, out))
        for _ in range(PROCESSES)
    ]
    for child in children:
        child.start()
    per_process = [out.get(timeout=60) for _ in children]
    for child in children:
        child.join(10)
    grants = sorted(t for granted in per_process for t in granted)
    per_second = RATE_PER_MINUTE / 60
    # Whole run: the burst plus the refill, never more; and the budget is actually used.
    assert len(grants) <= BURST + per_second * SECONDS + 1
    assert len(grants) >= per_second * SECONDS - 2
    # Every one-second window: at most the burst plus one second's refill (+1 for the edges).
    for i, first in enumerate(grants):
        in_window = sum(1 for t in grants[i:] if t < first + 1.0)
        assert in_window <= BURST + per_second + 1, (in_window, i)
    # Several processes really competed for it (a per-process limit would give each its own).
    assert sum(1 for granted in per_process if granted) >= 2


def test_a_breaker_opened_by_one_worker_is_open_for_all_and_one_probe_at_a_time():
    import redis

    url = redis_url()
    assert url is not None
    prefix = f"leadrouter:test-breaker:{uuid.uuid4().hex}"
    workers = [
        RedisBreaker(redis.Redis.from_url(url), prefix, threshold=3, cooldown=0.5, probe_ttl=5)
        for _ in range(2)
    ]
    first, second = workers
    assert [first.record_failure() for _ in range(2)] == ["closed", "closed"]
    assert second.record_failure() == "opened"  # consecutive failures count across workers
    assert first.before_call().verdict == "open"
    time.sleep(0.6)
    assert first.before_call().verdict == "probe"
    assert second.before_call().verdict == "busy"  # one probe at a time
    assert second.record_success() is True
    assert first.before_call().verdict == "closed"
    assert second.before_call().verdict == "closed"
