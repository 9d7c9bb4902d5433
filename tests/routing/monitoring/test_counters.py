"""/metrics counters kept incrementally: totals up to a settled mark plus the rows past it."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from audit.models import EventType
from audit.services import event_record
from leads.models import LeadStatus
from routing.monitoring.counters import _count, counters_current, counters_refresh
from routing.monitoring.models import MetricsState
from tests.leads.factories import LeadFactory, SourceFactory
from tests.routing.factories import AssignmentFactory

pytestmark = pytest.mark.django_db


def _burst(source: Any, n: int) -> None:
    for _ in range(n):
        lead = LeadFactory(source=source, status=LeadStatus.ASSIGNED)
        event_record(type=EventType.ASSIGNED, lead=lead, data={"kind": "initial"})
        AssignmentFactory(lead=lead, assigned_at=lead.received_at + timedelta(seconds=3))
    event_record(type=EventType.SLA_BREACHED, lead=lead)


def _totals(now: Any) -> tuple[int, int, int, int]:
    counters = counters_current(now=now).counters
    return (
        sum(counters.received_by_source.values()),
        counters.processed_by_status[LeadStatus.ASSIGNED],
        counters.assign_count,
        counters.sla_breaches,
    )


def test_marks_move_past_settled_rows_and_the_totals_still_agree(settings: Any) -> None:
    settings.METRICS_SETTLE_SECONDS = 300
    source = SourceFactory(slug="webinar")
    start = timezone.now()
    _burst(source, 3)
    assert counters_refresh(now=start)
    state = MetricsState.objects.get()
    assert state.data["events_upto"] == 0  # nothing is settled yet: all counted live
    assert _totals(start) == (3, 3, 3, 1)

    later = start + timedelta(seconds=301)
    counters_refresh(now=later)
    state.refresh_from_db()
    assert state.data["events_upto"] > 0
    assert state.data["assignments_upto"] > 0
    # The observation is stamped when its maximum ids were read (the caller's clock moved on
    # by the time the refresh took), not at the caller's ``now``.
    leads_before = datetime.fromisoformat(state.data["leads_before"])
    assert start <= leads_before < start + timedelta(seconds=5)
    assert state.data["totals"]["assign_count"] == 3
    assert state.data["totals"]["sla_breaches"] == 1
    # The rows under the marks are no longer read at scrape: the rows past them are none.
    marks_tail = _count(
        events_after=state.data["events_upto"],
        assignments_after=state.data["assignments_upto"],
        leads_from=start,
    )
    assert marks_tail.assign_count == 0
    assert marks_tail.sla_breaches == 0
    assert _totals(later) == (3, 3, 3, 1)

    _burst(source, 2)  # after the marks: counted live, then settled on a later refresh
    seen = [_totals(later)]
    counters_refresh(now=later + timedelta(seconds=1))
    seen.append(_totals(later + timedelta(seconds=1)))
    counters_refresh(now=later + timedelta(seconds=400))
    seen.append(_totals(later + timedelta(seconds=400)))
    assert seen == [(5, 5, 5, 2)] * 3
    got = counters_current(now=later).counters
    assert got.received_by_source == {str(source.pk): 5}
    assert got.assign_buckets[-1] == 5  # all within 3600 s
    assert got.assign_sum_seconds == pytest.approx(15.0, abs=0.01)


def test_a_scrape_refreshes_a_stale_state_without_waiting_for_the_check(settings: Any) -> None:
    settings.METRICS_REFRESH_SECONDS = 60
    now = timezone.now()
    assert not MetricsState.objects.exists()
    counters_current(now=now)
    refreshed = MetricsState.objects.get().refreshed_at
    counters_current(now=now + timedelta(seconds=30))
    assert MetricsState.objects.get().refreshed_at == refreshed
    counters_current(now=now + timedelta(seconds=61))
    assert MetricsState.objects.get().refreshed_at == now + timedelta(seconds=61)


def test_leads_per_status_waiting_ones_live_the_others_every_few_minutes(settings: Any) -> None:
    settings.METRICS_STATUS_REFRESH_SECONDS = 300
    now = timezone.now()
    LeadFactory(status=LeadStatus.ASSIGNED)
    counters_refresh(now=now)
    LeadFactory(status=LeadStatus.ASSIGNED)
    LeadFactory(status=LeadStatus.RECEIVED)
    LeadFactory(status=LeadStatus.UNASSIGNED)
    statuses = counters_current(now=now).statuses
    assert statuses[LeadStatus.RECEIVED] == 1
    assert statuses[LeadStatus.UNASSIGNED] == 1
    assert statuses[LeadStatus.ASSIGNED] == 1  # recounted at the next status refresh
    counters_refresh(now=now + timedelta(seconds=300))
    assert counters_current(now=now + timedelta(seconds=300)).statuses[LeadStatus.ASSIGNED] == 2


def test_the_backlog_check_moves_the_marks(settings: Any) -> None:
    from routing.monitoring.backlog import backlog_check

    settings.METRICS_SETTLE_SECONDS = 60
    start = timezone.now()
    _burst(SourceFactory(), 2)
    backlog_check(now=start)
    backlog_check(now=start + timedelta(seconds=61))
    state = MetricsState.objects.get()
    assert state.data["totals"]["assign_count"] == 2


def test_the_observation_is_stamped_when_the_ids_are_read_not_when_the_check_began(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """backlog_check stamped it with its own start, before a broker round trip of up to
    seconds: rows inserted meanwhile were under the ids but "after" the stamp, so the mark
    could settle before their transactions had to commit."""
    from routing.monitoring import backlog as backlog_module

    real = backlog_module.broker_queue_lengths
    after_broker: list[datetime] = []

    def slow_broker() -> Any:
        time.sleep(0.3)
        after_broker.append(timezone.now())
        return real()

    monkeypatch.setattr(backlog_module, "broker_queue_lengths", slow_broker)
    backlog_module.backlog_check()
    (observation,) = MetricsState.objects.get().data["pending"]
    assert datetime.fromisoformat(observation[0]) >= after_broker[0]


def test_a_settle_period_far_longer_than_the_refresh_interval_still_settles(
    settings: Any,
) -> None:
    """Only the newest 64 observations were kept: with a refresh every 30 s and an hour to
    settle, the oldest kept was always 32 minutes old, and nothing ever settled."""
    settings.METRICS_SETTLE_SECONDS = 3600
    settings.METRICS_STATUS_REFRESH_SECONDS = 10**6
    start = timezone.now()
    _burst(SourceFactory(), 2)
    for step in range(130):
        counters_refresh(now=start + timedelta(seconds=30 * step))
    data = MetricsState.objects.get().data
    assert len(data["pending"]) <= 64
    assert data["events_upto"] > 0
    assert data["totals"]["assign_count"] == 2
    assert _totals(start + timedelta(seconds=3900)) == (2, 2, 2, 1)


def test_the_settle_period_is_checked_against_the_longest_transaction(settings: Any) -> None:
    from routing.apps import metrics_settle_check

    settings.CELERY_TASK_TIME_LIMIT = 120
    settings.METRICS_SETTLE_SECONDS = 300
    assert metrics_settle_check(None) == []
    settings.METRICS_SETTLE_SECONDS = 100
    (warning,) = metrics_settle_check(None)
    assert warning.id == "routing.W001"
    assert "120 s" in warning.msg


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_row_committed_after_a_later_one_is_counted_once(settings: Any) -> None:
    """Out-of-order commits: an event inserted first (smaller id) by a transaction still open
    while a later one commits and a refresh observes past it. Counted once it commits, within
    the settle period: live at scrape until the mark passes it, then in the stored total."""
    settings.METRICS_SETTLE_SECONDS = 300
    first = LeadFactory(status=LeadStatus.ASSIGNED)
    second = LeadFactory(status=LeadStatus.ASSIGNED)
    start = timezone.now()
    counters_refresh(now=start)
    inserted, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def slow_transaction() -> None:
        try:
            with transaction.atomic():
                event_record(type=EventType.SLA_BREACHED, lead=first)
                inserted.set()
                assert release.wait(20)
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            connection.close()

    worker = threading.Thread(target=slow_transaction)
    worker.start()
    try:
        assert inserted.wait(20)
        later = event_record(type=EventType.SLA_BREACHED, lead=second)  # larger id, committed
        counters_refresh(now=start + timedelta(seconds=10))  # observes past both ids
        state = MetricsState.objects.get()
        assert max(entry[1] for entry in state.data["pending"]) >= later.pk
        assert state.data["events_upto"] == 0  # not settled: the open one may still commit
        assert counters_current(now=start + timedelta(seconds=10)).counters.sla_breaches == 1
    finally:
        release.set()
        worker.join(20)
    assert not errors
    assert counters_current(now=start + timedelta(seconds=20)).counters.sla_breaches == 2
    counters_refresh(now=start + timedelta(seconds=311))  # the observation settles
    state = MetricsState.objects.get()
    assert state.data["events_upto"] >= later.pk
    assert state.data["totals"]["sla_breaches"] == 2
    counters_refresh(now=start + timedelta(seconds=700))
    assert counters_current(now=start + timedelta(seconds=700)).counters.sla_breaches == 2
