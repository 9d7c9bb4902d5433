"""One enrichment task takes a batch of due parked leads and has their calls in flight together.

Against a threaded stand-in of the vendor on loopback that counts the calls it serves at once:
the calls overlap (never more than ENRICHMENT_HTTP_CONCURRENCY), each lead's outcome is its own
(a 500, a timeout or a 429 fails only its lead), the finished leads go back to routing in one
publish, and the other leads' own messages then find nothing to do.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from leads import lanes
from leads.models import Lead
from leads.services import PROCESS_LEAD_TASK, PROCESS_LEADS_TASK
from routing.enrichment import lead_enrich
from routing.enrichment.ratelimit import CacheWindowLimiter, RedisTokenBucket
from routing.enrichment.store import redis_client
from tests.routing.enrichment.conftest import parked_lead

pytestmark = pytest.mark.django_db


class StandIn:
    """A vendor whose answer depends on the e-mail's local part: ``boom`` 500, ``slow`` answers
    after the client's timeout, ``limited`` 429, ``nobody`` 404, anyone else a JSON object after
    ``delay`` seconds. Counts the calls it serves at once."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.emails: list[str] = []
        self.server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
        self.server.expect_request("/enrich", method="POST").respond_with_handler(self.handle)

    def handle(self, request: Request) -> Response:
        email = str(json.loads(request.data).get("email") or "")
        with self.lock:
            self.emails.append(email)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            local = email.split("@")[0]
            if local == "slow":
                time.sleep(2.0)
            else:
                time.sleep(self.delay)
            if local == "boom":
                return Response("down", status=500)
            if local == "limited":
                return Response("slow down", status=429, headers={"Retry-After": "30"})
            if local == "nobody":
                return Response("unknown", status=404)
            return Response('{"industry": "Retail"}', mimetype="application/json")
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.fixture
def stand_in(http: Any, settings: Any) -> Iterator[StandIn]:
    vendor = StandIn(delay=0.2)
    vendor.server.start()
    settings.ENRICHMENT_HTTP_URL = vendor.server.url_for("/enrich")
    settings.ENRICHMENT_HTTP_TIMEOUT_SECONDS = 1.0
    settings.ENRICHMENT_HTTP_CONCURRENCY = 4
    settings.ENRICHMENT_BATCH_SIZE = 10
    try:
        yield vendor
    finally:
        vendor.server.clear()
        vendor.server.stop()


def _routing_publishes(sent: Any) -> list[list[str]]:
    found = []
    for name, args, _ in sent:
        if name == PROCESS_LEADS_TASK:
            found.append(list(args[0]))
        elif name == PROCESS_LEAD_TASK:
            found.append([args[0]])
    return found


def test_one_task_enriches_every_due_lead_with_calls_in_flight_together(
    stand_in, sent, django_capture_on_commit_callbacks
):
    leads = [parked_lead(email=f"lead{i}@acme.com", industry="") for i in range(10)]
    started = time.monotonic()
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_enrich(lead_id=leads[0].id) == "done"
    took = time.monotonic() - started
    assert sorted(stand_in.emails) == sorted(lead.email for lead in leads)
    assert 1 < stand_in.max_in_flight <= 4  # overlapping, never above the setting
    assert took < 10 * 0.2  # one after the other would take 2 s
    for lead in leads:
        lead.refresh_from_db()
        assert (lead.enrichment_status, lead.industry) == ("done", "Retail")
        assert lead.enrichment_attempts == 1
    # Handed back to routing as one group, in one message.
    (message,) = _routing_publishes(sent)
    assert sorted(message) == sorted(str(lead.id) for lead in leads)


def test_the_other_leads_messages_then_find_nothing_in_one_query(
    stand_in, django_assert_num_queries
):
    leads = [parked_lead(email=f"lead{i}@acme.com") for i in range(3)]
    assert lead_enrich(lead_id=leads[0].id) == "done"
    with django_assert_num_queries(1):  # the claim's UPDATE, which matches nothing
        assert lead_enrich(lead_id=leads[1].id) is None
    assert len(stand_in.emails) == 3


def test_a_failing_slow_or_rate_limited_call_fails_only_its_own_lead(
    stand_in, sent, django_capture_on_commit_callbacks
):
    good = [parked_lead(email=f"good{i}@acme.com", industry="") for i in range(3)]
    boom = parked_lead(email="boom@acme.com")
    slow = parked_lead(email="slow@acme.com")
    limited = parked_lead(email="limited@acme.com")
    nobody = parked_lead(email="nobody@acme.com")
    before = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_enrich(lead_id=good[0].id) == "done"
    for lead in good:
        lead.refresh_from_db()
        assert (lead.enrichment_status, lead.industry) == ("done", "Retail")
    nobody.refresh_from_db()
    assert nobody.enrichment["http"]["status"] == "no_match"
    for lead, error in ((boom, "HTTP 500"), (slow, "timeout after 1 s"), (limited, "HTTP 429")):
        lead.refresh_from_db()
        assert lead.enrichment_status == "pending"  # a retry of its own, nothing else
        assert lead.enrichment_attempts == 1
        assert lead.enrichment["http"]["error"].startswith(error)
        assert lead.enrichment_next_at > before
    limited.refresh_from_db()
    assert (limited.enrichment_next_at - before).total_seconds() >= 29  # its Retry-After
    (handed_back,) = _routing_publishes(sent)  # one message for the finished ones
    assert sorted(handed_back) == sorted(str(lead.id) for lead in [*good, nobody])


def test_without_enough_tokens_the_rest_wait_without_counting_an_attempt(stand_in, settings):
    settings.ENRICHMENT_HTTP_RATE_PER_MINUTE = 3
    settings.ENRICHMENT_HTTP_BURST = 3
    settings.REALTIME_RESERVED_SHARE = 0
    leads = [parked_lead(email=f"lead{i}@acme.com") for i in range(5)]
    lead_enrich(lead_id=leads[0].id)
    assert len(stand_in.emails) == 3  # the budget, whichever limiter keeps it
    states = []
    for lead in leads:
        lead.refresh_from_db()
        states.append((lead.enrichment_status, lead.enrichment_attempts))
    assert sorted(states) == [("done", 1)] * 3 + [("pending", 0)] * 2


def test_the_batch_takes_realtime_leads_first(stand_in, settings):
    settings.ENRICHMENT_BATCH_SIZE = 2
    early = timezone.now() - timedelta(minutes=5)
    own = parked_lead(email="own@acme.com", lane=lanes.BULK)
    parked_lead(email="bulk@acme.com", lane=lanes.BULK, enrichment_next_at=early)
    parked_lead(email="realtime@acme.com", lane=lanes.REALTIME)
    lead_enrich(lead_id=own.id)
    assert sorted(stand_in.emails) == ["own@acme.com", "realtime@acme.com"]
    assert Lead.objects.get(email="bulk@acme.com").enrichment_status == "pending"


def test_an_erased_lead_in_the_batch_is_closed_without_a_call(stand_in):
    leads = [parked_lead(email=f"lead{i}@acme.com") for i in range(3)]
    Lead.objects.filter(id=leads[2].id).update(erased_at=timezone.now())
    assert lead_enrich(lead_id=leads[0].id) == "done"
    assert sorted(stand_in.emails) == ["lead0@acme.com", "lead1@acme.com"]
    assert Lead.objects.get(id=leads[2].id).status == "excluded"


# --- The bulk take of the limiters ---------------------------------------------------------


def _check_take_batch(limiter: Any, capacity: int, reserve: int) -> None:
    grant = limiter.take_batch(realtime=0, other=capacity + 5, keep=reserve)
    assert (grant.realtime, grant.other) == (0, capacity - reserve)
    assert grant.wait_seconds > 0
    grant = limiter.take_batch(realtime=reserve + 5, other=3, keep=reserve)
    assert (grant.realtime, grant.other) == (reserve, 0)  # realtime may take the share
    grant = limiter.take_batch(realtime=1, other=1, keep=reserve)
    assert (grant.realtime, grant.other) == (0, 0)
    assert not limiter.take().granted  # the one-token take sees the same budget


@pytest.mark.redis
def test_the_redis_bucket_grants_part_of_a_batch_exactly(settings):
    settings.REALTIME_RESERVED_SHARE = 0.2
    client = redis_client()
    key = f"leadrouter:test:{uuid.uuid4().hex}"
    bucket = RedisTokenBucket(client, key, rate_per_minute=0.001, burst=10)
    # The reserve sits on top of the burst: 10 for anyone, 2 more for realtime.
    _check_take_batch(bucket, capacity=12, reserve=2)
    bucket.pause(30)
    assert bucket.take_batch(realtime=1, other=1, keep=0).wait_seconds > 25
    client.delete(f"{key}:bucket", f"{key}:pause")


def test_the_cache_window_grants_part_of_a_batch_exactly(settings):
    settings.REALTIME_RESERVED_SHARE = 0.2
    window = CacheWindowLimiter(f"leadrouter:test:{uuid.uuid4().hex}", rate_per_minute=10)
    _check_take_batch(window, capacity=10, reserve=2)
    assert window.available() == 0


def test_a_parked_lead_is_sent_after_the_gathering_time_unless_realtime(
    sent, settings, django_capture_on_commit_callbacks
):
    """Single posts are parked one at a time: a normal or bulk lead's task waits
    ENRICHMENT_GATHER_SECONDS so that the leads parked meanwhile are due together when it claims
    its batch; a realtime lead's is sent at once."""
    from routing.enrichment import enrichment_enqueue_after_commit

    settings.ENRICHMENT_GATHER_SECONDS = 0.3
    normal = parked_lead(email="n@acme.com")
    bulk = parked_lead(email="b@acme.com", lane=lanes.BULK)
    realtime = parked_lead(email="r@acme.com", lane=lanes.REALTIME)
    with django_capture_on_commit_callbacks(execute=True):
        for lead in (normal, bulk, realtime):
            enrichment_enqueue_after_commit(lead.pk)
    countdowns = {args[0]: options.get("countdown") for _name, args, options in sent}
    assert countdowns == {str(normal.pk): 0.3, str(bulk.pk): 0.3, str(realtime.pk): None}
    settings.ENRICHMENT_GATHER_SECONDS = 0
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        enrichment_enqueue_after_commit(normal.pk)
    assert [options.get("countdown") for _name, _args, options in sent] == [None]


def test_a_task_stopped_mid_batch_makes_no_more_calls(stand_in, settings):
    """The soft time limit arrives (here: a timer raising in the task's thread, as Celery's
    signal does) while the batch's calls run 2 at a time: the calls not yet started are
    cancelled, not made for answers nobody would read."""
    import signal

    class Stopped(Exception):
        pass

    settings.ENRICHMENT_HTTP_CONCURRENCY = 2
    leads = [parked_lead(email=f"lead{i}@acme.com") for i in range(10)]

    def stop(*_args: Any) -> None:
        raise Stopped

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    try:
        with pytest.raises(Stopped):
            lead_enrich(lead_id=leads[0].id)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    time.sleep(0.6)  # long enough for more waves to have started, had they not been cancelled
    assert len(stand_in.emails) == 2
