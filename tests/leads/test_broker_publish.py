"""The kickoff's raw LPUSH of prebuilt Celery messages (leads.broker_publish, issue 18).

What it pushes must be what ``send_task`` would push (field by field, ids aside), and a real
``celery`` worker must consume it and route the lead.
"""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from config.celery import app
from leads import lanes, services
from leads.broker_publish import (
    REDIS_PRIORITY_SEP,
    message_fields,
    raw_publish_possible,
    raw_publisher,
    redis_priority_queue,
)

_IDS = {"headers": ("id", "root_id"), "properties": ("correlation_id", "delivery_tag")}


def _without_ids(message: dict[str, Any]) -> dict[str, Any]:
    message = json.loads(json.dumps(message))
    for part, names in _IDS.items():
        for name in names:
            message[part].pop(name)
    return message


@pytest.fixture
def redis_broker():  # type: ignore[no-untyped-def]
    if settings.BROKER_IS_FILESYSTEM:
        pytest.skip("needs the Redis broker (REDIS_URL)")
    import redis

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    queue = "test.raw-publish"
    client.delete(queue)
    yield client, queue
    client.delete(queue)


@pytest.mark.redis
@pytest.mark.parametrize(
    ("name", "args"),
    [
        (services.PROCESS_LEAD_TASK, ["0b9f3c52-5c34-4f39-8f1e-7a0e2a1f1c11"]),
        (services.PROCESS_LEADS_TASK, [[f"00000000-0000-0000-0000-{i:012d}" for i in range(100)]]),
    ],
)
def test_the_raw_message_is_the_one_send_task_pushes(redis_broker, name, args) -> None:  # type: ignore[no-untyped-def]
    client, queue = redis_broker
    with app.producer_or_acquire() as producer:
        app.send_task(name, args=args, producer=producer, retry=False, queue=queue)
    raw_publisher.publish([(name, args, queue, 0)])
    assert client.llen(queue) == 2
    by_kombu = message_fields(client.rpop(queue))
    raw = message_fields(client.rpop(queue))
    assert _without_ids(raw) == _without_ids(by_kombu)
    assert raw["body"][0] == args
    # Fresh ids, consistent with each other as Celery makes them.
    assert raw["headers"]["id"] == raw["headers"]["root_id"] == raw["properties"]["correlation_id"]
    assert raw["headers"]["id"] != by_kombu["headers"]["id"]


@pytest.mark.redis
def test_one_round_trip_per_queue_keeps_the_order_given(redis_broker) -> None:  # type: ignore[no-untyped-def]
    client, queue = redis_broker
    other = queue + ".other"
    client.delete(other)
    try:
        raw_publisher.publish(
            [
                (services.PROCESS_LEAD_TASK, ["a"], queue, 0),
                (services.PROCESS_LEAD_TASK, ["b"], other, 0),
                (services.PROCESS_LEAD_TASK, ["c"], queue, 0),
            ]
        )
        # Workers pop from the right: the first given is consumed first.
        assert [message_fields(client.rpop(queue))["body"][0] for _ in range(2)] == [["a"], ["c"]]
        assert message_fields(client.rpop(other))["body"][0] == ["b"]
    finally:
        client.delete(other)


@pytest.mark.redis
def test_leads_enqueue_pushes_each_kickoffs_message_to_its_lanes_queue(redis_broker) -> None:  # type: ignore[no-untyped-def]
    """Each to its lane's queue, in the list of its priority step (``lanes.routing_priority``):
    the list kombu's Redis transport names for that step, which a worker pops."""
    client, _queue = redis_broker
    realtime, bulk = lanes.routing_queue(lanes.REALTIME), lanes.routing_queue(lanes.BULK)
    lists = {
        "realtime high": realtime,  # step 0: the queue's own name
        "realtime normal": realtime + "\x06\x163",
        "bulk normal": bulk + "\x06\x169",
    }
    before = {name: client.llen(key) for name, key in lists.items()}
    ids = [f"00000000-0000-0000-0000-{i:012d}" for i in range(4)]
    try:
        sent = services.leads_enqueue_groups(
            [
                ([ids[0]], lanes.REALTIME, False),
                ([ids[1]], lanes.REALTIME, False),
                (ids[2:3], lanes.BULK, False),
                (ids[3:], lanes.REALTIME, True),
            ]
        )
        assert sent == 4
        assert {name: client.llen(key) - before[name] for name, key in lists.items()} == {
            "realtime high": 1,
            "realtime normal": 2,
            "bulk normal": 1,
        }
        high = message_fields(client.rpop(lists["realtime high"]))
        assert high["body"][0] == [ids[3]]
        assert high["properties"]["priority"] == 0
        client.rpush(lists["realtime high"], json.dumps(high).encode())  # put back (cleanup)
    finally:
        for name, key in lists.items():
            for _ in range(client.llen(key) - before[name]):
                client.lpop(key)


@pytest.mark.redis
@pytest.mark.parametrize("priority", [0, 3, 9])
def test_the_raw_message_at_a_priority_is_where_send_task_puts_it(redis_broker, priority) -> None:  # type: ignore[no-untyped-def]
    """kombu chooses the list by the message's priority; the raw push must choose the same."""
    client, queue = redis_broker
    key = redis_priority_queue(queue, priority, (0, 3, 6, 9))
    client.delete(key)
    try:
        with app.producer_or_acquire() as producer:
            app.send_task(
                services.PROCESS_LEAD_TASK,
                args=["x"],
                producer=producer,
                retry=False,
                queue=queue,
                priority=priority,
            )
        raw_publisher.publish([(services.PROCESS_LEAD_TASK, ["x"], queue, priority)])
        assert client.llen(key) == 2
        by_kombu = message_fields(client.rpop(key))
        raw = message_fields(client.rpop(key))
        assert _without_ids(raw) == _without_ids(by_kombu)
        assert raw["properties"]["priority"] == priority
    finally:
        client.delete(key)


# No deadline: the first example imports kombu's Redis transport (0.6 s on a loaded machine).
@hypothesis_settings(deadline=None)
@given(
    queue=st.text(min_size=1, max_size=30),
    priority=st.integers(min_value=-5, max_value=20),
    steps=st.sets(st.integers(min_value=1, max_value=9), max_size=9).map(
        lambda rest: tuple(sorted({0} | rest))
    ),
)
def test_the_priority_list_name_is_kombus(
    queue: str, priority: int, steps: tuple[int, ...]
) -> None:
    """``redis_priority_queue`` names the list kombu's Redis channel would push to: its
    ``_get_message_priority`` (clamped to 0-9), ``priority`` (down to a step) and ``_q_for_pri``
    with its ``sep``, run on a stand-in for the channel."""
    from kombu.transport import redis as kombu_redis
    from kombu.transport.virtual import base

    channel: Any = SimpleNamespace(
        priority_steps=list(steps),
        sep=kombu_redis.Channel.sep,
        min_priority=base.Channel.min_priority,
        max_priority=base.Channel.max_priority,
        default_priority=base.Channel.default_priority,
    )
    channel.priority = functools.partial(kombu_redis.Channel.priority, channel)
    message = {"properties": {"priority": priority}}
    kombu_priority = base.Channel._get_message_priority(channel, message, reverse=False)
    expected = kombu_redis.Channel._q_for_pri(channel, queue, kombu_priority)
    assert redis_priority_queue(queue, priority, steps) == expected
    assert kombu_redis.Channel.sep == REDIS_PRIORITY_SEP


def test_raw_publishing_only_on_a_plain_redis_broker(settings) -> None:  # type: ignore[no-untyped-def]
    settings.BROKER_IS_FILESYSTEM = False
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}
    settings.ENQUEUE_RAW_REDIS = True
    assert raw_publish_possible()
    settings.ENQUEUE_RAW_REDIS = False
    assert not raw_publish_possible()
    settings.ENQUEUE_RAW_REDIS = True
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": "lr:"}
    assert not raw_publish_possible()  # kombu prefixes its keys then
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}
    settings.CELERY_BROKER_URL = "sentinel://127.0.0.1:26379"
    assert not raw_publish_possible()
    settings.BROKER_IS_FILESYSTEM = True
    settings.CELERY_BROKER_URL = "filesystem://"
    assert not raw_publish_possible()


@pytest.mark.redis
def test_a_broker_that_refuses_trips_the_breaker_and_loses_nothing(settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A failed raw publish is a failed publish: 0 published, the breaker trips, the sweeper
    re-sends (the lead row is the outbox)."""
    if settings.BROKER_IS_FILESYSTEM:
        pytest.skip("needs the Redis broker (REDIS_URL)")

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("broker gone")

    monkeypatch.setattr(raw_publisher, "publish", refuse)
    services.broker_breaker.reset()
    try:
        assert services.leads_enqueue(["00000000-0000-0000-0000-000000000001"], lane="bulk") == 0
        assert not services.broker_breaker.allows()
    finally:
        services.broker_breaker.reset()


@pytest.mark.redis
@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_routes_leads_whose_messages_were_pushed_raw(settings) -> None:  # type: ignore[no-untyped-def]
    """Single and batch kickoffs, published inline by LPUSH, are consumed by `celery` workers."""
    if settings.BROKER_IS_FILESYSTEM:
        pytest.skip("needs the Redis broker (REDIS_URL)")
    from django.test import Client

    from leads.models import Lead, LeadStatus
    from routing.rules_io import rules_import
    from tests.leads.factories import SourceFactory
    from tests.support.processes import celery_worker, wait_until

    settings.ENQUEUE_IN_BACKGROUND = False  # publish inline: no thread between us and Redis
    assert raw_publish_possible()
    rules_import(
        {
            "reps": [{"email": "rep@example.com", "name": "Rep", "timezone": "UTC"}],
            "teams": [
                {
                    "name": "Inbound",
                    "strategy": "round_robin",
                    "members": [{"rep": "rep@example.com"}],
                }
            ],
            "ruleset": {
                "name": "Inbound",
                "rules": [
                    {
                        "name": "Everyone",
                        "priority": 10,
                        "action": {"type": "team", "team": "Inbound"},
                    }
                ],
            },
        },
        publish=True,
    )
    source = SourceFactory()
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer token-{source.slug}"}
    pushed = {"send": 0}
    original = raw_publisher.publish

    def counting(messages):  # type: ignore[no-untyped-def]
        pushed["send"] += len(messages)
        return original(messages)

    raw_publisher.publish = counting  # type: ignore[method-assign]
    try:
        for i in range(3):
            response = client.post(
                f"/api/v1/intake/{source.slug}/",
                {"email": f"single{i}@acme.com"},
                content_type="application/json",
                **auth,
            )
            assert response.status_code == 202, response.content
        response = client.post(
            f"/api/v1/intake/{source.slug}/batch/",
            [{"email": f"batch{i}@acme.com"} for i in range(5)],
            content_type="application/json",
            **auth,
        )
        assert response.status_code == 202, response.content
    finally:
        del raw_publisher.publish
    assert pushed["send"] == 4  # three single-lead messages and one chunk of five
    with celery_worker(concurrency=2) as worker:
        wait_until(
            lambda: Lead.objects.filter(status=LeadStatus.ASSIGNED).count() == 8,
            timeout=90,
            message=lambda: worker.text()[-4000:],
        )


@pytest.mark.redis
def test_the_raw_message_has_the_time_limits_send_task_takes_from_a_registered_task(
    redis_broker,  # type: ignore[no-untyped-def]
) -> None:
    """Once this process has the routing tasks registered (a worker, or any test run that
    imported them), send_task puts their time limits in the message; the raw message had
    none, so the two differed (CI found it: this file's tests failed after the routing ones)."""
    import routing.tasks  # noqa: F401  (registers routing.process_lead with its limits)

    assert services.PROCESS_LEAD_TASK in app.tasks  # finalizes the app, as a worker's start does
    client, queue = redis_broker
    name, args = services.PROCESS_LEAD_TASK, ["0b9f3c52-5c34-4f39-8f1e-7a0e2a1f1c11"]
    with app.producer_or_acquire() as producer:
        app.send_task(name, args=args, producer=producer, retry=False, queue=queue)
    raw_publisher.publish([(name, args, queue, 0)])
    by_kombu = message_fields(client.rpop(queue))
    raw = message_fields(client.rpop(queue))
    assert by_kombu["headers"]["timelimit"] == [
        settings.CELERY_TASK_TIME_LIMIT,
        settings.CELERY_TASK_SOFT_TIME_LIMIT,
    ]
    assert raw["headers"]["timelimit"] == by_kombu["headers"]["timelimit"]
