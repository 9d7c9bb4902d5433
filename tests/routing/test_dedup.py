"""Dedup in the worker (rules-format.md "Dedup") and the audit events of each outcome."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import Event
from leads.models import Lead, LeadStatus
from routing.decisions import clear_live_config_cache
from routing.models import Assignment, AssignmentKind, Rep
from routing.rules_io import rules_import
from routing.services import lead_process
from tests.leads.factories import LeadFactory, SourceFactory
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db


@pytest.fixture
def rules():
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield
    clear_live_config_cache()


def events(lead):
    return list(Event.objects.filter(lead=lead).order_by("seq").values_list("type", flat=True))


def owner(lead):
    found = Assignment.objects.filter(lead=lead, active=True).select_related("rep").first()
    return found.rep.email if found else None


def test_a_second_lead_with_the_same_email_sticks_to_the_first_owner(rules):
    first = LeadFactory(raw_payload={"email": "Ana.Person@Acme.com"})
    other = LeadFactory(raw_payload={"email": "someone@acme.com"})
    again = LeadFactory(raw_payload={"Email Address": " ana.person@ACME.com"})
    assert lead_process(lead_id=first.id) == LeadStatus.ASSIGNED
    assert lead_process(lead_id=other.id) == LeadStatus.ASSIGNED
    assert lead_process(lead_id=again.id) == LeadStatus.DUPLICATE
    again.refresh_from_db()
    assert again.duplicate_of_id == first.id
    assert again.dedup_key == "email:ana.person@acme.com"
    assert owner(again) == owner(first) == "ana@example.com"
    sticky = Assignment.objects.get(lead=again)
    assert sticky.kind == AssignmentKind.DUPLICATE
    assert "sticky to its owner Ana" in sticky.reason
    # No turn moved: the next new lead goes to Ana again after Ben took `other`.
    fresh = LeadFactory(raw_payload={"email": "new@acme.com"})
    lead_process(lead_id=fresh.id)
    assert owner(fresh) == "ana@example.com"
    assert events(again) == ["received", "duplicate_detected", "assigned"]
    assert events(first) == ["received", "assigned"]


def test_phone_matches_when_there_is_no_email(rules):
    first = LeadFactory(raw_payload={"phone": "+49 30 1234567", "company": "Acme", "name": "A B"})
    lead_process(lead_id=first.id)
    again = LeadFactory(
        raw_payload={"phone": "030 1234567", "country": "DE", "company": "Acme", "name": "A B"}
    )
    assert lead_process(lead_id=again.id) == LeadStatus.DUPLICATE
    again.refresh_from_db()
    assert (again.duplicate_of_id, again.dedup_key) == (first.id, "phone:+49301234567")


def test_a_duplicate_of_a_lead_without_an_active_owner_is_routed_normally(rules):
    first = LeadFactory(raw_payload={"email": "x@acme.com"})
    lead_process(lead_id=first.id)
    Rep.objects.filter(email="ana@example.com").update(active=False)
    clear_live_config_cache()
    again = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=again.id) == LeadStatus.DUPLICATE
    again.refresh_from_db()
    assert again.duplicate_of_id == first.id
    assignment = Assignment.objects.get(lead=again)
    assert assignment.kind == AssignmentKind.INITIAL
    assert assignment.rep.email == "ben@example.com"
    assert events(again) == ["received", "duplicate_detected", "assigned"]


def test_an_excluded_duplicate_keeps_its_link_and_is_excluded(rules):
    first = LeadFactory(raw_payload={"email": "spy@rival.io"})
    assert lead_process(lead_id=first.id) == LeadStatus.EXCLUDED
    again = LeadFactory(raw_payload={"email": "spy@rival.io"})
    assert lead_process(lead_id=again.id) == LeadStatus.EXCLUDED
    again.refresh_from_db()
    assert again.duplicate_of_id == first.id
    assert events(again) == ["received", "duplicate_detected", "excluded"]
    excluded = Event.objects.get(lead=again, type="excluded")
    assert excluded.rule_name == "Exclude competitors"
    assert excluded.data["reason"]
    assert [entry["rule"] for entry in excluded.trace] == ["Exclude competitors"]


def test_leads_outside_the_window_and_invalid_emails_do_not_match(rules, settings):
    settings.DEDUP_WINDOW_DAYS = 30
    old = LeadFactory(raw_payload={"email": "x@acme.com"})
    lead_process(lead_id=old.id)
    Lead.objects.filter(pk=old.pk).update(received_at=timezone.now() - timedelta(days=31))
    new = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=new.id) == LeadStatus.ASSIGNED
    bad1 = LeadFactory(raw_payload={"email": "not an email", "company": "A", "name": "B C"})
    bad2 = LeadFactory(raw_payload={"email": "not an email", "company": "A", "name": "B C"})
    lead_process(lead_id=bad1.id)
    lead_process(lead_id=bad2.id)
    assert Lead.objects.filter(duplicate_of__isnull=False).count() == 0


def test_a_duplicate_of_a_duplicate_points_at_the_original(rules):
    leads = [LeadFactory(raw_payload={"email": "x@acme.com"}) for _ in range(3)]
    for lead in leads:
        lead_process(lead_id=lead.id)
    assert [Lead.objects.get(pk=lead.pk).duplicate_of_id for lead in leads] == [
        None,
        leads[0].id,
        leads[0].id,
    ]


def test_unassigned_and_failed_outcomes_are_events_with_their_reason():
    clear_live_config_cache()
    lead = LeadFactory()
    assert lead_process(lead_id=lead.id) == LeadStatus.UNASSIGNED
    unassigned = Event.objects.get(lead=lead, type="unassigned")
    assert "no ruleset is published" in unassigned.data["reason"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_copies_processed_at_the_same_moment_give_exactly_one_original(rules):
    source = SourceFactory()
    pairs = 25
    leads = []
    for i in range(pairs):
        for _ in range(2):
            leads.append(LeadFactory(source=source, raw_payload={"email": f"p{i}@acme.com"}))
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker(mine: list[Lead]) -> None:
        try:
            for lead in mine:
                barrier.wait(timeout=30)
                lead_process(lead_id=lead.id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    # Each pair's two copies are processed by two threads released together.
    threads = [threading.Thread(target=worker, args=(leads[k::2],)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert Lead.objects.filter(duplicate_of__isnull=True).count() == pairs
    assert Lead.objects.filter(duplicate_of__isnull=False).count() == pairs
    assert Lead.objects.filter(status=LeadStatus.DUPLICATE).count() == pairs
    for i in range(pairs):
        pair = Lead.objects.filter(email=f"p{i}@acme.com")
        assert {owner(lead) for lead in pair} != {None}
        assert len({owner(lead) for lead in pair}) == 1
    assert Assignment.objects.count() == 2 * pairs


def test_the_lead_api_shows_an_excluded_leads_trace(client, rules):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("m", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    client.login(username="m", password="pw")
    lead = LeadFactory(raw_payload={"email": "spy@rival.io"})
    lead_process(lead_id=lead.id)
    body = client.get(f"/api/v1/leads/{lead.id}/").json()
    assert body["assignment"] is None
    assert [entry["rule"] for entry in body["trace"]] == ["Exclude competitors"]
    assert [event["type"] for event in body["events"]] == ["received", "excluded"]


def test_the_tags_and_priority_tag_rules_set_are_kept_with_the_decision():
    clear_live_config_cache()
    document = {
        **RULES,
        "ruleset": {
            "name": "Inbound",
            "rules": [
                {
                    "name": "Hot",
                    "priority": 5,
                    "when": {"field": "email_domain", "op": "eq", "value": "acme.com"},
                    "action": {"type": "tag", "tags": ["hot"], "priority": "high"},
                },
                *RULES["ruleset"]["rules"],
            ],
        },
    }
    rules_import(document, publish=True)
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assigned = Event.objects.get(lead=lead, type="assigned")
    assert (assigned.data["tags"], assigned.data["priority"]) == (["hot"], "high")
    clear_live_config_cache()
