"""The worker's pipeline service: idempotent, bounded retries, errors kept on the lead."""

from __future__ import annotations

import pytest

from leads.models import LeadStatus
from routing import services
from routing.services import lead_process
from routing.tasks import process_leads
from tests.leads.factories import LeadFactory

pytestmark = pytest.mark.django_db


def test_a_processed_lead_is_normalised_and_unassigned_without_rules():
    lead = LeadFactory(raw_payload={"Email Address": " Ana@ACME.de ", "Country": "Germany"})
    assert lead_process(lead_id=lead.id) == LeadStatus.UNASSIGNED
    lead.refresh_from_db()
    assert lead.email == "ana@acme.de"
    assert lead.country == "DE"
    assert lead.attempts == 1
    assert lead.processed_at is not None
    assert lead_process(lead_id=lead.id) is None  # redelivery: a no-op
    lead.refresh_from_db()
    assert lead.attempts == 1


def test_an_error_is_kept_on_the_lead_and_it_is_quarantined_after_the_attempt_bound(
    monkeypatch, settings
):
    settings.LEAD_MAX_ATTEMPTS = 2
    lead = LeadFactory()

    def broken(*, lead):  # type: ignore[no-untyped-def]
        raise ValueError("enrichment exploded")

    monkeypatch.setattr(services, "lead_apply_normalization", broken)
    for _ in range(2):
        with pytest.raises(ValueError, match="exploded"):
            lead_process(lead_id=lead.id)
        lead.refresh_from_db()
        assert lead.status == LeadStatus.RECEIVED
        assert lead.last_error == "ValueError: enrichment exploded"
    assert lead_process(lead_id=lead.id) == LeadStatus.FAILED
    lead.refresh_from_db()
    assert lead.status == LeadStatus.FAILED
    assert (
        lead.last_error == "gave up after 2 attempts; last error: ValueError: enrichment exploded"
    )


def test_one_bad_lead_does_not_stop_its_chunk(monkeypatch):
    good, bad, other = LeadFactory(), LeadFactory(), LeadFactory()
    real = services.lead_apply_normalization

    def sometimes(*, lead):  # type: ignore[no-untyped-def]
        if lead.id == bad.id:
            raise RuntimeError("boom")
        return real(lead=lead)

    monkeypatch.setattr(services, "lead_apply_normalization", sometimes)
    process_leads([str(good.id), str(bad.id), str(other.id), "not-a-uuid"])
    statuses = {lead.id: lead.status for lead in type(good).objects.all()}
    assert statuses == {
        good.id: LeadStatus.UNASSIGNED,
        bad.id: LeadStatus.RECEIVED,
        other.id: LeadStatus.UNASSIGNED,
    }


def test_a_lead_abandoned_by_a_dead_worker_is_claimed_again_after_its_lease(settings):
    from datetime import timedelta

    from django.utils import timezone

    lead = LeadFactory()
    lead.status = LeadStatus.PROCESSING
    lead.claimed_until = timezone.now() + timedelta(minutes=1)
    lead.attempts = 1
    lead.save()
    assert lead_process(lead_id=lead.id) is None  # still leased by the (dead) worker
    type(lead).objects.filter(id=lead.id).update(
        claimed_until=timezone.now() - timedelta(seconds=1)
    )
    assert lead_process(lead_id=lead.id) == LeadStatus.UNASSIGNED
    lead.refresh_from_db()
    assert lead.attempts == 2
    assert lead.claimed_until is None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_deliveries_of_one_lead_process_it_exactly_once():
    import threading

    from django.db import connection

    leads = [LeadFactory(raw_payload={"email": f"p{i}@acme.com"}) for i in range(10)]
    for lead in leads:
        barrier = threading.Barrier(6)
        results: list = []

        def deliver(lead_id=lead.id, barrier=barrier, results=results) -> None:
            barrier.wait()
            try:
                results.append(lead_process(lead_id=lead_id))
            finally:
                connection.close()

        threads = [threading.Thread(target=deliver) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results, key=str) == [None] * 5 + [LeadStatus.UNASSIGNED], results
        lead.refresh_from_db()
        assert lead.status == LeadStatus.UNASSIGNED
        assert lead.attempts == 1


RULES = {
    "reps": [
        {"email": "ana@example.com", "name": "Ana", "timezone": "Europe/Berlin"},
        {"email": "ben@example.com", "name": "Ben", "timezone": "Europe/Berlin"},
    ],
    "teams": [
        {
            "name": "EMEA SDR",
            "strategy": "round_robin",
            "members": [{"rep": "ana@example.com"}, {"rep": "ben@example.com"}],
        }
    ],
    "value_lists": [{"name": "competitors", "values": ["rival.io"]}],
    "ruleset": {
        "name": "Inbound",
        "rules": [
            {
                "name": "Exclude competitors",
                "priority": 10,
                "when": {
                    "all": [{"field": "email_domain", "op": "in_list", "value": "competitors"}]
                },
                "action": {"type": "exclude", "reason": "competitor"},
            },
            {"name": "Everyone", "priority": 20, "action": {"type": "team", "team": "EMEA SDR"}},
        ],
    },
}


def test_the_worker_routes_with_the_published_ruleset_and_the_api_shows_the_owner(client):
    from django.contrib.auth.models import Permission, User

    from routing.decisions import clear_live_config_cache
    from routing.rules_io import rules_import

    clear_live_config_cache()
    rules_import(RULES, publish=True)
    first = LeadFactory(raw_payload={"email": "x@acme.com"})
    second = LeadFactory(raw_payload={"email": "y@acme.com"})
    rival = LeadFactory(raw_payload={"email": "spy@rival.io"})
    assert lead_process(lead_id=first.id) == LeadStatus.ASSIGNED
    assert lead_process(lead_id=second.id) == LeadStatus.ASSIGNED
    assert lead_process(lead_id=rival.id) == LeadStatus.EXCLUDED

    user = User.objects.create_user("m", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    client.login(username="m", password="pw")
    docs = [client.get(f"/api/v1/leads/{lead.id}/").json() for lead in (first, second)]
    owners = [doc["assignment"]["rep"]["email"] for doc in docs]
    assert owners == ["ana@example.com", "ben@example.com"]  # exact round robin
    assert docs[0]["assignment"]["team"] == "EMEA SDR"
    assert docs[0]["assignment"]["rule"] == "Everyone"
    assert docs[0]["status"] == "assigned"
    assert [entry["rule"] for entry in docs[0]["trace"]][-1] == "Everyone"
    listed = client.get("/api/v1/leads/?rep=BEN@example.com").json()["results"]
    assert [doc["id"] for doc in listed] == [str(second.id)]
    clear_live_config_cache()


def test_a_huge_trace_is_stored_as_its_matched_rules():
    from routing.decisions import STORED_TRACE_MAX_ENTRIES, stored_trace
    from routing.engine.types import Decision, TraceEntry

    entries = tuple(
        TraceEntry(i, f"rule {i}", i, i == 250, "no" if i != 250 else "yes", i == 250)
        for i in range(251)
    )
    big = Decision(outcome="owner", reason="r", trace=entries)
    stored = stored_trace(big)
    assert [e["rule"] for e in stored] == ["rule 250", None]
    assert stored[-1]["why"] == "250 other rules did not match"
    small = Decision(outcome="owner", reason="r", trace=entries[:STORED_TRACE_MAX_ENTRIES])
    assert len(stored_trace(small)) == STORED_TRACE_MAX_ENTRIES


@pytest.mark.parametrize(
    "payload",
    [{"email": 12345}, {"email": "not an address"}, {"email": "x@", "phone": "12"}],
)
def test_a_lead_whose_only_identifiers_are_invalid_goes_to_no_rep(payload):
    # Review of issue 16, S4: accepted (never lose a lead), but nobody can reach it, so a rep's
    # queue and caps are not spent on it: unassigned, with the reason, for RevOps to look at.
    from audit.models import Event, EventType
    from tests.routing.factories import make_rep, published_ruleset

    rep = make_rep()
    published_ruleset({"name": "Catch-all", "action": {"type": "rep", "rep": rep.email}})
    lead = LeadFactory(raw_payload=payload)
    assert lead_process(lead_id=lead.id) == LeadStatus.UNASSIGNED
    lead.refresh_from_db()
    assert lead.status == LeadStatus.UNASSIGNED
    assert "invalid_email" in lead.flags
    event = Event.objects.get(lead=lead, type=EventType.UNASSIGNED)
    assert "no valid e-mail or phone" in event.data["reason"]


@pytest.mark.parametrize(
    "payload",
    [
        {"email": "ana@acme.de"},
        {"email": "x@", "phone": "+14155550100"},
        {"email": 12345, "company": "Acme", "first_name": "Ana"},
    ],
)
def test_a_lead_with_one_usable_identifier_is_routed(payload):
    from tests.routing.factories import make_rep, published_ruleset

    rep = make_rep()
    published_ruleset({"name": "Catch-all", "action": {"type": "rep", "rep": rep.email}})
    lead = LeadFactory(raw_payload=payload)
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
