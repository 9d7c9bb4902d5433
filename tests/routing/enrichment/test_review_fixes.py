"""Defects found by the issue-5 review, each with the test that failed before its fix."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import Event
from leads.models import Lead, LeadStatus
from leads.services import leads_release_abandoned_enrichment
from routing import services
from routing.decisions import clear_live_config_cache
from routing.enrichment import lead_enrich
from routing.models import Assignment, Rep
from routing.rules_io import rules_import
from routing.services import assignment_touch, lead_process, lead_reassign, lead_reroute
from tests.leads.factories import LeadFactory
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db


@pytest.fixture
def rules():
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield
    clear_live_config_cache()


@pytest.fixture
def later(monkeypatch):
    sent: list[tuple] = []
    monkeypatch.setattr(
        services, "lead_enqueue_later", lambda lead_id, delay: sent.append((lead_id, delay))
    )
    return sent


def _owner(lead: Lead) -> str | None:
    found = Assignment.objects.filter(lead=lead, active=True).select_related("rep").first()
    return found.rep.email if found else None


def _types(lead: Lead) -> list[str]:
    return list(Event.objects.filter(lead=lead).order_by("seq").values_list("type", flat=True))


def test_a_copy_of_a_lead_waiting_for_enrichment_waits_and_then_sticks_to_its_owner(
    rules, http, sent, later
):
    """Two owners for one person: the copy was routed while its original waited for the
    provider (a: ana, b: ben). Now the copy is put off until the original has its owner."""
    http.expect_request("/enrich").respond_with_json({"industry": "Software"})
    first = LeadFactory(raw_payload={"email": "x@acme.com"})
    copy = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=first.id) == LeadStatus.PROCESSING  # parked for the provider
    assert lead_process(lead_id=copy.id) is None  # put off, not routed
    copy.refresh_from_db()
    assert (copy.status, copy.attempts, copy.deferrals) == (LeadStatus.RECEIVED, 0, 1)
    assert later == [(copy.id, pytest.approx(0.5, rel=0.25))]
    assert not Assignment.objects.filter(lead=copy).exists()
    lead_enrich(lead_id=first.id)
    assert lead_process(lead_id=first.id) == LeadStatus.ASSIGNED
    assert lead_process(lead_id=copy.id) == LeadStatus.DUPLICATE
    assert _owner(copy) == _owner(first) == "ana@example.com"
    copy.refresh_from_db()
    assert copy.duplicate_of_id == first.id
    assert _types(copy) == ["received", "duplicate_detected", "assigned"]


def test_people_with_their_own_emails_sharing_a_phone_are_not_duplicates(rules):
    ceo = LeadFactory(raw_payload={"email": "ceo@acme.com", "phone": "+49 30 1234567"})
    intern = LeadFactory(raw_payload={"email": "intern@acme.com", "phone": "+49 30 1234567"})
    lead_process(lead_id=ceo.id)
    assert lead_process(lead_id=intern.id) == LeadStatus.ASSIGNED
    assert Lead.objects.get(pk=intern.pk).duplicate_of_id is None
    # Without an e-mail the phone is the key.
    caller = LeadFactory(
        raw_payload={"phone": "030 1234567", "country": "DE", "name": "A B", "company": "Acme"}
    )
    assert lead_process(lead_id=caller.id) == LeadStatus.DUPLICATE
    assert Lead.objects.get(pk=caller.pk).duplicate_of_id == ceo.id


def test_a_rerouted_duplicate_sticks_to_its_originals_owner_now(rules, later, settings):
    settings.ENQUEUE_IN_BACKGROUND = False
    first = LeadFactory(raw_payload={"email": "x@acme.com"})
    Rep.objects.update(active=False)
    clear_live_config_cache()
    assert lead_process(lead_id=first.id) == LeadStatus.UNASSIGNED
    copy = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=copy.id) == LeadStatus.UNASSIGNED
    Rep.objects.update(active=True)
    clear_live_config_cache()
    lead_reassign(lead_id=first.id, rep_email="ben@example.com", reason="mine", actor="user:m")
    lead_reroute(lead_id=copy.id, actor="user:m")
    assert lead_process(lead_id=copy.id) == LeadStatus.DUPLICATE
    assert _owner(copy) == "ben@example.com"
    assert Assignment.objects.get(lead=copy).kind == "duplicate"


def test_rerouting_does_not_run_the_built_in_enrichment_again(rules, settings):
    from tests.routing.factories import AccountFactory

    settings.ENQUEUE_IN_BACKGROUND = False
    AccountFactory(domain="acme.com", name="Acme")
    Rep.objects.update(active=False)
    clear_live_config_cache()
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=lead.id) == LeadStatus.UNASSIGNED
    for _ in range(2):
        lead_reroute(lead_id=lead.id, actor="user:m")
        assert lead_process(lead_id=lead.id) == LeadStatus.UNASSIGNED
    assert _types(lead).count("enriched") == 1


def test_only_the_current_owner_may_touch_and_it_is_checked_under_the_lock(rules):
    from django.contrib.auth.models import User

    from routing.services import LeadActionError

    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    lead_process(lead_id=lead.id)  # ana
    ana = User.objects.create_user("ana")
    Rep.objects.filter(email="ana@example.com").update(user=ana)
    lead_reassign(lead_id=lead.id, rep_email="ben@example.com", reason="r", actor="user:m")
    with pytest.raises(LeadActionError) as refused:
        assignment_touch(lead_id=lead.id, actor="user:ana", owner_user_id=ana.pk)
    assert refused.value.status == 403
    assert Assignment.objects.get(lead=lead, active=True).touched_at is None


def test_leads_parked_with_no_enrichment_worker_are_routed_without_it(rules, http, sent, settings):
    settings.ENRICHMENT_HTTP_MAX_WAIT_SECONDS = 60
    settings.ENRICHMENT_LEASE_SECONDS = 30
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=lead.id) == LeadStatus.PROCESSING  # parked; nobody takes it
    assert leads_release_abandoned_enrichment(now=timezone.now()) == 0
    later_on = timezone.now() + timedelta(seconds=95)
    assert leads_release_abandoned_enrichment(now=later_on) == 1
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    trace = Assignment.objects.get(lead=lead).trace
    assert "no enrichment worker took it within 90 s" in trace[0]["why"]
    assert _types(lead) == ["received", "enrichment_failed", "assigned"]
