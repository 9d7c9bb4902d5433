"""/metrics counters kept incrementally: totals up to a settled mark plus the rows past it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
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
    assert state.data["leads_before"] == start.isoformat()
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
