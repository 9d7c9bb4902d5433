"""When to try a failed delivery again: exponential backoff with full jitter, within a deadline.

Pure functions (``now`` and the random source passed in), so the schedule is tested by
property. Full jitter (a uniform draw between zero and the exponential bound) spreads the
retries of many deliveries that failed together, e.g. when a receiver was down.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

MIN_DELAY_SECONDS = 1.0
# The longest Retry-After honoured (a week): past any delivery deadline, inside timedelta's range.
RETRY_AFTER_MAX_SECONDS = 7 * 24 * 3600.0


def backoff_bound(*, attempt: int, base: float, cap: float) -> float:
    """The longest wait after failed attempt number ``attempt`` (1 = the first try)."""
    exponent = min(max(attempt - 1, 0), 60)  # 2**60 * base is past any cap; no overflow
    return max(MIN_DELAY_SECONDS, min(cap, base * (2.0**exponent)))


def backoff_delay(*, attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """A wait drawn uniformly from [MIN_DELAY_SECONDS, backoff_bound]."""
    bound = backoff_bound(attempt=attempt, base=base, cap=cap)
    return rng.uniform(MIN_DELAY_SECONDS, bound)


def next_attempt_at(
    *,
    attempt: int,
    now: datetime,
    give_up_at: datetime,
    base: float,
    cap: float,
    rng: random.Random,
    retry_after: float | None = None,
) -> datetime | None:
    """When to try again after failed attempt ``attempt``, or None to give up.

    ``retry_after`` (a 429's Retry-After, in seconds) replaces the drawn delay when it is
    longer. A retry that would fall past ``give_up_at`` is moved to ``give_up_at`` itself, so
    the last try happens at the deadline; a failure at or after the deadline gives up.
    """
    if now >= give_up_at:
        return None
    delay = backoff_delay(attempt=attempt, base=base, cap=cap, rng=rng)
    if retry_after is not None:
        delay = max(delay, retry_after)
    # Never past the deadline, and never a timedelta out of range (an infinite Retry-After).
    delay = min(delay, (give_up_at - now).total_seconds())
    return now + timedelta(seconds=delay)


def retry_after_seconds(value: str | None, *, now: datetime) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), at most
    ``RETRY_AFTER_MAX_SECONDS``; None if unusable. Never raises: a receiver may send anything."""
    if not value:
        return None
    value = value.strip()
    # isascii: str.isdigit is true of "²" and other digits float() refuses.
    if value.isascii() and value.isdigit():
        return min(float(value), RETRY_AFTER_MAX_SECONDS)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        return None
    return min(max(0.0, (when - now).total_seconds()), RETRY_AFTER_MAX_SECONDS)
