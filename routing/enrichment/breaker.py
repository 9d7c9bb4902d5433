"""The HTTP provider's circuit breaker, shared by every worker (unlike ``leads.breaker``).

Closed: calls go through, and consecutive failures (5xx, timeouts, connection errors, unusable
bodies) are counted. After ``threshold`` of them it opens for ``cooldown`` seconds: no call is
made, and leads are routed without the provider. After the cool-down it is half-open: exactly one
worker gets to make a probe call (a key set with NX and a TTL, so a probe that dies with its
worker is retried); a success closes it, a failure opens it for another cool-down. Any success
resets the count. State lives in Redis (Lua scripts, Redis's clock), else Django's cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from django.conf import settings
from django.core.cache import cache

from routing.enrichment.store import redis_client

KEY_PREFIX = "leadrouter:enrichment:http:breaker"
STATE_TTL_SECONDS = 86_400

Verdict = Literal["closed", "probe", "open", "busy"]

_BEFORE_CALL = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local open_until = tonumber(redis.call('GET', KEYS[1]))
if open_until == nil then return {'closed', '0'} end
if now < open_until then return {'open', tostring(open_until - now)} end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then return {'probe', '0'} end
return {'busy', '0'}
"""

_RECORD_FAILURE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local open_until = tonumber(redis.call('GET', KEYS[2]))
local failures = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
if open_until ~= nil and now < open_until then return 'open' end
if open_until ~= nil or failures >= tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], tostring(now + tonumber(ARGV[2])), 'EX', tonumber(ARGV[3]))
  redis.call('DEL', KEYS[3])
  return 'opened'
end
return 'closed'
"""

_RECORD_SUCCESS = """
local was_open = redis.call('EXISTS', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return was_open
"""


@dataclass(frozen=True)
class BreakerCheck:
    """May a call be made? ``closed`` and ``probe`` say yes; ``open`` and ``busy`` no."""

    verdict: Verdict
    open_for_seconds: float = 0.0

    @property
    def allows_call(self) -> bool:
        return self.verdict in ("closed", "probe")


class Breaker(Protocol):
    def before_call(self) -> BreakerCheck: ...

    def record_failure(self) -> str: ...

    def record_success(self) -> bool: ...

    def release_probe(self) -> None: ...


class _Keys:
    def __init__(self, prefix: str) -> None:
        self.failures = f"{prefix}:failures"
        self.open_until = f"{prefix}:open_until"
        self.probe = f"{prefix}:probe"


class RedisBreaker:
    """The breaker's state in Redis; every transition is one atomic script."""

    def __init__(
        self, client: Any, prefix: str, *, threshold: int, cooldown: float, probe_ttl: float
    ) -> None:
        self.client = client
        self.keys = _Keys(prefix)
        self.threshold = max(1, threshold)
        self.cooldown = max(0.001, cooldown)
        self.probe_ttl_ms = max(1, int(probe_ttl * 1000))

    def before_call(self) -> BreakerCheck:
        keys = (self.keys.open_until, self.keys.probe)
        verdict, seconds = self.client.eval(_BEFORE_CALL, 2, *keys, self.probe_ttl_ms)
        return BreakerCheck(verdict=verdict.decode(), open_for_seconds=float(seconds))

    def record_failure(self) -> str:
        keys = (self.keys.failures, self.keys.open_until, self.keys.probe)
        args = (self.threshold, repr(self.cooldown), STATE_TTL_SECONDS)
        return str(self.client.eval(_RECORD_FAILURE, 3, *keys, *args).decode())

    def record_success(self) -> bool:
        """Close the breaker; True when it was open or half-open."""
        keys = (self.keys.failures, self.keys.open_until, self.keys.probe)
        return bool(self.client.eval(_RECORD_SUCCESS, 3, *keys))

    def release_probe(self) -> None:
        self.client.delete(self.keys.probe)


class CacheBreaker:
    """The same states in Django's cache (not atomic across processes; close enough)."""

    def __init__(self, prefix: str, *, threshold: int, cooldown: float, probe_ttl: float) -> None:
        self.keys = _Keys(prefix)
        self.threshold = max(1, threshold)
        self.cooldown = max(0.001, cooldown)
        self.probe_ttl = max(1, round(probe_ttl))

    def before_call(self) -> BreakerCheck:
        open_until = cache.get(self.keys.open_until)
        if open_until is None:
            return BreakerCheck("closed")
        now = time.time()
        if now < open_until:
            return BreakerCheck("open", open_until - now)
        if cache.add(self.keys.probe, 1, timeout=self.probe_ttl):
            return BreakerCheck("probe")
        return BreakerCheck("busy")

    def record_failure(self) -> str:
        now = time.time()
        open_until = cache.get(self.keys.open_until)
        cache.add(self.keys.failures, 0, timeout=STATE_TTL_SECONDS)
        failures = int(cache.incr(self.keys.failures))
        if open_until is not None and now < open_until:
            return "open"
        if open_until is not None or failures >= self.threshold:
            cache.set(self.keys.open_until, now + self.cooldown, timeout=STATE_TTL_SECONDS)
            cache.delete(self.keys.probe)
            return "opened"
        return "closed"

    def record_success(self) -> bool:
        was_open = cache.get(self.keys.open_until) is not None
        cache.delete_many([self.keys.failures, self.keys.open_until, self.keys.probe])
        return was_open

    def release_probe(self) -> None:
        cache.delete(self.keys.probe)


def http_breaker() -> Breaker:
    """The HTTP provider's shared breaker, as configured."""
    threshold = settings.ENRICHMENT_BREAKER_FAILURES
    cooldown = settings.ENRICHMENT_BREAKER_COOLDOWN_SECONDS
    probe_ttl = settings.ENRICHMENT_HTTP_TIMEOUT_SECONDS + 5
    client = redis_client()
    if client is not None:
        return RedisBreaker(
            client, KEY_PREFIX, threshold=threshold, cooldown=cooldown, probe_ttl=probe_ttl
        )
    return CacheBreaker(KEY_PREFIX, threshold=threshold, cooldown=cooldown, probe_ttl=probe_ttl)
