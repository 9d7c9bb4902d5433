"""The status process's Redis pub/sub listener when its connection dies without a word.

A connection that goes silent (a hung server, a half-open TCP connection after a network fault)
gives a blocking pub/sub read nothing to fail on: the listener must notice it by itself, drop it
and subscribe again, and the waiters meanwhile answer by their ``wait`` bound.

Real processes on loopback, started by the test: a throwaway ``redis-server`` on a free port
(SIGSTOPped and SIGCONTed; never the machine's Redis), a small TCP proxy in front of it that can
freeze its connections, and the status process (uvicorn) listening through either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from leads.models import Lead, LeadStatus
from leads.status import status_link_make
from tests.leads.factories import LeadFactory, SourceFactory
from tests.leads.test_status_wake import Waiter
from tests.reliability.harness import redis_server
from tests.support.processes import ManagedProcess, free_port, status_server_process, wait_until

pytestmark = [
    pytest.mark.redis_server,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

# Short, so that the test takes seconds: a silent connection is dropped after 1 + 1 s.
LISTENER = {
    "STATUS_LISTENER_PING_SECONDS": "1",
    "STATUS_LISTENER_TIMEOUT_SECONDS": "1",
    "STATUS_LISTENER_BACKOFF_MAX_SECONDS": "2",
}
SUBSCRIBED = "lead status listener subscribed"
LOST = "lead status listener lost Redis"


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    port = free_port()
    server = redis_server(port, tmp_path)

    def accepting() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return True
        return False

    try:
        wait_until(accepting, timeout=10, interval=0.05, message="redis-server did not start")
        yield port, server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGCONT)
        server.terminate()
        server.wait(10)


class FreezingProxy:
    """A TCP proxy to ``port``; ``freeze()`` stops every connection open at that moment from
    carrying another byte either way, while keeping it open (a half-open connection: nothing
    fails, nothing arrives). Connections opened later are carried as usual."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.generation = 0
        self.frozen_below = 0
        self.sockets: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self.frozen_below = self.generation + 1

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            self.generation += 1
            generation = self.generation
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, generation), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, generation: int) -> None:
        source.settimeout(0.1)
        while not self.closed:
            if generation < self.frozen_below:
                time.sleep(0.1)  # frozen: read nothing, send nothing, close nothing
                continue
            try:
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            with contextlib.suppress(OSError):
                sink.sendall(data)

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()


def _waiter(url: str) -> Waiter:
    waiter = Waiter(url)
    waiter.start()
    return waiter


def _announce(port: int, lead_id: object) -> None:
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=2) as client:
        client.publish(settings.STATUS_CHANNEL, str(lead_id))


def _answered_within(waiter: Waiter, seconds: float) -> float:
    waiter.join(15)
    assert waiter.error is None, waiter.error
    assert waiter.answered_at is not None
    took = waiter.answered_at - waiter.started_at
    assert took < seconds, f"answered after {took:.1f} s"
    return took


def _woken_promptly(proc: ManagedProcess, url: str, redis_port: int, lead_id: object) -> None:
    """A waiter (wait=10) is answered within 2 s of an announcement of its lead."""
    waiter = _waiter(f"{url}?wait=10")
    time.sleep(1.0)  # registered, read the lead once, now waiting
    assert waiter.is_alive(), (waiter.answer, waiter.error)
    announced = time.monotonic()
    _announce(redis_port, lead_id)
    waiter.join(15)
    assert waiter.answered_at is not None, proc.text()[-3000:]
    assert waiter.error is None, waiter.error
    assert waiter.answer is not None
    assert waiter.answer["status"] == "received"
    took = waiter.answered_at - announced
    assert took < 2.0, f"woken {took:.1f} s after the announcement:\n{proc.text()[-3000:]}"


def _link() -> tuple[str, object]:
    source = SourceFactory(slug="website")
    lead = LeadFactory(source=source)
    return status_link_make(lead_id=lead.id, source=source, now=timezone.now()).url, lead.id


def _subscribed(proc: ManagedProcess, times: int, timeout: float) -> None:
    wait_until(
        lambda: proc.text().count(SUBSCRIBED) >= times,
        timeout=timeout,
        interval=0.1,
        message=lambda: f"not subscribed {times} time(s):\n{proc.text()[-3000:]}",
    )


def test_a_hung_redis_is_noticed_waiters_answer_by_their_bound_and_it_subscribes_again(
    throwaway_redis: tuple[int, subprocess.Popen[bytes]],
) -> None:
    port, server = throwaway_redis
    path, lead_id = _link()
    env = {"STATUS_REDIS_URL": f"redis://127.0.0.1:{port}/0", **LISTENER}
    with status_server_process(env) as (base, proc):
        url = f"{base}{path}"
        _waiter(f"{url}?wait=1").join(10)  # the first waiter starts the listener
        _subscribed(proc, 1, timeout=10)
        _woken_promptly(proc, url, port, lead_id)

        os.kill(server.pid, signal.SIGSTOP)  # connections stay open; nothing answers
        stopped = time.monotonic()
        during = [_waiter(f"{url}?wait=3") for _ in range(3)]
        noticed = wait_until(
            lambda: LOST in proc.text(),
            timeout=10,
            interval=0.1,
            message=lambda: f"the listener never noticed:\n{proc.text()[-3000:]}",
        )
        print(f"noticed {noticed:.1f} s after SIGSTOP")
        assert noticed < 5.0  # ping every 1 s, silent for 1 + 1 s: dropped
        for waiter in during:  # they answer by their own bound, with a last read of the lead
            _answered_within(waiter, 3.0 + 1.5)
            assert waiter.answer is not None
            assert waiter.answer["status"] == "received"
        assert time.monotonic() - stopped < 10

        # An outcome written while Redis hangs: its announcement is lost (nobody hears it), so
        # the waiter learns it when the listener is back, not at the end of its 10 s wait.
        late = _waiter(f"{url}?wait=10")
        time.sleep(2.0)  # it waited 1 s for the listener, read the lead (received), waits on
        assert late.is_alive(), (late.answer, late.error)
        Lead.objects.filter(pk=lead_id).update(status=LeadStatus.EXCLUDED)
        os.kill(server.pid, signal.SIGCONT)
        _subscribed(proc, 2, timeout=10)
        took = _answered_within(late, 8.0)
        print(f"the waiter of an outcome written during the outage answered after {took:.1f} s")
        assert late.answer == {"id": str(lead_id), "status": "not_assigned", "owner": None}

        Lead.objects.filter(pk=lead_id).update(status=LeadStatus.RECEIVED)
        _woken_promptly(proc, url, port, lead_id)


def test_a_half_open_connection_is_dropped_and_announcements_wake_waiters_again(
    throwaway_redis: tuple[int, subprocess.Popen[bytes]],
) -> None:
    """Negative control of the fix: before it, a frozen connection was read for ever, and every
    waiter afterwards answered only at the end of its wait (10 s here), never woken."""
    port, _server = throwaway_redis
    proxy = FreezingProxy(port)
    path, lead_id = _link()
    env = {"STATUS_REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0", **LISTENER}
    try:
        with status_server_process(env) as (base, proc):
            url = f"{base}{path}"
            _waiter(f"{url}?wait=1").join(10)
            _subscribed(proc, 1, timeout=10)
            _woken_promptly(proc, url, port, lead_id)

            proxy.freeze()  # the listener's connection: open, and silent for ever
            time.sleep(6.0)  # noticed (2 s of silence), subscribed again through a new one
            _woken_promptly(proc, url, port, lead_id)
            assert LOST in proc.text()
            assert proc.text().count(SUBSCRIBED) >= 2
    finally:
        proxy.close()
