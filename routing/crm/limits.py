"""Each CRM connection's pace and health, shared by every worker: a rate limit and a breaker.

The same token bucket and breaker as HTTP enrichment (``routing.enrichment.ratelimit`` and
``.breaker``, state in Redis, else Django's cache), keyed per connection, so every stage that
calls one CRM (lookup, write-back, first touch, roster) spends from one budget: the vendor's
documented limit holds however many workers call it. ``spender(connection)`` is the ``spend``
callback the CRM modules call before each request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings

from routing.crm.base import HUBSPOT, SALESFORCE, CrmError
from routing.crm.models import CrmConnection
from routing.enrichment.breaker import Breaker, CacheBreaker, RedisBreaker
from routing.enrichment.ratelimit import (
    CacheWindowLimiter,
    Grant,
    RateLimiter,
    RedisTokenBucket,
    realtime_keep,
)
from routing.enrichment.store import redis_client

logger = logging.getLogger(__name__)

KEY_PREFIX = "leadrouter:crm"

# The requests one lead's stage makes at most, reserved at its first request (``spender``):
# a lookup is the person and the company (Salesforce: Contact, then Lead, then Account); a
# write-back finds the person (Salesforce: two queries) and creates or updates it.
LOOKUP_REQUESTS = {HUBSPOT: 2, SALESFORCE: 3}
WRITE_REQUESTS = {HUBSPOT: 2, SALESFORCE: 3}
# The requests one write-back can make on its longest path (what it holds its delivery for):
# HubSpot: search, create refused 409 by an unsearchable duplicate, read it, update; Salesforce:
# Contact and Lead searches, a create or upsert refused by a duplicate rule, the matched record
# read, a Lead converted meanwhile (refused PATCH, re-read, its Contact read), the PATCH.
WRITE_REQUESTS_LONGEST = {HUBSPOT: 4, SALESFORCE: 8}


def writeback_lease_seconds() -> float:
    """How long one write-back attempt holds its delivery: every request of its longest path
    (``WRITE_REQUESTS_LONGEST``, plus a token request, a refresh and the retried call) at
    ``CRM_CALL_DEADLINE_SECONDS`` each, so a slow send is never taken over and sent twice."""
    return (max(WRITE_REQUESTS_LONGEST.values()) + 3) * float(settings.CRM_CALL_DEADLINE_SECONDS)


def _prefix(connection: CrmConnection) -> str:
    return f"{KEY_PREFIX}:{connection.kind}:{connection.pk}"


def crm_rate_limiter(connection: CrmConnection) -> RateLimiter:
    """The connection's shared request budget (Redis token bucket, else a cache window)."""
    client = redis_client()
    rate = connection.effective_rate_per_minute
    if client is not None:
        return RedisTokenBucket(
            client, _prefix(connection), rate_per_minute=rate, burst=connection.effective_burst
        )
    return CacheWindowLimiter(_prefix(connection), rate_per_minute=rate)


def crm_breaker(connection: CrmConnection) -> Breaker:
    """The connection's shared circuit breaker."""
    prefix = f"{_prefix(connection)}:breaker"
    threshold = settings.CRM_BREAKER_FAILURES
    cooldown = settings.CRM_BREAKER_COOLDOWN_SECONDS
    probe_ttl = settings.CRM_TIMEOUT_SECONDS * 3 + 5
    client = redis_client()
    if client is not None:
        return RedisBreaker(
            client, prefix, threshold=threshold, cooldown=cooldown, probe_ttl=probe_ttl
        )
    return CacheBreaker(prefix, threshold=threshold, cooldown=cooldown, probe_ttl=probe_ttl)


def spender(
    connection: CrmConnection,
    *,
    wait_seconds: float = 0.0,
    reserve: int = 1,
    lane: str | None = None,
) -> Callable[[int], None]:
    """``spend(n)``: take ``n`` tokens from the connection's budget, or raise rate_limited.

    ``wait_seconds``: a batch job (roster, first touch) may sleep that long in all for tokens
    instead of giving up at once; a lead's stage never waits in a worker (it is rescheduled).
    ``reserve``: a stage that makes several requests for one answer (a lookup: the person and
    the company) takes that many tokens at its first request, all or none (capped at the
    burst), and spends them on the requests that follow; so when the budget is short, a lead
    waits before its first request instead of half-way, and no request is wasted on an answer
    that cannot be finished. Tokens a stage reserved and did not need are not given back.
    Without a usable shared store nothing is sent: the vendor's quota is not ours to risk.
    ``lane``: the lead's (leads.lanes); anything but realtime (a bulk lead, a batch job) leaves
    ``REALTIME_RESERVED_SHARE`` of the budget to realtime leads (``realtime_keep``).
    """
    limiter = crm_rate_limiter(connection)
    keep = realtime_keep(limiter, lane)
    budget = [max(0.0, wait_seconds)]
    prepaid = [0]
    first = [True]

    def take(n: int) -> Grant:
        while True:
            grant = limiter.take(n, keep=keep)
            if grant.granted or grant.wait_seconds > budget[0]:
                return grant
            pause = max(0.01, grant.wait_seconds)
            budget[0] -= pause
            time.sleep(pause)

    def take_or_raise(n: int) -> None:
        try:
            grant = take(n)
        except Exception as exc:
            logger.error("CRM rate limit unavailable (%s: %s)", type(exc).__name__, exc)
            raise CrmError(
                "rate_limited",
                "the shared rate limit's store is unavailable",
                retry_after=settings.ENRICHMENT_STORE_DOWN_RETRY_SECONDS,
            ) from exc
        if not grant.granted:
            raise CrmError(
                "rate_limited",
                "waiting for the connection's rate limit",
                retry_after=grant.wait_seconds,
            )

    def spend(n: int = 1) -> None:
        n = max(1, n)
        if first[0]:
            want = min(max(n, reserve), connection.effective_burst)
            take_or_raise(want)
            first[0] = False
            prepaid[0] = want - n
            if prepaid[0] >= 0:
                return
            n, prepaid[0] = -prepaid[0], 0
        use = min(prepaid[0], n)
        prepaid[0] -= use
        for _ in range(n - use):
            take_or_raise(1)

    return spend


def crm_pause(connection: CrmConnection, seconds: float) -> None:
    """The vendor said 429 (or its daily limit): every worker waits ``seconds``."""
    try:
        crm_rate_limiter(connection).pause(seconds)
    except Exception as exc:
        logger.error("CRM rate limit pause failed (%s: %s)", type(exc).__name__, exc)
