"""A write-back that Salesforce made while its answer was lost (processed, then a timeout), and
then a reassignment: the next write-back finds the first rep's owner on the Lead. That owner is
LeadRouter's own earlier write, not an owner set in Salesforce: it is overwritten with the new
rep's, and the reassignment stands (it was taken for 'already owned' and undone)."""

from __future__ import annotations

import pytest

from leads.models import Lead
from routing.crm.models import CrmOwner
from routing.delivery.models import Delivery
from routing.delivery.services import delivery_attempt
from routing.models import Assignment
from routing.services import lead_reassign
from tests.routing.crm.test_writeback_order import _due, _routed, org
from tests.routing.enrichment.conftest import sent
from tests.support.crm_salesforce import salesforce_standin

__all__ = ["org", "salesforce_standin", "sent"]

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_our_own_write_whose_answer_was_lost_is_no_owner_set_in_the_crm(org):
    sf = org["sf"]
    lead = _routed("lost@fresh.io")  # the lookup found nobody: LeadRouter knows no owner
    first = Assignment.objects.get(lead=lead, active=True)
    ours = CrmOwner.objects.get(kind="salesforce", rep_id=first.rep_id).owner_id
    # The first write-back's create reached Salesforce; its answer did not reach the worker.
    person = sf.add_lead(Email="lost@fresh.io", LastName="Race", Company="Fresh", OwnerId=ours)
    other = org["ben"] if first.rep_id == org["ana"].pk else org["ana"]
    lead_reassign(lead_id=lead.id, rep_email=other.email, reason="cover", actor="manager")
    current = Assignment.objects.get(lead=lead, active=True)
    fresh = Delivery.objects.get(assignment=current, channel="crm")
    _due(fresh)

    assert delivery_attempt(delivery_id=fresh.pk) == "delivered"

    wanted = CrmOwner.objects.get(kind="salesforce", rep=other).owner_id
    record = sf.record("Lead", person)
    assert record is not None
    assert record["OwnerId"] == wanted
    lead = Lead.objects.get(pk=lead.pk)
    assert lead.crm["salesforce"]["written"]["outcome"] == "updated"
    assert Assignment.objects.get(lead=lead, active=True).rep_id == other.pk


def test_a_manager_reassigning_after_an_owner_change_made_in_the_crm_is_written(org):
    """The CRM moved the owner (the first-touch job recorded it as a reassignment made there,
    with no write-back), then a manager reassigns in LeadRouter: the later change wins and is
    written, rather than being taken for another change made in the CRM and undone."""
    from routing.crm.models import CrmConnection
    from routing.crm.touches import crm_touches_run
    from tests.routing.factories import RepFactory

    sf = org["sf"]
    CrmConnection.objects.update(touches_enabled=True)
    cara = RepFactory(email="ops@example.com", name="Cara")
    CrmOwner.objects.filter(kind="salesforce", email="ops@example.com").update(rep=cara)
    lead = _routed("moved@fresh.io")
    first = Assignment.objects.get(lead=lead, active=True)
    _due(Delivery.objects.get(assignment=first, channel="crm"))
    assert delivery_attempt(delivery_id=Delivery.objects.get(assignment=first).pk) == "delivered"
    lead.refresh_from_db()
    person = lead.crm["salesforce"]["written"]["id"]
    sf.edit("Lead", person, OwnerId=org["users"]["ops"])  # moved to Cara in Salesforce
    assert crm_touches_run()["Salesforce"]["reassigned"] == 1
    assert Assignment.objects.get(lead=lead, active=True).rep_id == cara.pk

    other = org["ben"] if first.rep_id == org["ana"].pk else org["ana"]
    lead_reassign(lead_id=lead.id, rep_email=other.email, reason="cover", actor="manager")
    current = Assignment.objects.get(lead=lead, active=True)
    fresh = Delivery.objects.get(assignment=current, channel="crm")
    _due(fresh)

    assert delivery_attempt(delivery_id=fresh.pk) == "delivered"

    assert Assignment.objects.get(lead=lead, active=True).rep_id == other.pk
    record = sf.record("Lead", person)
    assert record is not None
    assert record["OwnerId"] == CrmOwner.objects.get(kind="salesforce", rep=other).owner_id
