"""The HTTP provider's global rate limit: one budget per minute shared by every worker.

Celery's own ``rate_limit`` is per worker process, so it cannot honour a vendor's quota. With
Redis the budget is a token bucket kept by a Lua script (one round trip, atomic, Redis's own
clock so worker clocks do not matter): ``burst`` tokens at most, refilled at ``rate_per_minute``.
In any interval of T seconds at most ``burst + rate_per_minute * T / 60`` tokens are handed out.
Without Redis it is a fixed one-minute window counted in Django's cache (at most
``rate_per_minute`` per calendar minute; shared only if the cache is).

A share of the budget is kept for realtime leads (leads.lanes): a take with ``keep=k`` (what
every other lead's call passes, the limiter's ``reserve``) is granted only if ``k`` tokens are
left after it, so a bulk backlog drains the budget down to those ``k`` and no further; a realtime
call (``keep=0``) may take them. Bulk still gets the whole refill whenever no realtime lead is
calling. On Redis the reserve, ``REALTIME_RESERVED_SHARE`` of the burst rounded up, sits on top
of the burst (the bucket holds ``burst + reserve``): with the default burst of 1 a share inside
the burst would be nothing. So other lanes get at most ``burst + rate * T / 60`` tokens in T
seconds, as configured, and realtime calls may take up to ``reserve`` more than that (the
realtime lane may exceed the configured burst by the share). The cache window keeps its share
inside the minute's budget (a window of one call a minute keeps none).

A 429 from the provider pauses the whole budget for its Retry-After (``pause``), so every worker
backs off, not only the one that was told; a shorter Retry-After never shortens a longer pause
already running (the later expiry is kept).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings
from django.core.cache import cache

from leads.lanes import REALTIME
from routing.enrichment.store import redis_client

KEY_PREFIX = "leadrouter:enrichment:http"

# The refill both scripts start with: Redis's clock, the pause, then the tokens as of now.
_REFILL = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local paused = redis.call('PTTL', KEYS[2])
if paused > 0 then return {0, tostring(paused / 1000), '0'} end
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate)
  ts = now
end
"""

_BUCKET_SCRIPT = (
    _REFILL
    + """
if ARGV[3] == '0' then return {0, '0', tostring(tokens)} end
local keep = math.max(0, math.min(tonumber(ARGV[5] or '0'), burst - 1))
local want = math.min(burst - keep, math.max(1, tonumber(ARGV[4] or '1')))
local granted = 0
local wait = 0
if tokens - keep >= want then
  tokens = tokens - want
  granted = 1
else
  wait = (want + keep - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(ts))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return {granted, tostring(wait), tostring(tokens)}
"""
)

# Up to ARGV[4] tokens for realtime calls (down to 0), then up to ARGV[5] for the others (down
# to ``keep``, ARGV[6]); whole tokens only, so the bucket never goes below what it may.
_BATCH_SCRIPT = (
    _REFILL
    + """
local want_rt = math.max(0, tonumber(ARGV[4]))
local want_other = math.max(0, tonumber(ARGV[5]))
local keep = math.max(0, math.min(tonumber(ARGV[6]), burst - 1))
local rt = math.min(want_rt, math.max(0, math.floor(tokens)))
tokens = tokens - rt
local other = math.min(want_other, math.max(0, math.floor(tokens - keep)))
tokens = tokens - other
local wait = 0
if other < want_other then
  wait = math.max(0, (1 + keep - tokens) / rate)
elseif rt < want_rt then
  wait = math.max(0, (1 - tokens) / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(ts))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return {rt, other, tostring(wait)}
"""
)

# A pause keeps the later expiry: a worker told a shorter Retry-After must not cut short the
# longer pause another worker was told (PTTL is -2 without the key).
_PAUSE_SCRIPT = """
local want = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < want then
  redis.call('SET', KEYS[1], '1', 'PX', want)
  return 1
end
return 0
"""


@dataclass(frozen=True)
class Grant:
    """The answer to a token request: granted, else how long until one frees up."""

    granted: bool
    wait_seconds: float = 0.0


@dataclass(frozen=True)
class BatchGrant:
    """The answer to a batch's request: how many realtime and other calls may go now, and
    how long until the next token frees up when not all of them may."""

    realtime: int
    other: int
    wait_seconds: float = 0.0


class RateLimiter(Protocol):
    def take(self, n: int = 1, *, keep: int = 0) -> Grant: ...

    def take_batch(self, *, realtime: int, other: int, keep: int) -> BatchGrant: ...

    @property
    def capacity(self) -> int: ...

    @property
    def reserve(self) -> int: ...

    def available(self) -> int: ...

    def pause(self, seconds: float) -> None: ...


class RedisTokenBucket:
    """A token bucket in Redis shared by every process that uses the same ``key``."""

    def __init__(
        self,
        client: Any,
        key: str,
        *,
        rate_per_minute: float,
        burst: int,
        reserve: int | None = None,
    ) -> None:
        self.client = client
        self.bucket_key = f"{key}:bucket"
        self.pause_key = f"{key}:pause"
        self.rate_per_second = max(float(rate_per_minute), 1e-6) / 60.0
        self.burst = max(1, int(burst))
        # On top of the burst (see the module's words); by default REALTIME_RESERVED_SHARE.
        self.reserve = realtime_reserve(self.burst) if reserve is None else max(0, int(reserve))

    @property
    def capacity(self) -> int:
        """The configured burst (what the reserved share is a share of)."""
        return self.burst

    def _run(self, take: bool, n: int = 1, keep: int = 0) -> tuple[int, float, float]:
        granted, wait, tokens = self.client.eval(
            _BUCKET_SCRIPT,
            2,
            self.bucket_key,
            self.pause_key,
            repr(self.rate_per_second),
            self.burst + self.reserve,
            "1" if take else "0",
            str(max(1, int(n))),
            str(max(0, int(keep))),
        )
        return int(granted), float(wait), float(tokens)

    def take(self, n: int = 1, *, keep: int = 0) -> Grant:
        """``n`` tokens at once or none (``n`` is capped at what the caller could ever get:
        ``burst + reserve - keep``): a caller that needs several requests for one answer never
        gets half of them and wastes them while it waits for the rest. ``keep``: granted only
        if that many tokens are left after it (the realtime share, ``reserve``; at most
        ``burst + reserve - 1``, so every caller can get one)."""
        granted, wait, _ = self._run(take=True, n=n, keep=keep)
        return Grant(granted=bool(granted), wait_seconds=wait)

    def take_batch(self, *, realtime: int, other: int, keep: int) -> BatchGrant:
        """As many tokens as are free, in one round trip: up to ``realtime`` for realtime calls
        (which may take the reserve), then up to ``other`` for the rest, leaving ``keep``.
        Unlike ``take`` it grants part of what was asked: each token is one call of its own."""
        if realtime <= 0 and other <= 0:
            return BatchGrant(0, 0)
        rt, rest, wait = self.client.eval(
            _BATCH_SCRIPT,
            2,
            self.bucket_key,
            self.pause_key,
            repr(self.rate_per_second),
            self.burst + self.reserve,
            "1",
            str(max(0, int(realtime))),
            str(max(0, int(other))),
            str(max(0, int(keep))),
        )
        if isinstance(rest, bytes):  # paused: the refill answered {0, seconds, '0'}
            return BatchGrant(0, 0, float(rest))
        return BatchGrant(int(rt), int(rest), float(wait))

    def available(self) -> int:
        """Tokens any lane could take right now, the realtime reserve left out (0 while
        paused); takes none."""
        _, wait, tokens = self._run(take=False)
        return 0 if wait > 0 else max(0, math.floor(tokens) - self.reserve)

    def pause(self, seconds: float) -> None:
        """Pause every taker for ``seconds``, unless a longer pause is already running."""
        self.client.eval(_PAUSE_SCRIPT, 1, self.pause_key, max(1, int(seconds * 1000)))


class CacheWindowLimiter:
    """A fixed one-minute window counted with ``cache.add`` + ``cache.incr`` (no Redis)."""

    def __init__(self, key: str, *, rate_per_minute: int) -> None:
        self.key = key
        self.rate_per_minute = max(1, int(rate_per_minute))

    def _window(self) -> tuple[str, float]:
        now = time.time()
        return f"{self.key}:window:{int(now // 60)}", 60 - now % 60

    def _paused_for(self) -> float:
        until = cache.get(f"{self.key}:pause")
        return max(0.0, float(until) - time.time()) if until else 0.0

    @property
    def capacity(self) -> int:
        return self.rate_per_minute

    @property
    def reserve(self) -> int:
        """The calls of each minute's budget other lanes leave to realtime leads."""
        return realtime_reserve(self.rate_per_minute)

    def take(self, n: int = 1, *, keep: int = 0) -> Grant:
        paused = self._paused_for()
        if paused > 0:
            return Grant(granted=False, wait_seconds=paused)
        want = min(self.rate_per_minute, max(1, int(n)))
        keep = max(0, min(int(keep), self.rate_per_minute - want))
        key, left = self._window()
        cache.add(key, 0, timeout=120)
        if int(cache.incr(key, want)) <= self.rate_per_minute - keep:
            return Grant(granted=True)
        cache.decr(key, want)  # all or nothing: give back what this call could not use
        return Grant(granted=False, wait_seconds=left)

    def take_batch(self, *, realtime: int, other: int, keep: int) -> BatchGrant:
        """As on Redis: realtime first (down to 0), then the others (down to ``keep``); one
        ``incr`` for all, then what could not be granted is given back (meanwhile another taker
        may be refused for it, never granted too much)."""
        realtime, other = max(0, int(realtime)), max(0, int(other))
        if not realtime and not other:
            return BatchGrant(0, 0)
        paused = self._paused_for()
        if paused > 0:
            return BatchGrant(0, 0, paused)
        keep = max(0, min(int(keep), self.rate_per_minute - 1))
        key, left = self._window()
        cache.add(key, 0, timeout=120)
        before = int(cache.incr(key, realtime + other)) - realtime - other
        rt = min(realtime, max(0, self.rate_per_minute - before))
        rest = min(other, max(0, self.rate_per_minute - keep - before - rt))
        if rt + rest < realtime + other:
            cache.decr(key, realtime + other - rt - rest)
            return BatchGrant(rt, rest, left)
        return BatchGrant(rt, rest)

    def available(self) -> int:
        if self._paused_for() > 0:
            return 0
        key, _ = self._window()
        return max(0, self.rate_per_minute - int(cache.get(key) or 0))

    def pause(self, seconds: float) -> None:
        """As on Redis, the later expiry is kept (a read then a write: the cache has no
        compare-and-set, so two pauses at the same instant may still race)."""
        until = time.time() + seconds
        key = f"{self.key}:pause"
        if cache.add(key, until, timeout=max(1, math.ceil(seconds))):
            return
        current = cache.get(key)
        if current is None or float(current) < until:
            cache.set(key, until, timeout=max(1, math.ceil(seconds)))


def realtime_reserve(capacity: int) -> int:
    """``REALTIME_RESERVED_SHARE`` of ``capacity``, rounded up (any share above 0 keeps one)."""
    share = min(max(float(settings.REALTIME_RESERVED_SHARE), 0.0), 1.0)
    return math.ceil(capacity * share) if share > 0 else 0


def realtime_keep(limiter: RateLimiter, lane: str | None) -> int:
    """The tokens a call for a lead in ``lane`` must leave for realtime leads' calls: none for a
    realtime lead, else the limiter's ``reserve``."""
    return 0 if lane == REALTIME else limiter.reserve


def http_rate_limiter() -> RateLimiter:
    """The HTTP provider's shared limiter, as configured (Redis bucket, else cache window)."""
    client = redis_client()
    rate = settings.ENRICHMENT_HTTP_RATE_PER_MINUTE
    if client is not None:
        return RedisTokenBucket(
            client, KEY_PREFIX, rate_per_minute=rate, burst=settings.ENRICHMENT_HTTP_BURST
        )
    return CacheWindowLimiter(KEY_PREFIX, rate_per_minute=rate)
