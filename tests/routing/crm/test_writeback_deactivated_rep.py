"""A write-back for a rep whose CRM user is deactivated (the roster's ``active_in_crm`` off) fails
at once with a message saying so and what to do, without a request to the CRM: the CRM would
only refuse it in its own words (Salesforce: INACTIVE_OWNER_OR_USER) after the retries, and the
dead letter would not say why (review of issue 17)."""

from __future__ import annotations

import pytest

from routing.crm.models import CrmOwner
from routing.delivery.models import Delivery, DeliveryStatus
from routing.delivery.services import delivery_attempt
from routing.models import Assignment
from tests.routing.crm.test_writeback_order import _due, _routed, org
from tests.routing.enrichment.conftest import sent
from tests.support.crm_salesforce import salesforce_standin

__all__ = ["org", "salesforce_standin", "sent"]

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_write_back_for_a_rep_deactivated_in_the_crm_fails_early_with_a_clear_message(org):
    sf = org["sf"]
    lead = _routed("gone@fresh.io")
    assignment = Assignment.objects.get(lead=lead, active=True)
    rep = assignment.rep
    owner = CrmOwner.objects.get(kind="salesforce", rep=rep)
    sf.edit("User", owner.owner_id, IsActive=False)  # as the roster sync then records it
    CrmOwner.objects.filter(pk=owner.pk).update(active_in_crm=False)
    delivery = Delivery.objects.get(assignment=assignment, channel="crm")
    _due(delivery)
    sf.reset_log()

    assert delivery_attempt(delivery_id=delivery.pk) == "failed"

    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.FAILED
    assert delivery.last_error == (
        f"{rep.name}'s CRM user is deactivated in Salesforce: re-route the lead or re-link the rep"
    )
    assert [a.outcome for a in delivery.attempt_log.all()] == ["refused"]
    assert sf.requests == []
