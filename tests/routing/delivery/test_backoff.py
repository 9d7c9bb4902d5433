"""The retry schedule, by property: bounded, growing, never past the deadline."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from routing.delivery import backoff

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
bases = st.floats(min_value=1, max_value=120)
caps = st.floats(min_value=1, max_value=6 * 3600)


@given(attempt=st.integers(min_value=1, max_value=500), base=bases, cap=caps, seed=st.integers())
def test_a_delay_lies_between_the_minimum_and_the_capped_exponential_bound(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    bound = backoff.backoff_bound(attempt=attempt, base=base, cap=cap)
    assert bound <= max(cap, backoff.MIN_DELAY_SECONDS)
    assert bound <= max(base * 2 ** (attempt - 1), backoff.MIN_DELAY_SECONDS)
    delay = backoff.backoff_delay(attempt=attempt, base=base, cap=cap, rng=random.Random(seed))
    assert backoff.MIN_DELAY_SECONDS <= delay <= bound


@given(attempt=st.integers(min_value=1, max_value=500), base=bases, cap=caps)
def test_the_bound_never_shrinks_from_one_attempt_to_the_next(
    attempt: int, base: float, cap: float
) -> None:
    this = backoff.backoff_bound(attempt=attempt, base=base, cap=cap)
    assert backoff.backoff_bound(attempt=attempt + 1, base=base, cap=cap) >= this


@given(
    attempt=st.integers(min_value=1, max_value=200),
    elapsed=st.floats(min_value=0, max_value=2 * 86400),
    max_age=st.integers(min_value=60, max_value=86400),
    retry_after=st.none() | st.floats(min_value=0, max_value=10 * 86400),
    seed=st.integers(),
)
def test_a_retry_is_never_scheduled_past_the_deadline(
    attempt: int, elapsed: float, max_age: int, retry_after: float | None, seed: int
) -> None:
    created = NOW
    give_up_at = created + timedelta(seconds=max_age)
    now = created + timedelta(seconds=elapsed)
    when = backoff.next_attempt_at(
        attempt=attempt,
        now=now,
        give_up_at=give_up_at,
        base=30,
        cap=3600,
        rng=random.Random(seed),
        retry_after=retry_after,
    )
    if now >= give_up_at:
        assert when is None
    else:
        assert when is not None
        assert now < when <= give_up_at
        if retry_after is not None:
            assert when >= min(now + timedelta(seconds=retry_after), give_up_at)


def test_a_failing_delivery_gives_up_after_a_bounded_number_of_attempts() -> None:
    """Retried back to back with the defaults, the schedule ends within a day, and not early."""
    rng = random.Random(7)
    give_up_at = NOW + timedelta(days=1)
    now, attempts = NOW, 0
    while True:
        attempts += 1
        when = backoff.next_attempt_at(
            attempt=attempts, now=now, give_up_at=give_up_at, base=30, cap=3600, rng=rng
        )
        if when is None:
            break
        now = when
    assert now == give_up_at  # the last try happens at the deadline
    assert 20 < attempts < 200


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    assert backoff.retry_after_seconds("120", now=NOW) == 120
    assert backoff.retry_after_seconds("Sun, 29 Nov 2026 12:05:00 GMT", now=NOW) == 300
    assert backoff.retry_after_seconds("Sun, 29 Nov 2026 11:00:00 GMT", now=NOW) == 0
    assert backoff.retry_after_seconds("soon", now=NOW) is None
    assert backoff.retry_after_seconds(None, now=NOW) is None


def test_an_odd_retry_after_is_bounded_or_ignored_never_an_exception() -> None:
    # A receiver's 429 can say anything: a huge number (float inf, or past timedelta's range),
    # a latin-1 digit str.isdigit() accepts and float() refuses, a date in the year 9999.
    give_up_at = NOW + timedelta(hours=1)
    for header in ("9" * 400, "99999999999999", "\u00b2", "Fri, 31 Dec 9999 23:59:59 GMT"):
        seconds = backoff.retry_after_seconds(header, now=NOW)
        assert seconds is None or 0 <= seconds <= backoff.RETRY_AFTER_MAX_SECONDS
        when = backoff.next_attempt_at(
            attempt=1,
            now=NOW,
            give_up_at=give_up_at,
            base=30,
            cap=3600,
            rng=random.Random(1),
            retry_after=seconds,
        )
        assert when is not None
        assert NOW < when <= give_up_at
    # next_attempt_at itself takes any float a caller passes.
    for seconds in (float("inf"), 1e300):
        when = backoff.next_attempt_at(
            attempt=1,
            now=NOW,
            give_up_at=give_up_at,
            base=30,
            cap=3600,
            rng=random.Random(1),
            retry_after=seconds,
        )
        assert when == give_up_at
