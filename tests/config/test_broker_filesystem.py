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
from hypothesis import given
from hypothesis import strategies as st
from kombu import Connection, Consumer, Exchange, Queue

from config.broker_filesystem import message_filename, queue_has_message
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


def _drain(connection: Connection, queues: list[Queue], count: int) -> list[str]:
    taken: list[str] = []

    def on_message(body: dict[str, Any], message: Any) -> None:
        taken.append(body["n"])
        message.ack()

    with Consumer(connection, queues=queues, callbacks=[on_message], prefetch_count=1):
        for _ in range(count * 2):
            if len(taken) == count:
                break
            try:
                connection.drain_events(timeout=1)
            except TimeoutError:
                break
    return taken


def test_a_queues_high_priority_messages_are_taken_first_and_bulk_stays_behind(
    tmp_path: Path,
) -> None:
    """Priority within a queue (lower first, as Redis's steps), each priority first in, first
    out; the queue order still first: a high bulk message waits for every realtime one. The
    priorities are ``lanes.routing_priority``'s, as ``leads_enqueue`` publishes them."""
    folder = tmp_path / "queue"
    folder.mkdir()
    (tmp_path / "processed").mkdir()
    queues = [_queue(REALTIME, tmp_path.name), _queue(BULK, tmp_path.name)]
    sent = [
        (BULK, "bulk-high", lanes.routing_priority(lanes.BULK, True)),
        (REALTIME, "normal0", lanes.routing_priority(lanes.REALTIME, False)),
        (REALTIME, "normal1", lanes.routing_priority(lanes.REALTIME, False)),
        (REALTIME, "high0", lanes.routing_priority(lanes.REALTIME, True)),
        (REALTIME, "normal2", lanes.routing_priority(lanes.REALTIME, False)),
        (REALTIME, "high1", lanes.routing_priority(lanes.REALTIME, True)),
        (BULK, "bulk-normal", lanes.routing_priority(lanes.BULK, False)),
    ]
    with _connection(folder) as connection:
        producer = connection.Producer()
        for queue_name, name, priority in sent:
            queue = queues[0] if queue_name == REALTIME else queues[1]
            producer.publish(
                {"n": name},
                exchange=queue.exchange,
                routing_key=queue_name,
                declare=[queue],
                priority=priority,
            )
        assert queue_has_message(folder, REALTIME)
        taken = _drain(connection, queues, len(sent))
    assert taken == ["high0", "high1", "normal0", "normal1", "normal2", "bulk-high", "bulk-normal"]


@given(
    messages=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=9), st.integers(min_value=0, max_value=10**19)
        ),
        min_size=1,
        max_size=30,
    )
)
def test_file_names_sort_by_priority_then_time(messages: list[tuple[int, int]]) -> None:
    """kombu's ``_get`` takes the first matching name in sorted order: that is the order of
    (priority, nanoseconds), whatever the number of digits; and kombu still sees the queue."""
    names = {
        message_filename(REALTIME, priority, ns, f"{index:032x}"): (priority, ns, index)
        for index, (priority, ns) in enumerate(messages)
    }
    assert [names[name] for name in sorted(names)] == sorted(names.values())
    assert all(name.partition(".")[2] == f"{REALTIME}.msg" for name in names)
