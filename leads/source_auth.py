"""Authenticating a source's request: bearer or URL token, and HMAC body signatures."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

from leads.breaker import CircuitBreaker
from leads.models import Source
from leads.parsing import IntakeError
from leads.redis_wire import RedisWire, RedisWireError

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "HTTP_X_SIGNATURE"


def _unauthorized(message: str) -> IntakeError:
    return IntakeError(401, "unauthorized", message)


def presented_token(request: HttpRequest, source: Source) -> str | None:
    """The token from ``Authorization: Bearer``, else from ``?token=`` where the source allows."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    if source.allow_query_token:
        token = request.GET.get("token")
        if token:
            return token
    return None


def check_token(request: HttpRequest, source: Source, *, now: datetime) -> None:
    """Raise 401 unless the source does not need a token or a valid one was presented."""
    if not source.requires_token:
        return
    token = presented_token(request, source)
    if token is None:
        raise _unauthorized("Missing source token (Authorization: Bearer <token>).")
    if not source.token_matches(token, now=now):
        raise _unauthorized("Invalid source token.")


_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def signature_candidates(header: str) -> list[str]:
    """Hex digests in ``sha256=<hex>`` items; several may be sent during secret rotation.

    Anything that is not 64 hex digits is dropped here (compare_digest refuses non-ASCII str).
    """
    found = []
    for item in header.replace(",", " ").split()[:10]:
        scheme, _, digest = item.partition("=")
        digest = digest.strip().lower()
        if scheme.lower() == "sha256" and _HEX_DIGEST.fullmatch(digest):
            found.append(digest)
    return found


def check_signature(request: HttpRequest, source: Source, body: bytes, *, now: datetime) -> None:
    """Raise 401 unless the body carries a valid HMAC-SHA256 signature, where one is required."""
    if not source.requires_signature:
        return
    candidates = signature_candidates(request.META.get(SIGNATURE_HEADER, ""))
    if not candidates:
        raise _unauthorized("Missing body signature (X-Signature: sha256=<hex>).")
    secrets = source.signing_secrets(now=now)
    valid = False
    for secret in secrets:
        expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        for candidate in candidates:
            # Every comparison runs, so timing does not reveal which one matched.
            valid = hmac.compare_digest(expected, candidate) or valid
    if not valid:
        raise _unauthorized("Invalid body signature.")


_COUNT_SCRIPT = """
local count = redis.call('INCRBY', KEYS[1], ARGV[1])
if count == tonumber(ARGV[1]) then redis.call('EXPIRE', KEYS[1], 120) end
return count
"""
_COUNT_SHA = hashlib.sha1(_COUNT_SCRIPT.encode()).hexdigest()  # noqa: S324 (Redis's script id)
_redis_client: RedisWire | None = None
cache_breaker = CircuitBreaker()
_redis_lock = threading.Lock()


def _cache_url() -> str | None:
    """The Redis URL of the cache, when the cache is Redis; else None."""
    backend = settings.CACHES["default"]["BACKEND"]
    if not backend.endswith("RedisCache"):
        return None
    location = settings.CACHES["default"]["LOCATION"]
    return str(location[0] if isinstance(location, list) else location)


def _redis() -> RedisWire | None:
    """One connection per process for the rate limit (redis-py's, used directly:
    leads.redis_wire), when the cache is Redis; else None.

    Django's Redis cache builds a new client object on every call and needs two round trips
    (add, incr); the kickoff pays this on every request, so it counts with one INCRBY +
    EXPIRE script instead, by its SHA (one EVAL when Redis does not know it yet).
    """
    global _redis_client
    url = _cache_url()
    if url is None:
        return None
    if _redis_client is None:
        with _redis_lock:
            if _redis_client is None:
                _redis_client = RedisWire(url, socket_timeout=0.5, connect_timeout=0.5)
    return _redis_client


def _count(key: str, records: int) -> int:
    client = _redis()
    if client is None:
        cache.add(key, 0, timeout=120)
        return int(cache.incr(key, records))
    [reply] = client.execute([("EVALSHA", _COUNT_SHA, 1, key, records)])
    if isinstance(reply, RedisWireError) and str(reply).startswith("NOSCRIPT"):
        [reply] = client.execute([("EVAL", _COUNT_SCRIPT, 1, key, records)])
    if not isinstance(reply, int):
        raise RedisWireError(f"the count script answered {reply!r}")
    return reply


def check_rate_limit(source: Source, *, now: datetime, records: int = 1) -> None:
    """Raise 429 when the source is over its per-minute limit (counted in records).

    A fixed one-minute window in the shared cache (Redis in production). If the cache itself
    fails, the lead is let through: a throttle must never be the reason a lead is lost.
    """
    epoch = int(now.timestamp())
    key = f"leadrouter:intake-rate:{source.pk}:{epoch // 60}"
    if not cache_breaker.allows():
        return
    try:
        count = _count(key, records)
    except Exception as exc:  # the throttle fails open; the outage is logged once per trip
        cache_breaker.trip(settings.BROKER_BREAKER_SECONDS)
        logger.error(
            "rate-limit cache unavailable (%s: %s); not throttling for %.0f s",
            type(exc).__name__,
            exc,
            settings.BROKER_BREAKER_SECONDS,
        )
        return
    if count > source.rate_limit_per_minute:
        retry_after = 60 - epoch % 60
        raise IntakeError(
            429,
            "rate_limited",
            f"Source {source.slug!r} is over its limit of {source.rate_limit_per_minute} "
            "leads per minute.",
            headers={"Retry-After": str(retry_after)},
        )
