"""The embedded broker takes a worker's queues in order, as Redis does (config.broker_filesystem).

kombu's filesystem transport took them in turn: a worker freed by a bulk chunk took the next
queue of its cycle, ``routing.bulk`` as often as ``routing.realtime``, and form leads queued up
behind a backlog (tests/routing/test_lanes_workers.py failed so in CI, on the embedded run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from kombu import Connection, Consumer, Exchange, Queue

from config.broker_filesystem import queue_has_message
from config.celery import app
from leads import lanes
from leads.services import realtime_peek

REALTIME = lanes.routing_queue(lanes.REALTIME)
BULK = lanes.routing_queue(lanes.BULK)


def _connection(folder: Path) -> Connection:
    return Connection(
        "filesystem://",
        transport="config.broker_filesystem:Transport",
        transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "processed_folder": str(folder.parent / "processed"),
            "control_folder": str(folder.parent / "control"),
            "store_processed": False,
            "polling_interval": 0.01,
        },
    )


def _queue(name: str, exchange: str) -> Queue:
    # Exchanges of each test's own: kombu keeps the bindings it declared in a state global to
    # the transport, and would not bind them again in another folder.
    return Queue(name, Exchange(f"{exchange}{name}", type="direct"), routing_key=name)


def test_a_worker_takes_the_first_of_its_queues_that_holds_a_message(tmp_path: Path) -> None:
    folder = tmp_path / "queue"
    folder.mkdir()
    (tmp_path / "processed").mkdir()
    queues = [_queue(REALTIME, tmp_path.name), _queue(BULK, tmp_path.name)]
    taken: list[str] = []
    with _connection(folder) as connection:
        producer = connection.Producer()
        # The backlog first, then form leads, interleaved with more backlog.
        for i in range(4):
            producer.publish(
                {"n": f"bulk{i}"},
                exchange=queues[1].exchange,
                routing_key=BULK,
                declare=[queues[1]],
            )
        for i in range(3):
            producer.publish(
                {"n": f"realtime{i}"},
                exchange=queues[0].exchange,
                routing_key=REALTIME,
                declare=[queues[0]],
            )
            producer.publish(
                {"n": f"bulk{4 + i}"},
                exchange=queues[1].exchange,
                routing_key=BULK,
                declare=[queues[1]],
            )

        def on_message(body: dict[str, Any], message: Any) -> None:
            taken.append(body["n"])
            message.ack()

        with Consumer(connection, queues=queues, callbacks=[on_message], prefetch_count=1):
            for _ in range(20):
                if len(taken) == 10:
                    break
                try:
                    connection.drain_events(timeout=1)
                except TimeoutError:
                    break
    # kombu's own cycle took them in turn: bulk0, realtime0, bulk1, realtime1, ...
    assert sorted(taken[:3]) == ["realtime0", "realtime1", "realtime2"], taken
    assert sorted(taken[3:]) == [f"bulk{i}" for i in range(7)], taken


def test_a_filesystem_message_for_the_realtime_queue_is_seen(tmp_path: Path) -> None:
    folder = tmp_path / "queue"
    folder.mkdir()
    (tmp_path / "processed").mkdir()
    assert not queue_has_message(folder, REALTIME)
    with _connection(folder) as connection:
        queue = _queue(BULK, tmp_path.name)
        connection.Producer().publish(
            {}, exchange=queue.exchange, routing_key=BULK, declare=[queue]
        )
        assert not queue_has_message(folder, REALTIME)  # routing.bulk is not routing.realtime
        queue = _queue(REALTIME, tmp_path.name)
        connection.Producer().publish(
            {}, exchange=queue.exchange, routing_key=REALTIME, declare=[queue]
        )
    assert queue_has_message(folder, REALTIME)
    assert not queue_has_message(tmp_path / "missing", REALTIME)


def test_the_embedded_broker_uses_the_ordered_transport_and_its_peek_sees_realtime() -> None:
    if not settings.BROKER_IS_FILESYSTEM:
        pytest.skip("this run's broker is Redis (queue_order_strategy=priority)")
    with app.connection_for_read() as connection:
        assert type(connection.transport).__module__ == "config.broker_filesystem"
    folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
    app.control.purge()
    assert not realtime_peek.waiting()
    with app.connection_for_write() as connection:
        queue = _queue(REALTIME, exchange="")
        connection.Producer().publish(
            {}, exchange=queue.exchange, routing_key=REALTIME, declare=[queue]
        )
    try:
        assert realtime_peek.waiting()  # a bulk chunk hands its rest back (leads_process_chunk)
    finally:
        for path in folder.glob(f"*.{REALTIME}.msg"):
            path.unlink()
