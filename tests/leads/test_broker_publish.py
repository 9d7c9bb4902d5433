"""The kickoff's raw LPUSH of prebuilt Celery messages (leads.broker_publish, issue 18).

What it pushes must be what ``send_task`` would push (field by field, ids aside), and a real
``celery`` worker must consume it and route the lead.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings

from config.celery import app
from leads import lanes, services
from leads.broker_publish import message_fields, raw_publish_possible, raw_publisher

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
    raw_publisher.publish([(name, args, queue)])
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
                (services.PROCESS_LEAD_TASK, ["a"], queue),
                (services.PROCESS_LEAD_TASK, ["b"], other),
                (services.PROCESS_LEAD_TASK, ["c"], queue),
            ]
        )
        # Workers pop from the right: the first given is consumed first.
        assert [message_fields(client.rpop(queue))["body"][0] for _ in range(2)] == [["a"], ["c"]]
        assert message_fields(client.rpop(other))["body"][0] == ["b"]
    finally:
        client.delete(other)


@pytest.mark.redis
def test_leads_enqueue_pushes_each_kickoffs_message_to_its_lanes_queue(redis_broker) -> None:  # type: ignore[no-untyped-def]
    client, _queue = redis_broker
    realtime, bulk = lanes.routing_queue(lanes.REALTIME), lanes.routing_queue(lanes.BULK)
    before = {q: client.llen(q) for q in (realtime, bulk)}
    ids = [f"00000000-0000-0000-0000-{i:012d}" for i in range(3)]
    try:
        sent = services.leads_enqueue_groups(
            [([ids[0]], lanes.REALTIME), ([ids[1]], lanes.REALTIME), (ids[2:], lanes.BULK)]
        )
        assert sent == 3
        assert client.llen(realtime) == before[realtime] + 2
        assert client.llen(bulk) == before[bulk] + 1
    finally:
        for queue in (realtime, bulk):
            for _ in range(client.llen(queue) - before[queue]):
                client.lpop(queue)


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
