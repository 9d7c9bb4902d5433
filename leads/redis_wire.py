"""The kickoff's Redis connection, for its two commands per request: the rate-limit count and
the routing message's LPUSH (issue 18).

redis-py's client object spends ~0.09 ms of CPU on one command here (its connection pool's lock
and liveness check, the command's dispatch and response callbacks), for a round trip that needs
~0.015 ms; its ``Connection`` used directly spends ~0.03 ms. This module keeps one redis-py
``Connection`` per process, made from the URL by redis-py itself (so AUTH, SELECT, TLS and Unix
sockets are redis-py's), and sends a list of commands in one write through redis-py's packer,
then reads their replies with its parser. Used under a lock; a forked child opens its own.

An error reply is returned, not raised (``RedisWireError``; NOSCRIPT keeps its code), so that
the caller decides. A connection Redis closed meanwhile (a restart, an idle timeout) is replaced
once; any other failure (connect, timeout) closes the connection and raises redis-py's
exception, and the next call connects again. Callers keep their breakers.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError


class RedisWireError(Exception):
    """An error reply."""


class RedisWire:
    """One redis-py connection to one Redis database, used under a lock, reconnected after a
    fork or a failure."""

    def __init__(self, url: str, *, socket_timeout: float, connect_timeout: float) -> None:
        pool = redis.ConnectionPool.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry_on_timeout=False,
        )
        self.connection_class = pool.connection_class
        self.connection_kwargs: dict[str, Any] = dict(pool.connection_kwargs)
        self._connection: Any = None
        self._pid = 0
        self._lock = threading.Lock()

    def _connect(self) -> Any:
        connection = self.connection_class(**self.connection_kwargs)
        connection.connect()
        self._connection, self._pid = connection, os.getpid()
        return connection

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and self._pid == os.getpid():
            connection.disconnect()

    @staticmethod
    def _reply(connection: Any) -> Any:
        try:
            return connection.read_response()
        except NoScriptError as exc:
            return RedisWireError(f"NOSCRIPT {exc}")
        except ResponseError as exc:
            return RedisWireError(str(exc))

    def execute(self, commands: list[tuple[bytes | str | int, ...]]) -> list[Any]:
        """Send ``commands`` in one write and read their replies, in order (an error reply is
        returned as a ``RedisWireError``). A failure of the connection raises."""
        with self._lock:
            for attempt in (1, 2):
                connection = self._connection
                fresh = connection is None or self._pid != os.getpid()
                try:
                    if fresh:
                        self._connection = None  # a forked child opens its own
                        connection = self._connect()
                    connection.send_packed_command(
                        connection.pack_commands(commands), check_health=False
                    )
                    return [self._reply(connection) for _ in commands]
                except RedisConnectionError:
                    # A kept connection Redis closed meanwhile: once more on a new one. A
                    # command may then run twice; the kickoff's are a count and a wake-up
                    # message, both harmless twice.
                    self.close()
                    if fresh or attempt == 2:
                        raise
                except BaseException:
                    self.close()
                    raise
            raise AssertionError("unreachable")
