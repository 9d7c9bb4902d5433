"""A total deadline for one outside call, whatever the client library does with its sockets.

A client's own timeout bounds each socket operation (the connect, each read): a server that
answers a byte a second never trips it, and holds the calling thread (in the I/O worker, one of
its ``IO_WORKER_CONCURRENCY``) for as long as it likes. A ``Deadline`` is the whole call's
budget, from the connect to the last byte of the body:

- where we read the body ourselves (the enrichment call on httpx), ``Deadline.check()`` between
  chunks raises ``DeadlinePassed``;
- for a vendor's client library on urllib3 (hubspot-api-client; simple-salesforce through
  requests), ``deadline_pools(pool_manager)`` makes the manager's connections join the deadline
  of the call in progress on their thread (``within(seconds)``), and one watchdog thread per
  process shuts their sockets down when it passes: the blocked read returns at once, the library
  raises its own connection error, and the caller, seeing ``deadline.passed``, reports a timeout.
  A connection that joins after the deadline passed is refused at once.

No Django here: the CRM modules and the enrichment call use it alike. (The Meta Graph fetch in
``leads.sources`` checks its own monotonic deadline between chunks: source kinds may not depend
on ``routing``.)
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from urllib3 import PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class DeadlinePassed(TimeoutError):
    """The call's total deadline passed."""


class Deadline:
    """``seconds`` from now for one call; the sockets that must close when it passes."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.fired = False
        self._connections: list[Any] = []
        self._lock = threading.Lock()

    @property
    def passed(self) -> bool:
        return self.fired or time.monotonic() >= self.at

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def check(self) -> None:
        """Raise ``DeadlinePassed`` once the deadline has passed."""
        if self.passed:
            raise DeadlinePassed(f"no complete answer within {self.seconds:g} s")

    def join(self, connection: Any) -> None:
        """``connection`` (anything with a ``sock``) is shut down when the deadline passes."""
        with self._lock:
            if not self.fired:
                self._connections.append(connection)
                return
        raise DeadlinePassed(f"no complete answer within {self.seconds:g} s")

    def fire(self) -> None:
        """Shut down every joined connection's socket (the watchdog calls it at ``at``)."""
        with self._lock:
            self.fired = True
            connections, self._connections = self._connections, []
        for connection in connections:
            sock = getattr(connection, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _release(self) -> None:
        with self._lock:
            self._connections = []


class _Watchdog:
    """One daemon thread per process that fires deadlines at their time."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._done: set[int] = set()
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="deadline-watchdog", daemon=True)
        self._thread.start()

    def add(self, deadline: Deadline) -> int:
        with self._wake:
            key = next(self._order)
            heapq.heappush(self._heap, (deadline.at, key, deadline))
            self._wake.notify()
            return key

    def discard(self, key: int) -> None:
        with self._wake:
            self._done.add(key)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._heap:
                    self._wake.wait()
                at, key, deadline = self._heap[0]
                wait = at - time.monotonic()
                if key in self._done:
                    heapq.heappop(self._heap)
                    self._done.discard(key)
                    continue
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                heapq.heappop(self._heap)
            deadline.fire()


_watchdog: _Watchdog | None = None
_watchdog_pid = 0
_watchdog_lock = threading.Lock()
_local = threading.local()


def _the_watchdog() -> _Watchdog:
    """The process's watchdog (a thread does not survive a fork: a child starts its own)."""
    global _watchdog, _watchdog_pid
    if _watchdog is None or _watchdog_pid != os.getpid():
        with _watchdog_lock:
            if _watchdog is None or _watchdog_pid != os.getpid():
                _watchdog = _Watchdog()
                _watchdog_pid = os.getpid()
    return _watchdog


def current() -> Deadline | None:
    """The deadline of the call in progress on this thread, if any."""
    return getattr(_local, "deadline", None)


@contextlib.contextmanager
def within(seconds: float) -> Iterator[Deadline]:
    """Run the block as one call with a total deadline of ``seconds``: the connections of a
    ``deadline_pools`` manager used in it are shut down when it passes (a deadline already
    running on this thread is kept when it is the nearer one)."""
    outer = current()
    deadline = Deadline(seconds)
    if outer is not None and outer.at <= deadline.at:
        yield outer
        return
    watchdog = _the_watchdog()
    key = watchdog.add(deadline)
    _local.deadline = deadline
    try:
        yield deadline
    finally:
        _local.deadline = outer
        watchdog.discard(key)
        deadline._release()


def _join_current(connection: Any) -> None:
    deadline = current()
    if deadline is not None:
        deadline.join(connection)


class _DeadlineHTTPConnection(HTTPConnection):
    def connect(self) -> None:
        _join_current(self)
        super().connect()

    def request(self, *args: Any, **kwargs: Any) -> None:
        _join_current(self)
        super().request(*args, **kwargs)


class _DeadlineHTTPSConnection(HTTPSConnection):
    def connect(self) -> None:
        _join_current(self)
        super().connect()

    def request(self, *args: Any, **kwargs: Any) -> None:
        _join_current(self)
        super().request(*args, **kwargs)


class _DeadlineHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _DeadlineHTTPConnection


class _DeadlineHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection


def deadline_pools(manager: PoolManager) -> PoolManager:
    """``manager``, its future connections joining the deadline of the call on their thread."""
    manager.pool_classes_by_scheme = {
        "http": _DeadlineHTTPConnectionPool,
        "https": _DeadlineHTTPSConnectionPool,
    }
    manager.clear()
    return manager
