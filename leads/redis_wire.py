"""A minimal Redis client for the kickoff's two commands per request: the rate-limit count and
the routing message's LPUSH (issue 18).

redis-py spends ~0.09 ms of CPU on one command here (its connection pool's lock and liveness
check, two ``settimeout`` calls, the command's packing and its reply parser), for a round trip
that needs ~0.015 ms: on the kickoff that was two commands a request. This client keeps one
socket per process and writes the commands' RESP bytes itself, then reads integer, status and
error replies, nothing else (the commands it is given answer only those).

Only for plain ``redis://host:port/db`` URLs (a password and user name are sent with AUTH);
anything else (TLS, a Unix socket, Sentinel) makes ``wire_for`` answer None and the caller use
redis-py. Any failure (connect, timeout, a reply it cannot read) closes the socket and raises
``RedisWireError`` or ``OSError``; the next call connects again. Callers keep their breakers.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from urllib.parse import unquote, urlparse


class RedisWireError(Exception):
    """An error reply, or a reply this client does not read."""


def _pack(args: tuple[bytes | str | int, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode("utf-8")
        else:
            data = str(int(arg)).encode("ascii")
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class RedisWire:
    """One connection to one Redis database, used under a lock, reconnected after a fork or a
    failure."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        db: int,
        username: str | None,
        password: str | None,
        socket_timeout: float,
        connect_timeout: float,
    ) -> None:
        self.host, self.port, self.db = host, port, db
        self.username, self.password = username, password
        self.socket_timeout, self.connect_timeout = socket_timeout, connect_timeout
        self._sock: socket.socket | None = None
        self._pid = 0
        self._buffer = b""
        self._lock = threading.Lock()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.socket_timeout)
        self._sock, self._pid, self._buffer = sock, os.getpid(), b""
        setup: list[tuple[bytes | str | int, ...]] = []
        if self.password is not None:
            setup.append(
                ("AUTH", self.username, self.password) if self.username else ("AUTH", self.password)
            )
        if self.db:
            setup.append(("SELECT", self.db))
        if setup:
            sock.sendall(b"".join(_pack(command) for command in setup))
            for _ in setup:
                reply = self._reply(sock)
                if isinstance(reply, RedisWireError):
                    raise reply
        return sock

    def close(self) -> None:
        sock, self._sock, self._buffer = self._sock, None, b""
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _line(self, sock: socket.socket) -> bytes:
        while True:
            end = self._buffer.find(b"\r\n")
            if end >= 0:
                line, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
                return line
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("Redis closed the connection")
            self._buffer += chunk

    def _reply(self, sock: socket.socket) -> int | str | RedisWireError:
        line = self._line(sock)
        kind, rest = line[:1], line[1:]
        if kind == b":":
            return int(rest)
        if kind == b"+":
            return rest.decode("utf-8", "replace")
        if kind == b"-":
            return RedisWireError(rest.decode("utf-8", "replace"))
        raise RedisWireError(f"unexpected reply type {kind!r}")

    def execute(
        self, commands: list[tuple[bytes | str | int, ...]]
    ) -> list[int | str | RedisWireError]:
        """Send ``commands`` in one write and read their replies, in order (an error reply is
        returned, not raised: the caller decides). A failure of the connection raises."""
        with self._lock:
            for attempt in (1, 2):
                sock = self._sock
                fresh = sock is None or self._pid != os.getpid()
                try:
                    if sock is None or fresh:
                        self._sock = None  # a forked child opens its own
                        sock = self._connect()
                    sock.sendall(b"".join(_pack(command) for command in commands))
                    return [self._reply(sock) for _ in commands]
                except ConnectionError:
                    # A kept connection Redis closed meanwhile (a restart, an idle timeout):
                    # once more on a new one. A command may then run twice; the kickoff's
                    # are a count and a wake-up message, both harmless twice.
                    self.close()
                    if fresh or attempt == 2:
                        raise
                except BaseException:
                    self.close()
                    raise
            raise AssertionError("unreachable")


def wire_for(url: str, *, socket_timeout: float, connect_timeout: float) -> RedisWire | None:
    """A ``RedisWire`` for a plain ``redis://`` URL, else None (use redis-py)."""
    parsed = urlparse(url)
    if parsed.scheme != "redis" or not parsed.hostname or parsed.query:
        return None
    path = parsed.path.strip("/")
    if path and not path.isdigit():
        return None
    return RedisWire(
        host=parsed.hostname,
        port=parsed.port or 6379,
        db=int(path or 0),
        username=unquote(parsed.username) if parsed.username else None,
        password=unquote(parsed.password) if parsed.password is not None else None,
        socket_timeout=socket_timeout,
        connect_timeout=connect_timeout,
    )
