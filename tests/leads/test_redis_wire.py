"""The kickoff's Redis connection for its rate-limit count and routing message (leads.redis_wire,
issue 18: redis-py's connection used directly): what it writes redis-py reads, a connection
Redis closed is replaced, a Redis that does not answer fails within the timeout, and the rate
limit still counts exactly through it."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from leads import redis_wire, source_auth
from leads.broker_publish import raw_publisher
from leads.parsing import IntakeError
from leads.redis_wire import RedisWire, RedisWireError
from tests.leads.factories import SourceFactory


def _url() -> str:
    if settings.BROKER_IS_FILESYSTEM:
        pytest.skip("needs Redis (REDIS_URL)")
    return str(settings.CELERY_BROKER_URL)


@pytest.fixture
def wire() -> Iterator[RedisWire]:
    client = RedisWire(_url(), socket_timeout=1.0, connect_timeout=1.0)
    yield client
    client.close()


@pytest.fixture
def redis_py():  # type: ignore[no-untyped-def]
    import redis

    return redis.Redis.from_url(_url())


def test_redis_py_reads_the_url() -> None:
    def parts(url: str) -> tuple[object, ...]:
        client = RedisWire(url, socket_timeout=1, connect_timeout=1)
        # What redis-py's connection gets; port and db default to 6379 and 0 there.
        kwargs = {"port": 6379, "db": 0, **client.connection_kwargs}
        return tuple(kwargs.get(name) for name in ("host", "port", "db", "username", "password"))

    assert parts("redis://127.0.0.1:6390/1") == ("127.0.0.1", 6390, 1, None, None)
    assert parts("redis://localhost") == ("localhost", 6379, 0, None, None)
    assert parts("redis://:s%40cret@redis:6379/0") == ("redis", 6379, 0, None, "s@cret")
    assert parts("redis://app:pw@redis/2") == ("redis", 6379, 2, "app", "pw")
    tls = RedisWire("rediss://redis:6379/0", socket_timeout=1, connect_timeout=1)
    assert tls.connection_class.__name__ == "SSLConnection"
    with pytest.raises(ValueError, match="must specify one of the following schemes"):
        RedisWire("sentinel://redis:26379", socket_timeout=1, connect_timeout=1)


@pytest.mark.redis
def test_what_it_writes_redis_py_reads(wire, redis_py) -> None:  # type: ignore[no-untyped-def]
    key, queue = f"test.wire.{uuid.uuid4().hex}", f"test.wire.q.{uuid.uuid4().hex}"
    try:
        assert wire.execute([("INCRBY", key, 3), ("INCRBY", key, 4)]) == [3, 7]
        assert wire.execute([("LPUSH", queue, b"a\r\nb", "c\u00e9")]) == [2]
        assert redis_py.get(key) == b"7"
        assert redis_py.lrange(queue, 0, -1) == ["c\u00e9".encode(), b"a\r\nb"]
        [error] = wire.execute([("LPUSH", key, "x")])  # a string key: WRONGTYPE
        assert isinstance(error, RedisWireError)
        assert str(error).startswith("WRONGTYPE")
        assert wire.execute([("INCRBY", key, 1)]) == [8]  # the connection is still good
    finally:
        redis_py.delete(key, queue)


@pytest.mark.redis
def test_a_connection_redis_closed_is_replaced_once(wire, redis_py) -> None:  # type: ignore[no-untyped-def]
    [first] = wire.execute([("CLIENT", "ID")])
    redis_py.client_kill_filter(_id=first)
    [second] = wire.execute([("CLIENT", "ID")])  # no error: a new connection
    assert second != first


@pytest.mark.redis
def test_a_forked_process_opens_its_own_connection(wire, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    [first] = wire.execute([("CLIENT", "ID")])
    monkeypatch.setattr(redis_wire.os, "getpid", lambda: -1)  # as in a forked child
    [second] = wire.execute([("CLIENT", "ID")])
    assert second != first


def test_a_redis_that_does_not_answer_fails_within_the_timeout() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    try:
        port = listener.getsockname()[1]
        client = RedisWire(f"redis://127.0.0.1:{port}/0", socket_timeout=0.3, connect_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            client.execute([("INCRBY", "k", 1)])
        assert time.monotonic() - started < 2
    finally:
        for sock in accepted:
            sock.close()
        listener.close()


@pytest.mark.redis
@pytest.mark.django_db
def test_the_rate_limit_counts_exactly_through_it_even_after_redis_forgot_the_script(
    settings, redis_py, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    url = _url()
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url}
    }
    monkeypatch.setattr(source_auth, "_redis_client", None)
    source = SourceFactory(slug=f"wire-{uuid.uuid4().hex[:8]}", rate_limit_per_minute=3)
    now = timezone.now()
    key = f"leadrouter:intake-rate:{source.pk}:{int(now.timestamp()) // 60}"
    try:
        source_auth.check_rate_limit(source, now=now)
        assert isinstance(source_auth._redis(), RedisWire)
        redis_py.script_flush()  # EVALSHA answers NOSCRIPT: the script is sent again
        source_auth.check_rate_limit(source, now=now, records=2)
        with pytest.raises(IntakeError) as refused:
            source_auth.check_rate_limit(source, now=now)
        assert refused.value.status == 429
        assert redis_py.get(key) == b"4"
        assert 0 < redis_py.ttl(key) <= 120
    finally:
        redis_py.delete(key)


@pytest.mark.redis
def test_the_publisher_pushes_through_it(redis_py) -> None:  # type: ignore[no-untyped-def]
    _url()
    queue = f"test.wire.publish.{uuid.uuid4().hex}"
    raw_publisher.reset()
    try:
        raw_publisher.publish([("routing.process_lead", [str(uuid.uuid4())], queue, 0)] * 2)
        assert isinstance(raw_publisher._redis(), RedisWire)
        assert redis_py.llen(queue) == 2
    finally:
        redis_py.delete(queue)
        raw_publisher.reset()
