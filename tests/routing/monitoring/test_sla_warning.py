"""SLA warnings: when a rep is warned (property), once per assignment, through the outbox."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from routing.delivery.models import Delivery, DeliveryChannel
from routing.delivery.services import delivery_attempt
from routing.models import Assignment
from routing.monitoring.models import SlaWarning
from routing.monitoring.sla_warning import sla_warn, warning_due
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, RepFactory

T0 = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # the night Europe/Berlin moves to summer time


@given(
    sla=st.integers(min_value=1, max_value=7 * 24 * 60),
    elapsed=st.integers(min_value=-60, max_value=8 * 24 * 60 * 60),
    lead=st.floats(min_value=0, max_value=600, allow_nan=False),
)
def test_a_warning_is_due_only_before_the_deadline_within_the_lead_time_and_half_the_sla(
    sla: int, elapsed: int, lead: float
) -> None:
    assigned = T0
    due = assigned + timedelta(minutes=sla)
    now = assigned + timedelta(seconds=elapsed)
    result = warning_due(assigned_at=assigned, sla_due_at=due, now=now, lead_minutes=lead)
    left = due - now
    if result:
        assert timedelta(0) < left <= timedelta(minutes=lead)
        assert left <= (due - assigned) / 2
    # Once due, it stays due until the deadline: a run that missed the moment warns later.
    later = now + (left / 2 if left > timedelta(0) else timedelta(0))
    if result and later < due:
        assert warning_due(assigned_at=assigned, sla_due_at=due, now=later, lead_minutes=lead)
    if lead > 0 and timedelta(0) < left <= min(timedelta(minutes=lead), (due - assigned) / 2):
        assert result


def _assignment(*, sla_minutes: int, assigned_ago: timedelta, rep_zone: str = "UTC") -> Assignment:
    now = timezone.now()
    rep = RepFactory(timezone=rep_zone)
    assigned_at = now - assigned_ago
    return AssignmentFactory(
        lead=LeadFactory(first_name="Ada", last_name="Lovelace", company="Acme"),
        rep=rep,
        rep_name=rep.name,
        assigned_at=assigned_at,
        sla_minutes=sla_minutes,
        sla_due_at=assigned_at + timedelta(minutes=sla_minutes),
    )


@pytest.mark.django_db
def test_a_rep_is_warned_once_by_email_in_their_zone(settings: Any) -> None:
    settings.SLA_WARNING_MINUTES = 10
    soon = _assignment(sla_minutes=30, assigned_ago=timedelta(minutes=25), rep_zone="Asia/Tokyo")
    _assignment(sla_minutes=30, assigned_ago=timedelta(minutes=5))  # 25 minutes left: not yet
    touched = _assignment(sla_minutes=30, assigned_ago=timedelta(minutes=25))
    Assignment.objects.filter(pk=touched.pk).update(touched_at=timezone.now())
    _assignment(sla_minutes=30, assigned_ago=timedelta(minutes=31))  # past due: a breach's job

    assert sla_warn() == 1
    assert sla_warn() == 0  # once

    (warning,) = SlaWarning.objects.all()
    assert warning.assignment_id == soon.pk
    (row,) = Delivery.objects.filter(event="lead.sla_warning")
    assert row.channel == DeliveryChannel.EMAIL
    assert delivery_attempt(delivery_id=row.pk) == "delivered"
    (message,) = mail.outbox
    assert message.subject == "SLA about to breach: Ada Lovelace (Acme)"
    assert "JST (Asia/Tokyo)" in message.body
    assert "about to run out" in message.alternatives[0][0]


@pytest.mark.django_db
def test_warnings_can_be_turned_off(settings: Any) -> None:
    settings.SLA_WARNING_MINUTES = 0
    _assignment(sla_minutes=30, assigned_ago=timedelta(minutes=25))
    assert sla_warn() == 0
    assert not Delivery.objects.exists()


@pytest.mark.django_db
def test_a_short_sla_is_warned_at_half_time(settings: Any) -> None:
    settings.SLA_WARNING_MINUTES = 10
    early = _assignment(sla_minutes=4, assigned_ago=timedelta(minutes=1))
    assert sla_warn() == 0
    assert sla_warn(now=early.sla_due_at - timedelta(minutes=1, seconds=50)) == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_beats_at_once_warn_each_rep_once(settings: Any) -> None:
    assert connection.vendor == "postgresql"
    settings.SLA_WARNING_MINUTES = 10
    for _ in range(8):
        _assignment(sla_minutes=30, assigned_ago=timedelta(minutes=25))
    barrier = threading.Barrier(3)
    counts: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=10)
            counts.append(sla_warn())
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert sum(counts) == 8
    assert SlaWarning.objects.count() == 8
    assert Delivery.objects.filter(event="lead.sla_warning").count() == 8
