"""Every path that assigns a lead or sends it to be routed again takes the decide lock shared,
like the worker's claim (PostgreSQL, real transactions): while a publish of the whole
configuration holds it exclusively, a reassignment by hand, for a missed SLA, because a rep
became unavailable or because the CRM changed the owner, a re-route and an unassigned retry all
wait, then finish with the
configuration the publish left, so no decision reads two versions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from leads.models import Lead, LeadStatus
from routing.configuration import configuration_lock, decide_lock_exclusive
from routing.decisions import clear_live_config_cache
from routing.models import Assignment, Rep
from routing.monitoring.sla import assignment_sla_breach
from routing.rules_io import rules_import
from routing.services import (
    lead_process,
    lead_reassign,
    lead_reroute,
    lead_retry_unassigned,
    rep_reroute_open_leads,
)
from tests.leads.factories import LeadFactory
from tests.routing.test_pipeline import RULES

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WAITED = 1.0


@pytest.fixture
def assigned() -> Any:
    """A lead routed to a rep of EMEA SDR, untouched."""
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    yield Assignment.objects.get(lead=lead, active=True)
    clear_live_config_cache()


def _waits_for_a_publish(action: Callable[[], Any]) -> Any:
    """Run ``action`` in another connection while this one holds the configuration lock the
    way a publish does; assert it waited for the commit, and return what it returned."""
    done: list[Any] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            done.append(action())
        except BaseException as exc:
            failed.append(exc)
        finally:
            connection.close()

    with transaction.atomic():
        configuration_lock()  # a publish of the whole configuration, under way
        decide_lock_exclusive()  # at its swap
        worker = threading.Thread(target=work)
        worker.start()
        time.sleep(WAITED)
        assert done == []  # waiting, not reading half a version
        assert failed == []
    worker.join(30)
    assert not failed, failed
    assert len(done) == 1
    return done[0]


def _other(assignment: Assignment) -> str:
    return next(
        email for email in ("ana@example.com", "ben@example.com") if email != assignment.rep.email
    )


def test_a_reassignment_by_hand_waits_for_a_publish(assigned: Assignment) -> None:
    other = _other(assigned)
    new = _waits_for_a_publish(
        lambda: lead_reassign(lead_id=assigned.lead_id, rep_email=other, reason="r", actor="t")
    )
    assert new.rep.email == other


def test_moving_an_unavailable_reps_leads_waits_for_a_publish(assigned: Assignment) -> None:
    Rep.objects.filter(pk=assigned.rep_id).update(active=False)
    report = _waits_for_a_publish(
        lambda: rep_reroute_open_leads(rep_id=assigned.rep_id, actor="t", reason="inactive")
    )
    assert report.moved == 1
    assert Assignment.objects.get(lead_id=assigned.lead_id, active=True).rep_id != (assigned.rep_id)


def test_an_sla_reassignment_waits_for_a_publish(assigned: Assignment) -> None:
    Assignment.objects.filter(pk=assigned.pk).update(
        sla_minutes=5, sla_due_at=timezone.now() - timedelta(minutes=1)
    )
    breach = _waits_for_a_publish(lambda: assignment_sla_breach(assignment_id=assigned.pk))
    assert breach is not None


def test_a_crm_owner_change_waits_for_a_publish(assigned: Assignment) -> None:
    from routing.crm.touches import crm_owner_changed

    outcome = _waits_for_a_publish(
        lambda: crm_owner_changed(
            lead_id=assigned.lead_id,
            kind="hubspot",
            owner_id="999",  # an owner who is no rep: noted, the clock stopped
            changed_at=timezone.now(),
            assignment_id=assigned.pk,
        )
    )
    assert outcome == "noted"


@pytest.mark.parametrize("path", ["reroute", "retry"])
def test_routing_again_waits_for_a_publish(assigned: Assignment, path: str) -> None:
    Lead.objects.filter(pk=assigned.lead_id).update(status=LeadStatus.UNASSIGNED)
    if path == "reroute":
        lead = _waits_for_a_publish(lambda: lead_reroute(lead_id=assigned.lead_id, actor="t"))
    else:
        lead = _waits_for_a_publish(lambda: lead_retry_unassigned(lead_id=assigned.lead_id))
    assert lead.status == LeadStatus.RECEIVED
