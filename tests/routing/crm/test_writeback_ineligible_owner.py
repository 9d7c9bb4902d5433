"""The person has an owner LeadRouter had not seen (created in Salesforce between the lookup and
the write-back) and that owner is a rep who could not take the lead (inactive in LeadRouter): the
write-back replaces it with the rules' rep, as it does when the lookup sees that owner, instead
of reassigning the lead to the inactive rep ('already owned ... (found at write-back)')."""

from __future__ import annotations

import pytest

from routing.crm.models import CrmOwner
from routing.delivery.models import Delivery
from routing.delivery.services import delivery_attempt
from routing.models import Assignment
from tests.routing.crm.test_writeback_order import _due, _routed, org
from tests.routing.enrichment.conftest import sent
from tests.routing.factories import RepFactory
from tests.support.crm_salesforce import salesforce_standin

__all__ = ["org", "salesforce_standin", "sent"]

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_an_owner_found_at_write_back_who_is_an_inactive_rep_does_not_get_the_lead(org):
    sf = org["sf"]
    gone = RepFactory(email="ops@example.com", name="Gone", active=False)
    CrmOwner.objects.filter(kind="salesforce", email="ops@example.com").update(rep=gone)
    lead = _routed("late@fresh.io")  # the lookup found nobody
    first = Assignment.objects.get(lead=lead, active=True)
    person = sf.add_lead(
        Email="late@fresh.io", LastName="Late", Company="Fresh", OwnerId=org["users"]["ops"]
    )
    delivery = Delivery.objects.get(assignment=first, channel="crm")
    _due(delivery)

    assert delivery_attempt(delivery_id=delivery.pk) == "delivered"

    active = Assignment.objects.get(lead=lead, active=True)
    assert active.pk == first.pk
    assert active.rep.active
    record = sf.record("Lead", person)
    assert record is not None
    assert record["OwnerId"] == CrmOwner.objects.get(kind="salesforce", rep=first.rep).owner_id


def test_with_honour_off_an_owner_found_at_write_back_is_replaced_as_one_found_at_lookup(org):
    from routing.crm.lookup import clear_connection_cache
    from routing.crm.models import CrmConnection

    sf = org["sf"]
    CrmConnection.objects.update(honour_crm_owner=False)
    clear_connection_cache()
    ben = RepFactory(email="ops@example.com", name="Ops")  # an active rep, not followed
    CrmOwner.objects.filter(kind="salesforce", email="ops@example.com").update(rep=ben)
    lead = _routed("honour@fresh.io")  # the lookup found nobody
    first = Assignment.objects.get(lead=lead, active=True)
    person = sf.add_lead(
        Email="honour@fresh.io", LastName="H", Company="Fresh", OwnerId=org["users"]["ops"]
    )
    delivery = Delivery.objects.get(assignment=first, channel="crm")
    _due(delivery)

    assert delivery_attempt(delivery_id=delivery.pk) == "delivered"

    assert Assignment.objects.get(lead=lead, active=True).pk == first.pk
    record = sf.record("Lead", person)
    assert record is not None
    assert record["OwnerId"] == CrmOwner.objects.get(kind="salesforce", rep=first.rep).owner_id
