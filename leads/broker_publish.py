"""Publishing the kickoff's routing messages cheaply: a raw ``LPUSH`` of prebuilt Celery messages.

``celery_app.send_task`` costs ~0.8 ms of CPU per message on this machine class (Celery builds the
message, kombu looks the exchange's bindings up in Redis and builds its client state), about as
much as the rest of a single-lead kickoff. On the Redis transport a Celery message is one JSON
document LPUSHed to the queue's list, so this module builds that document from a template made
once per process (Celery's own ``as_task_v2`` headers for the task, kombu's envelope) and pushes
every message of a call in one round trip per queue. What a worker receives is the message
``send_task`` would have sent (a test compares the two field by field, and a real ``celery``
worker consumes these).

Only for ``redis://`` and ``rediss://`` brokers without a key prefix, and only for messages
without an ETA; anything else goes through kombu (``leads.services.leads_enqueue``). Errors
propagate to the caller, which trips the broker breaker as for any failed publish.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import threading
import uuid
from bisect import bisect
from collections.abc import Sequence
from typing import Any

from celery.utils.saferepr import saferepr
from django.conf import settings

from config.celery import app as celery_app
from leads.redis_wire import RedisWire, RedisWireError

# kombu's envelope defaults for a persistent message on the virtual transports.
_DELIVERY_MODE_PERSISTENT = 2
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
# Placeholders in a message's JSON text (RawRedisPublisher._text), each replaced by its value's
# own JSON string; quoted as json.dumps writes them.
_SLOT_VALUE = {
    name: f"leadrouter-slot-{name}-7f3a" for name in ("task_id", "body", "argsrepr", "tag")
}
_SLOT_TASK_ID, _SLOT_BODY, _SLOT_ARGSREPR, _SLOT_TAG = (
    json.dumps(_SLOT_VALUE[name]) for name in ("task_id", "body", "argsrepr", "tag")
)
_UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _argsrepr(args: list[Any]) -> str:
    """The ``argsrepr`` header ``send_task`` writes: celery's ``saferepr`` of the args, which
    for one lead id (the kickoff's message) is its plain ``repr``, at a tenth of the CPU."""
    if len(args) == 1 and isinstance(args[0], str) and _UUID_TEXT.fullmatch(args[0]):
        return f"['{args[0]}']"
    return saferepr(
        args, celery_app.amqp.argsrepr_maxsize, maxlevels=celery_app.conf.task_repr_maxlevels
    )


# kombu's Redis transport: a queue's list for priority step ``n`` is ``<queue><sep><n>`` (step 0:
# the queue's own name), ``sep`` being ``kombu.transport.redis.Channel.sep``.
REDIS_PRIORITY_SEP = "\x06\x16"
_MIN_PRIORITY, _MAX_PRIORITY = 0, 9  # kombu's virtual channel clamps a message's priority so


def redis_priority_queue(queue: str, priority: int, steps: Sequence[int]) -> str:
    """The Redis list kombu's transport pushes a message of ``priority`` for ``queue`` to.

    As ``Channel._put``: the priority clamped to 0-9, then down to its step
    (``Channel.priority``: the greatest step not above it), then ``Channel._q_for_pri``."""
    clamped = max(min(int(priority), _MAX_PRIORITY), _MIN_PRIORITY)
    step = steps[bisect(steps, clamped) - 1]
    return f"{queue}{REDIS_PRIORITY_SEP}{step}" if step else queue


def broker_priority_steps() -> tuple[int, ...]:
    """The priority steps of this broker (``priority_steps`` option, else kombu's default)."""
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS or {}
    return tuple(options.get("priority_steps") or (0, 3, 6, 9))


def raw_publish_possible() -> bool:
    """Whether messages may be LPUSHed directly (Redis broker, no key prefix, not switched off)."""
    if not getattr(settings, "ENQUEUE_RAW_REDIS", True) or settings.BROKER_IS_FILESYSTEM:
        return False
    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://")) or ";" in url:  # ";": failover URLs
        return False
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS or {}
    return not options.get("global_keyprefix") and not options.get("sep")


class RawRedisPublisher:
    """One per process: a Redis client of its own and a message template per task name."""

    def __init__(self) -> None:
        self._client: RedisWire | None = None
        self._templates: dict[tuple[str, Any, Any], tuple[dict[str, Any], dict[str, Any]]] = {}
        self._texts: dict[tuple[int, str, int], str] = {}
        self._lock = threading.Lock()

    def _redis(self) -> RedisWire:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS or {}
                    # redis-py's connection used directly (leads.redis_wire).
                    self._client = RedisWire(
                        settings.CELERY_BROKER_URL,
                        socket_timeout=options.get("socket_timeout", 2.0),
                        connect_timeout=settings.CELERY_BROKER_CONNECTION_TIMEOUT,
                    )
        return self._client

    def _template(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Celery's headers and properties for a message of task ``name`` (ids left to fill).

        With the time limits ``send_task`` takes from the task when this process has it
        registered (and none when not): the same message whichever path sent it, whenever the
        task modules were imported."""
        time_limit, soft_time_limit = _registered_limits(name)
        key = (name, time_limit, soft_time_limit)
        template = self._templates.get(key)
        if template is None:
            message = celery_app.amqp.as_task_v2(
                "",
                name,
                args=(),
                kwargs={},
                reply_to=celery_app.thread_oid,
                ignore_result=None,  # type: ignore[arg-type]  # as send_task passes it
                time_limit=time_limit,
                soft_time_limit=soft_time_limit,
            )
            headers = dict(message.headers)
            properties = dict(message.properties)
            template = (headers, properties)
            self._templates[key] = template
        return template

    def message(self, name: str, args: list[Any], queue: str, priority: int = 0) -> bytes:
        """The Redis list entry ``send_task(name, args=args, queue=queue, priority=priority)``
        would push.

        The envelope's JSON is made once per task, queue and priority with placeholders, and
        each message's ids, body and ``argsrepr`` are put in as their own JSON strings: the
        text ``json.dumps`` gives the whole envelope, at a third of its CPU."""
        text = self._text(name, queue, priority)
        task_id = json.dumps(str(uuid.uuid4()))
        body = base64.b64encode(json.dumps([args, {}, _EMBED]).encode("utf-8")).decode("ascii")
        return (
            text.replace(_SLOT_TASK_ID, task_id)
            .replace(_SLOT_BODY, json.dumps(body))
            .replace(_SLOT_ARGSREPR, json.dumps(_argsrepr(args)))
            .replace(_SLOT_TAG, json.dumps(str(uuid.uuid4())))
            .encode("utf-8")
        )

    def _text(self, name: str, queue: str, priority: int) -> str:
        """The envelope's JSON text with each message's values as placeholders."""
        headers_template, properties_template = self._template(name)
        key = (id(headers_template), queue, priority)
        text = self._texts.get(key)
        if text is None:
            headers = dict(headers_template)
            headers["id"] = headers["root_id"] = _SLOT_VALUE["task_id"]
            headers["argsrepr"] = _SLOT_VALUE["argsrepr"]
            properties = dict(properties_template)
            properties["correlation_id"] = _SLOT_VALUE["task_id"]
            envelope = {
                "body": _SLOT_VALUE["body"],
                "content-encoding": "utf-8",
                "content-type": "application/json",
                "headers": headers,
                "properties": {
                    **properties,
                    "delivery_mode": _DELIVERY_MODE_PERSISTENT,
                    "delivery_info": {"exchange": "", "routing_key": queue},
                    "priority": priority,
                    "body_encoding": "base64",
                    "delivery_tag": _SLOT_VALUE["tag"],
                },
            }
            text = json.dumps(envelope)
            self._texts[key] = text
        return text

    def publish(self, messages: Sequence[tuple[str, list[Any], str, int]]) -> int:
        """LPUSH (task name, args, queue, priority) messages, one command per Redis list (the
        queue's list for that priority step, as kombu names it), in one round trip.

        Within a list they are consumed in the order given (workers pop from the right)."""
        steps = broker_priority_steps()
        by_queue: dict[str, list[bytes]] = {}
        for name, args, queue, priority in messages:
            key = redis_priority_queue(queue, priority, steps)
            by_queue.setdefault(key, []).append(self.message(name, args, queue, priority))
        if not by_queue:
            return 0
        for reply in self._redis().execute(
            [("LPUSH", queue, *entries) for queue, entries in by_queue.items()]
        ):
            if isinstance(reply, RedisWireError):
                raise reply
        return len(messages)

    def reset(self) -> None:
        """Forget the client and templates (settings changed: tests)."""
        with self._lock:
            self._client = None
            self._templates = {}
            self._texts = {}


raw_publisher = RawRedisPublisher()


def message_fields(entry: bytes) -> dict[str, Any]:
    """A Redis list entry decoded: the envelope with its body decoded (tests, diagnostics)."""
    envelope = json.loads(entry)
    decoded = copy.deepcopy(envelope)
    decoded["body"] = json.loads(base64.b64decode(envelope["body"]))
    return decoded


def _registered_limits(name: str) -> tuple[Any, Any]:
    """The time limits ``send_task`` puts in a message of task ``name``: the task's own when
    this process has it registered (read without finalizing the app, as ``send_task`` does),
    else none (the worker then applies its own)."""
    registry = getattr(celery_app, "_tasks", None)  # the registry send_task reads, unfinalized
    task = registry.get(name) if registry is not None else None
    get_options = getattr(task, "_get_exec_options", None)
    if task is None or get_options is None:
        return None, None
    options = get_options()
    return options.get("time_limit"), options.get("soft_time_limit")
