"""A per-process circuit breaker for calls the kickoff must not wait on (broker, Redis cache)."""

from __future__ import annotations

import threading
import time


class CircuitBreaker:
    """After a failure, callers skip the call for a while instead of each paying a timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open_until = 0.0

    def allows(self) -> bool:
        return time.monotonic() >= self._open_until

    def trip(self, seconds: float) -> None:
        with self._lock:
            self._open_until = time.monotonic() + seconds

    def reset(self) -> None:
        with self._lock:
            self._open_until = 0.0
