"""routing.tasks: a chunk processes every id (or hands the rest back after its time slice), and
the soft time limit stops it."""

from __future__ import annotations

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from routing import services, tasks


def test_soft_time_limit_stops_the_chunk(monkeypatch):
    seen: list[str] = []

    def fake_process(*, lead_id: str) -> None:
        seen.append(lead_id)
        if lead_id == "b":
            raise SoftTimeLimitExceeded()

    monkeypatch.setattr(services, "lead_process", fake_process)
    with pytest.raises(SoftTimeLimitExceeded):
        tasks.process_leads(["a", "b", "c"])
    assert seen == ["a", "b"]


def test_one_failure_does_not_stop_the_others(monkeypatch, caplog):
    seen: list[str] = []

    def fake_process(*, lead_id: str) -> None:
        seen.append(lead_id)
        if lead_id == "b":
            raise RuntimeError("boom")

    monkeypatch.setattr(services, "lead_process", fake_process)
    tasks.process_leads(["a", "b", "c"])
    assert seen == ["a", "b", "c"]
    assert "1 of 3 lead(s) in a chunk failed" in caplog.text


@pytest.fixture(autouse=True)
def _no_slices(settings):  # type: ignore[no-untyped-def]
    settings.ROUTING_CHUNK_SLICE_SECONDS = 0  # the slicing has tests of its own, below
    # The chunk's loop a lead at a time (the operator's ROUTING_BATCH_SIZE=1): batches and
    # their slicing are tested in test_pipeline_batch.py.
    settings.ROUTING_BATCH_SIZE = 1


def test_every_id_of_a_long_chunk_is_processed(monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(services, "lead_process", lambda *, lead_id: seen.append(lead_id))
    ids = [f"lead-{i}" for i in range(1500)]
    tasks.process_leads(ids)
    assert seen == ids


@pytest.mark.django_db
def test_a_chunk_past_its_time_slice_hands_the_rest_back_to_its_lanes_queue(monkeypatch):
    """So a realtime lead waits for a slice, not for the whole chunk (leads.lanes)."""
    import contextlib
    from typing import Any

    from config.celery import app
    from leads.models import Lead, LeadStatus
    from tests.leads.factories import LeadFactory

    sent: list[tuple[str, Any, str]] = []
    monkeypatch.setattr(
        app, "send_task", lambda name, args, **kw: sent.append((name, args[0], kw["queue"]))
    )
    monkeypatch.setattr(app, "producer_or_acquire", lambda *a, **k: contextlib.nullcontext())
    from django.conf import settings as django_settings

    # Through send_task, on any broker.
    monkeypatch.setattr(django_settings, "ENQUEUE_RAW_REDIS", False)
    leads = [LeadFactory(lane="bulk", email=f"p{i}@acme.com") for i in range(5)]
    ids = [str(lead.pk) for lead in leads]
    outcome = services.leads_process_chunk(lead_ids=ids, slice_seconds=1e-9)
    assert (outcome.processed, outcome.handed_back) == (1, 4)
    assert sent == [("routing.process_leads", ids[1:], "routing.bulk")]
    assert Lead.objects.get(pk=ids[0]).status != LeadStatus.RECEIVED
    assert Lead.objects.filter(pk__in=ids[1:], status=LeadStatus.RECEIVED).count() == 4


@pytest.mark.django_db
def test_a_chunk_whose_hand_back_fails_finishes_its_leads_itself():
    from leads.models import Lead, LeadStatus
    from leads.services import broker_breaker
    from tests.leads.factories import LeadFactory

    broker_breaker.trip(30)  # the broker failed a moment ago: nothing is published
    try:
        ids = [str(LeadFactory(email=f"p{i}@acme.com").pk) for i in range(3)]
        outcome = services.leads_process_chunk(lead_ids=ids, slice_seconds=1e-9)
    finally:
        broker_breaker.reset()
    assert (outcome.processed, outcome.handed_back) == (3, 0)
    assert not Lead.objects.filter(pk__in=ids, status=LeadStatus.RECEIVED).exists()


@pytest.mark.redis
@pytest.mark.django_db
def test_a_bulk_chunk_hands_back_as_soon_as_a_realtime_lead_waits(settings):
    """On Redis a chunk does not wait for its time slice: between leads it asks whether a
    realtime routing message waits, and lets it go first."""
    import redis

    from config.celery import app
    from leads.models import Lead, LeadStatus
    from leads.services import realtime_peek
    from tests.leads.factories import LeadFactory

    if settings.BROKER_IS_FILESYSTEM:
        pytest.skip("the filesystem broker has no queue to ask")
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    settings.ROUTING_CHUNK_PEEK_SECONDS = 0.0
    leads = [LeadFactory(lane="bulk", email=f"q{i}@acme.com") for i in range(4)]
    ids = [str(lead.pk) for lead in leads]
    from leads.broker_publish import redis_priority_queue

    # Every priority list of both queues (kombu's: "<queue>", "<queue>\x06\x163", ...).
    keys = [
        redis_priority_queue(q, step, (0, 3, 6, 9))
        for q in ("routing.realtime", "routing.bulk")
        for step in (0, 3, 6, 9)
    ]
    client.delete(*keys)
    try:
        # Nothing realtime waits: the whole chunk runs (a slice of a minute never ends here).
        outcome = services.leads_process_chunk(lead_ids=ids[:2], slice_seconds=60)
        assert (outcome.processed, outcome.handed_back) == (2, 0)
        settings.ROUTING_CHUNK_PEEK_SECONDS = 1e-9
        client.rpush("routing.realtime", b"a waiting form lead's message")
        assert realtime_peek.waiting()
        outcome = services.leads_process_chunk(lead_ids=ids[2:], slice_seconds=60)
        assert (outcome.processed, outcome.handed_back) == (1, 1)
        assert Lead.objects.get(pk=ids[3]).status == LeadStatus.RECEIVED
        with app.connection_for_read() as conn:
            # The rest, handed back: in the bulk queue's list for a normal-priority lead.
            assert conn.default_channel._size("routing.bulk") == 1
            assert client.llen(redis_priority_queue("routing.bulk", 9, (0, 3, 6, 9))) == 1
    finally:
        client.delete(*keys)
