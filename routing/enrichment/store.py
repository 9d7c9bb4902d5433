"""Where the state shared by all enrichment workers lives: Redis when there is one, else the cache.

The rate limit and the circuit breaker must be global, not per worker process, so both keep their
state here. Redis is the cache's Redis when the cache is Redis (it is already the shared store of
the intake rate limit), else ``REDIS_URL``, else ``ENRICHMENT_REDIS_URL`` when set explicitly.
Without any Redis, Django's cache is used: shared by every process when it is a shared cache
(database, memcached), per process when it is the default local-memory cache.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from django.conf import settings

_lock = threading.Lock()
_client: Any = None
_client_key: tuple[int, str] | None = None


def redis_url() -> str | None:
    """The Redis URL the enrichment state lives in, or None (then Django's cache is used)."""
    explicit: str = getattr(settings, "ENRICHMENT_REDIS_URL", "")
    if explicit:
        return explicit
    cache = settings.CACHES["default"]
    if cache["BACKEND"].endswith("RedisCache"):
        location = cache["LOCATION"]
        return str(location[0] if isinstance(location, list | tuple) else location)
    return settings.REDIS_URL or None


def redis_client() -> Any:
    """One Redis client per process (and per URL), with short timeouts; None without Redis.

    A forked worker child gets its own client: a connection pool must not cross a fork.
    """
    global _client, _client_key
    url = redis_url()
    if url is None:
        return None
    key = (os.getpid(), url)
    if _client is None or _client_key != key:
        with _lock:
            if _client is None or _client_key != key:
                import redis

                _client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
                _client_key = key
    return _client
