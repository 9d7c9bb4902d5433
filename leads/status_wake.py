"""Waking the status requests that wait for a lead's outcome, without polling the database.

A worker that has written a lead's outcome announces the lead's id; each process serving status
requests listens once (one connection for all its waiters) and wakes the requests waiting for
that lead, which then read the lead once. Two carriers, chosen by settings:

- ``STATUS_REDIS_URL`` (default ``REDIS_URL``) set: Redis pub/sub on ``STATUS_CHANNEL``;
- else, with no server at all (``make run``'s embedded defaults): each listening process binds a
  Unix datagram socket in ``STATUS_WAKE_DIR`` and a worker sends the ids to every socket there
  (a socket nobody listens on any more is removed by the first sender that finds it so).

An announcement is a hint, not the truth: one that is lost (Redis down, a full socket buffer)
only makes its waiters answer at the end of their wait, with whatever the lead then is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from django.conf import settings

from leads.breaker import CircuitBreaker

logger = logging.getLogger(__name__)

_BACKOFF_MIN_SECONDS = 0.5
_DATAGRAM_BYTES = 8192  # ids per datagram: 200 or so, far below any socket's limit
_sync_redis: Any = None
announce_breaker = CircuitBreaker()


def _redis_client() -> Any:
    global _sync_redis
    if _sync_redis is None:
        import redis

        _sync_redis = redis.Redis.from_url(
            settings.STATUS_REDIS_URL,
            socket_connect_timeout=settings.CELERY_BROKER_CONNECTION_TIMEOUT,
            socket_timeout=settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("socket_timeout", 2.0),
        )
    return _sync_redis


def lead_status_announce(*, lead_ids: Iterable[uuid.UUID | str]) -> None:
    """Tell the status requests waiting for these leads that their outcome is written.

    Call after the outcome is committed. Never raises: a failure is logged, and for
    ``BROKER_BREAKER_SECONDS`` no announcement is tried (the waiters answer at their timeout).
    """
    ids = [str(lead_id) for lead_id in lead_ids]
    if not ids or not announce_breaker.allows():
        return
    try:
        if settings.STATUS_REDIS_URL:
            pipe = _redis_client().pipeline(transaction=False)
            for lead_id in ids:
                pipe.publish(settings.STATUS_CHANNEL, lead_id)
            pipe.execute()
        else:
            _announce_to_sockets(ids)
    except Exception as exc:  # a hint only: the lead's outcome is in the database already
        announce_breaker.trip(settings.BROKER_BREAKER_SECONDS)
        logger.warning("lead status announcement failed (%s): %s", type(exc).__name__, exc)


def _datagrams(ids: list[str]) -> Iterable[bytes]:
    chunk: list[str] = []
    size = 0
    for lead_id in ids:
        if chunk and size + len(lead_id) + 1 > _DATAGRAM_BYTES:
            yield "\n".join(chunk).encode()
            chunk, size = [], 0
        chunk.append(lead_id)
        size += len(lead_id) + 1
    if chunk:
        yield "\n".join(chunk).encode()


def _announce_to_sockets(ids: list[str]) -> None:
    folder = settings.STATUS_WAKE_DIR
    try:
        entries = [entry.path for entry in os.scandir(folder) if entry.name.endswith(".sock")]
    except FileNotFoundError:
        return  # no process has listened yet
    if not entries:
        return
    payloads = list(_datagrams(ids))
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setblocking(False)
        for path in entries:
            for payload in payloads:
                try:
                    sender.sendto(payload, path)
                except (ConnectionRefusedError, FileNotFoundError):
                    with contextlib.suppress(OSError):
                        os.unlink(path)  # its process is gone
                    break
                except BlockingIOError:
                    break  # its buffer is full: those waiters answer at their timeout


class StatusWaiters:
    """The status requests of this process waiting for leads, and the one listener that wakes
    them (started by the first waiter, in the running event loop)."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Future[float]]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listening: asyncio.Event | None = None
        # An attempt to listen failed (a subscription lost, or never made) and none has
        # succeeded since: announcements may go unheard meanwhile.
        self._was_lost = False

    async def listening(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) until the listener hears announcements; whether it does.

        A waiter registers, waits for this, then reads the lead: an outcome written before the
        read is seen by the read, one written after it is heard.
        """
        if self._listening is None:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), timeout)
        return self._listening.is_set()

    def troubled(self) -> bool:
        """Whether the listener has failed to listen since it last heard (Redis away): a waiter
        then reads its lead at once rather than give it a second to subscribe, and is woken to
        read it again once it does (``wake_all``)."""
        return self._was_lost

    def register(self, lead_id: uuid.UUID) -> asyncio.Future[float]:
        """A future done when ``lead_id`` is announced, with the event loop's time it was heard
        (register before reading the lead; a read begun after that time sees the outcome)."""
        self._ensure_listener()
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(str(lead_id), set()).add(future)
        return future

    def unregister(self, lead_id: uuid.UUID, future: asyncio.Future[float]) -> None:
        key = str(lead_id)
        futures = self._waiting.get(key)
        if futures is not None:
            futures.discard(future)
            if not futures:
                del self._waiting[key]
        if not future.done():
            future.cancel()

    def waiting(self) -> int:
        return sum(len(futures) for futures in self._waiting.values())

    def waiting_for(self, lead_id: uuid.UUID) -> int:
        """How many requests of this process wait for ``lead_id``."""
        return len(self._waiting.get(str(lead_id), ()))

    def wake(self, lead_id: str) -> None:
        futures = self._waiting.get(lead_id)
        if not futures:
            return
        heard_at = next(iter(futures)).get_loop().time()
        for future in futures:
            if not future.done():
                future.set_result(heard_at)

    def wake_all(self) -> None:
        """Wake every waiter of this process: each reads its lead once more."""
        for lead_id in list(self._waiting):
            self.wake(lead_id)

    def _heard(self, listening: bool) -> None:
        if self._listening is not None:
            if listening:
                self._listening.set()
                self._was_lost = False
            else:
                self._was_lost = True
                self._listening.clear()

    def _ensure_listener(self) -> None:
        loop = asyncio.get_running_loop()
        if self._listener is not None and self._loop is loop and not self._listener.done():
            return
        self._loop = loop
        self._waiting.clear()  # futures of another loop (a test's) can never be woken here
        self._listening = asyncio.Event()
        self._was_lost = False
        listen = self._listen_redis if settings.STATUS_REDIS_URL else self._listen_socket
        self._listener = loop.create_task(listen(), name="lead-status-listener")

    async def _listen_redis(self) -> None:
        """Subscribe, hear announcements, and start again whenever the connection fails or goes
        silent, after a pause that doubles (with jitter) up to STATUS_LISTENER_BACKOFF_MAX_SECONDS
        and starts again from its minimum once a subscription is confirmed."""
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        backoff = _BACKOFF_MIN_SECONDS
        while True:
            client = aioredis.Redis.from_url(
                settings.STATUS_REDIS_URL,
                socket_connect_timeout=settings.CELERY_BROKER_CONNECTION_TIMEOUT,
                # Bounds the commands (SUBSCRIBE, PING); a read of pub/sub messages has its own
                # timeout, and a silent connection is found by the pings below.
                socket_timeout=settings.STATUS_LISTENER_TIMEOUT_SECONDS,
                socket_keepalive=True,
                # Our own reconnect loop below; redis-py's retries would hide a dead server.
                retry=Retry(NoBackoff(), 0),
            )
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(settings.STATUS_CHANNEL)
                    async for _ in self._hear(pubsub):
                        backoff = _BACKOFF_MIN_SECONDS  # subscribed: the next failure starts low
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: waiters answer at their timeout meanwhile
                logger.warning(
                    "lead status listener lost Redis (%s: %s); subscribing again in %.1f s",
                    type(exc).__name__,
                    exc,
                    backoff,
                )
            finally:
                self._heard(False)
                with contextlib.suppress(Exception):
                    await client.aclose()
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))  # noqa: S311 (jitter)
            backoff = min(backoff * 2, settings.STATUS_LISTENER_BACKOFF_MAX_SECONDS)

    async def _hear(self, pubsub: Any) -> AsyncIterator[None]:
        """Wake the waiters of each announcement on ``pubsub``; yields once subscribed.

        A read of pub/sub messages waits for as long as no message comes, so a connection that
        died silently (a half-open TCP connection, a server that hangs) would be waited on for
        ever: every STATUS_LISTENER_PING_SECONDS the listener pings, and when nothing at all (no
        message, no pong) has come for that plus STATUS_LISTENER_TIMEOUT_SECONDS it raises."""
        loop = asyncio.get_running_loop()
        every = settings.STATUS_LISTENER_PING_SECONDS
        silent_after = every + settings.STATUS_LISTENER_TIMEOUT_SECONDS
        heard_at = pinged_at = loop.time()
        while True:
            message = await pubsub.get_message(timeout=min(1.0, every))
            now = loop.time()
            if message is not None:
                heard_at = now
                kind = message.get("type")
                if kind == "message":
                    data = message.get("data")
                    if isinstance(data, bytes):
                        self.wake(data.decode(errors="replace"))
                elif kind == "subscribe":
                    logger.info("lead status listener subscribed to %s", settings.STATUS_CHANNEL)
                    again = self._listening is not None and self._was_lost
                    self._heard(True)
                    if again:
                        # Announcements made while it was away were lost: every waiter reads
                        # its lead once more now instead of at the end of its wait.
                        self.wake_all()
                    yield
            if now - heard_at > silent_after:
                raise TimeoutError(f"no answer from Redis for {now - heard_at:.1f} s")
            if now - pinged_at >= every:
                await pubsub.ping()
                pinged_at = now

    async def _listen_socket(self) -> None:
        folder = Path(settings.STATUS_WAKE_DIR)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.sock"
        loop = asyncio.get_running_loop()
        waiters = self

        class Receiver(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: Any) -> None:
                for lead_id in data.decode(errors="replace").split("\n"):
                    waiters.wake(lead_id)

        try:
            transport, _ = await loop.create_datagram_endpoint(
                Receiver, local_addr=str(path), family=socket.AF_UNIX
            )
        except OSError as exc:  # e.g. a path over the 107 bytes a Unix socket allows
            logger.warning("lead status listener cannot bind %s: %s", path, exc)
            return
        self._heard(True)
        try:
            await asyncio.Future()  # until the loop ends
        finally:
            transport.close()
            with contextlib.suppress(OSError):
                path.unlink()


status_waiters = StatusWaiters()
