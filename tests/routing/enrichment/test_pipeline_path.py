"""The whole path through the pipeline: built-ins, parked for the HTTP provider, enriched on
its queue, handed back, routed — and routed without it when the provider keeps failing."""

from __future__ import annotations

import pytest
from werkzeug import Response

from audit.models import Event
from leads.models import Lead, LeadStatus
from routing.decisions import clear_live_config_cache
from routing.enrichment import lead_enrich
from routing.models import Assignment
from routing.rules_io import rules_import
from routing.services import lead_process
from tests.leads.factories import LeadFactory
from tests.routing.enrichment.conftest import make_due
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

BIG_COMPANIES = {
    **RULES,
    "ruleset": {
        "name": "Inbound",
        "rules": [
            {
                "name": "Big companies to Ben",
                "priority": 10,
                "when": {"all": [{"field": "employees", "op": "gte", "value": 1000}]},
                "action": {"type": "rep", "rep": "ben@example.com"},
            },
            {"name": "Everyone", "priority": 20, "action": {"type": "team", "team": "EMEA SDR"}},
        ],
    },
}


@pytest.fixture
def rules():
    clear_live_config_cache()
    rules_import(BIG_COMPANIES, publish=True)
    yield
    clear_live_config_cache()


def _types(lead: Lead) -> list[str]:
    return list(Event.objects.filter(lead=lead).order_by("seq").values_list("type", flat=True))


def test_a_lead_waits_for_the_provider_then_is_routed_on_what_it_learnt(
    rules, http, sent, django_capture_on_commit_callbacks
):
    http.expect_request("/enrich", method="POST").respond_with_json(
        {"employees": 5000, "industry": "Software"}
    )
    lead = LeadFactory(raw_payload={"email": "cto@bigcorp.example", "company": "BigCorp"})
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_process(lead_id=lead.id) == LeadStatus.PROCESSING  # parked
    lead.refresh_from_db()
    assert (lead.enrichment_status, lead.claimed_until, lead.attempts) == ("pending", None, 1)
    assert sent.ids("enrichment.enrich_lead") == [str(lead.id)]
    assert not Assignment.objects.filter(lead=lead).exists()

    with django_capture_on_commit_callbacks(execute=True):
        lead_enrich(lead_id=lead.id)
    lead.refresh_from_db()
    assert lead.enrichment_status == "done"
    assert lead.employees == 5000
    assert str(lead.id) in sent.ids("routing.process_lead")

    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    lead.refresh_from_db()
    assert lead.attempts == 1  # coming back from enrichment is the same attempt
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.rep.email == "ben@example.com"
    assert assignment.rule_name == "Big companies to Ben"
    assert _types(lead) == ["received", "enriched", "assigned"]
    assert lead_process(lead_id=lead.id) is None  # a stray routing message: no-op


def test_when_the_provider_keeps_failing_the_lead_is_routed_without_it_and_says_so(
    rules, http, sent, settings
):
    settings.ENRICHMENT_HTTP_MAX_ATTEMPTS = 2
    http.expect_request("/enrich").respond_with_response(Response("down", status=503))
    lead = LeadFactory(raw_payload={"email": "cto@bigcorp.example"})
    lead_process(lead_id=lead.id)
    lead_enrich(lead_id=lead.id)
    make_due(lead)
    lead_enrich(lead_id=lead.id)
    lead.refresh_from_db()
    assert lead.enrichment_status == "failed"
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.rule_name == "Everyone"
    note = assignment.trace[0]
    assert note["rule"] is None
    assert "enrichment by http failed" in note["why"]
    assert "routed without it" in note["why"]
    assert _types(lead) == ["received", "enrichment_failed", "assigned"]


def test_a_sticky_duplicate_does_not_wait_for_the_provider(rules, http, sent):
    http.expect_request("/enrich").respond_with_json({"employees": 10})
    first = LeadFactory(raw_payload={"email": "x@acme.com"})
    lead_process(lead_id=first.id)
    lead_enrich(lead_id=first.id)
    assert lead_process(lead_id=first.id) == LeadStatus.ASSIGNED
    again = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=again.id) == LeadStatus.DUPLICATE
    assert Lead.objects.get(pk=again.pk).enrichment_status == ""
