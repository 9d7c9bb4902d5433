"""The CRM stages end to end against the HubSpot stand-in, through hubspot-api-client: the
roster from owners, the contact already owned in HubSpot, a company's owner as the account
owner, owner write-back created once, first touch and a lead status change read back, an owner
changed in HubSpot, a 429 and a revoked token."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone

from audit.models import Event
from audit.selectors import crm_findings
from leads.models import CrmLookupStatus, Lead, LeadStatus
from routing import decisions
from routing.crm.health import crm_health_check
from routing.crm.hubspot import clear_account_cache
from routing.crm.limits import crm_pause
from routing.crm.lookup import clear_connection_cache, lead_crm_lookup
from routing.crm.models import CrmConnection, CrmOwner
from routing.crm.roster import crm_roster_sync
from routing.crm.secrets import secret_seal
from routing.crm.touches import crm_touches_sync
from routing.delivery.models import Delivery, DeliveryStatus
from routing.delivery.services import deliveries_sweep_due, delivery_attempt
from routing.models import Assignment, AssignmentKind
from routing.monitoring.models import Alert
from routing.services import lead_process
from tests.config.test_log_context import json_lines
from tests.leads.factories import LeadFactory
from tests.routing.enrichment.conftest import Sent, sent
from tests.routing.factories import RepFactory, published_ruleset, team_with
from tests.support.crm_hubspot import HubSpotStandIn, hubspot_standin

__all__ = ["hubspot_standin", "json_lines", "sent"]

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    decisions.clear_live_config_cache()
    clear_connection_cache()
    clear_account_cache()
    yield
    clear_account_cache()
    decisions.clear_live_config_cache()


@pytest.fixture
def portal(hubspot_standin: HubSpotStandIn, settings: Any) -> dict[str, Any]:
    """A HubSpot account with two owners who are reps, one who is not, and a connection."""
    settings.CRM_CA_BUNDLE = hubspot_standin.ca_file
    settings.CRM_LOOKUP_BACKOFF_SECONDS = 0
    hs = hubspot_standin
    owners = {
        "ana": hs.add_owner("ana@example.com", "Ana", "A"),
        "ben": hs.add_owner("ben@example.com", "Ben", "B"),
        "ops": hs.add_owner("ops@example.com", "Ops", "Integration"),
        "old": hs.add_owner("old@example.com", "Old", "Timer", archived=True),
    }
    ana = RepFactory(email="ana@example.com", name="Ana")
    ben = RepFactory(email="ben@example.com", name="Ben")
    old = RepFactory(email="old@example.com", name="Old")
    team = team_with([ana, ben])
    connection = CrmConnection.objects.create(
        kind="hubspot",
        name="HubSpot",
        base_url=hs.url,
        secret_encrypted=secret_seal(hs.token),
        writeback_enabled=True,
        touches_enabled=True,
        rate_per_minute=60_000,  # the pace is tested elsewhere (test_limits, the worker tests)
        burst=100,
    )
    report = crm_roster_sync(connection, create_reps=False)
    assert sorted(report.linked) == [
        "ana@example.com",
        "ben@example.com",
        "old@example.com",
    ], report.summary()
    published_ruleset(
        {"name": "Named accounts", "action": {"type": "account_owner"}},
        {"name": "Everyone", "action": {"type": "team", "team": team.name}},
    )
    hs.reset_log()
    return {"hs": hs, "owners": owners, "ana": ana, "ben": ben, "old": old, "conn": connection}


def _route(lead: Lead, capture: Any) -> str | None:
    with capture(execute=True):
        status = lead_process(lead_id=lead.id)
    lead.refresh_from_db()
    if lead.crm_status == CrmLookupStatus.PENDING:
        with capture(execute=True):
            lead_crm_lookup(lead_id=lead.id)
        with capture(execute=True):
            status = lead_process(lead_id=lead.id)
    return status


def _write_back(lead: Lead) -> Delivery:
    delivery = Delivery.objects.get(assignment__lead=lead, channel="crm", assignment__active=True)
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    outcome = delivery_attempt(delivery_id=delivery.pk)
    delivery.refresh_from_db()
    delivery.last_error = delivery.last_error or f"attempt: {outcome!r}"  # in the assert's message
    return delivery


def _creates(hs: HubSpotStandIn) -> list[Any]:
    return [
        r
        for r in hs.requests
        if r.method == "POST" and r.path.rstrip("/").endswith("/crm/v3/objects/contacts")
    ]


def test_the_roster_maps_owners_to_reps_and_flags_the_archived_one(portal):
    owners = {o.email: o for o in CrmOwner.objects.filter(kind="hubspot").select_related("rep")}
    assert owners["ana@example.com"].owner_id == portal["owners"]["ana"]
    assert owners["ana@example.com"].rep_id == portal["ana"].pk
    assert owners["ops@example.com"].rep is None
    assert owners["old@example.com"].active_in_crm is False


def test_a_contact_owned_in_hubspot_goes_to_its_owner_and_nothing_is_patched(
    portal, sent: Sent, django_capture_on_commit_callbacks
):
    hs = portal["hs"]
    hs.add_contact(email="pat@acme.com", hubspot_owner_id=portal["owners"]["ben"])
    lead = LeadFactory(raw_payload={"email": "PAT@acme.com", "company": "Acme"})
    assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.rep_id == portal["ben"].pk
    assert assignment.kind == AssignmentKind.CRM_OWNER
    assert "already owned in HubSpot by" in assignment.reason
    lead.refresh_from_db()
    found = lead.crm["hubspot"]["person"]
    assert found["object"] == "contact"
    assert found["owner_id"] == portal["owners"]["ben"]
    assert "/record/0-1/" in found["url"]
    before = len(hs.requests)
    delivery = _write_back(lead)
    assert delivery.status == DeliveryStatus.DELIVERED, delivery.last_error
    assert "PATCH" not in [r.method for r in hs.requests[before:]]


def test_a_company_owner_is_the_account_owner(portal, django_capture_on_commit_callbacks):
    hs = portal["hs"]
    hs.add_company(name="Globex", domain="globex.com", hubspot_owner_id=portal["owners"]["ana"])
    lead = LeadFactory(raw_payload={"email": "someone@globex.com", "company": "Globex"})
    assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.rep_id == portal["ana"].pk
    event = Event.objects.get(lead=lead, type="crm_checked")
    assert "Globex" in event.data["summary"]


def test_an_owner_who_is_an_archived_owner_does_not_get_the_lead(
    portal, django_capture_on_commit_callbacks
):
    hs = portal["hs"]
    hs.add_contact(email="left@acme.com", hubspot_owner_id=portal["owners"]["old"])
    lead = LeadFactory(raw_payload={"email": "left@acme.com"})
    assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.rep_id in (portal["ana"].pk, portal["ben"].pk)
    assert assignment.kind != AssignmentKind.CRM_OWNER


def test_a_new_person_is_written_to_hubspot_once(portal, django_capture_on_commit_callbacks):
    hs = portal["hs"]
    lead = LeadFactory(
        raw_payload={"email": "new@fresh.io", "first_name": "Nia", "last_name": "New"}
    )
    assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    delivery = _write_back(lead)
    assert delivery.status == DeliveryStatus.DELIVERED, delivery.last_error
    assert len(_creates(hs)) == 1
    lead.refresh_from_db()
    written = lead.crm["hubspot"]["written"]
    assert written["outcome"] == "created"
    contact = hs.contact(written["id"])
    assert contact is not None
    expected = CrmOwner.objects.get(kind="hubspot", rep=assignment.rep).owner_id
    assert contact["hubspot_owner_id"] == expected
    assert (contact["firstname"], contact["lastname"]) == ("Nia", "New")
    # A repeated delivery (a lost acknowledgement) does not create a second contact.
    Delivery.objects.filter(pk=delivery.pk).update(
        status=DeliveryStatus.PENDING, next_attempt_at=timezone.now()
    )
    assert _write_back(lead).status == DeliveryStatus.DELIVERED
    assert len(_creates(hs)) == 1


def test_first_touch_and_a_lead_status_change_are_read_back(
    portal, django_capture_on_commit_callbacks
):
    hs = portal["hs"]
    one = LeadFactory(raw_payload={"email": "one@fresh.io", "last_name": "One"})
    two = LeadFactory(raw_payload={"email": "two@fresh.io", "last_name": "Two"})
    for lead in (one, two):
        _route(lead, django_capture_on_commit_callbacks)
        assert _write_back(lead).status == DeliveryStatus.DELIVERED
        lead.refresh_from_db()
    report = crm_touches_sync(portal["conn"])
    assert (report.read, report.touched) == (2, 0)

    called = dt.datetime.now(dt.UTC)  # after the assignment (a future time is clamped to now)
    hs.edit_contact(one.crm["hubspot"]["written"]["id"], notes_last_contacted=called.isoformat())
    hs.edit_contact(two.crm["hubspot"]["written"]["id"], hs_lead_status="IN_PROGRESS")
    report = crm_touches_sync(portal["conn"])
    assert report.touched == 2
    touched = {a.lead_id: a for a in Assignment.objects.filter(active=True)}
    assert touched[one.id].touch_source == "hubspot"
    assert abs((touched[one.id].touched_at - called).total_seconds()) < 0.01
    assert touched[two.id].touch_source == "hubspot"
    assert crm_touches_sync(portal["conn"]).touched == 0  # recorded once


def test_an_owner_changed_in_hubspot_is_a_reassignment_made_in_hubspot(
    portal, django_capture_on_commit_callbacks
):
    hs = portal["hs"]
    lead = LeadFactory(raw_payload={"email": "moved@fresh.io", "last_name": "Moved"})
    _route(lead, django_capture_on_commit_callbacks)
    _write_back(lead)
    lead.refresh_from_db()
    first = Assignment.objects.get(lead=lead, active=True)
    other = portal["ben"] if first.rep_id == portal["ana"].pk else portal["ana"]
    other_owner = CrmOwner.objects.get(kind="hubspot", rep=other).owner_id
    hs.edit_contact(lead.crm["hubspot"]["written"]["id"], hubspot_owner_id=other_owner)
    report = crm_touches_sync(portal["conn"])
    assert report.reassigned == 1
    current = Assignment.objects.get(lead=lead, active=True)
    assert current.rep_id == other.pk
    assert "reassigned in HubSpot" in current.reason
    assert not Delivery.objects.filter(assignment=current, channel="crm").exists()


def test_a_429_makes_the_lookup_wait_without_counting_a_try(
    portal, django_capture_on_commit_callbacks
):
    hs = portal["hs"]
    hs.limit_next(1, retry_after=1)
    lead = LeadFactory(raw_payload={"email": "busy@fresh.io"})
    with django_capture_on_commit_callbacks(execute=True):
        lead_process(lead_id=lead.id)
    assert lead_crm_lookup(lead_id=lead.id) in ("waiting", "retry")
    lead.refresh_from_db()
    assert lead.crm_status == CrmLookupStatus.PENDING
    assert lead.crm_next_at is not None
    assert lead.crm_next_at > timezone.now()


def test_a_retry_after_longer_than_the_wait_still_routes_the_lead_in_time(
    portal, settings, django_capture_on_commit_callbacks
):
    """HubSpot's daily limit asks for an hour; the lead's next try is at its deadline, then it
    is routed without the CRM."""
    settings.CRM_LOOKUP_MAX_WAIT_SECONDS = 30
    hs = portal["hs"]
    hs.limit_next(1, retry_after=3600)
    lead = LeadFactory(raw_payload={"email": "daily@fresh.io"})
    started = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        lead_process(lead_id=lead.id)
    lead_crm_lookup(lead_id=lead.id)
    lead.refresh_from_db()
    assert lead.crm_status == CrmLookupStatus.PENDING
    assert lead.crm_next_at is not None
    assert lead.crm_next_at <= started + dt.timedelta(seconds=32)


def test_a_revoked_token_raises_the_crm_alert_and_routing_goes_on(
    portal, django_capture_on_commit_callbacks
):
    hs = portal["hs"]
    hs.expire_tokens()
    lead = LeadFactory(raw_payload={"email": "auth@fresh.io"})
    assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    assert crm_health_check() == {"HubSpot": "auth"}
    alert = Alert.objects.get(kind="crm", status="open")
    assert hs.token not in alert.message
    # A new token is saved: the probe succeeds and the alert resolves.
    connection = portal["conn"]
    connection.secret_encrypted = secret_seal(hs.rotate_token())
    connection.save()
    clear_connection_cache()
    assert crm_health_check() == {}
    assert not Alert.objects.filter(kind="crm", status="open").exists()


def test_every_line_a_lookup_logs_names_its_lead(
    portal, json_lines, settings, django_capture_on_commit_callbacks
):
    """The breaker's line says nothing of a lead itself: the lookup's log context adds it."""
    settings.CRM_LOOKUP_MAX_ATTEMPTS = 1
    settings.CRM_BREAKER_FAILURES = 1
    portal["hs"].fail_next(1, status=503)
    lead = LeadFactory(raw_payload={"email": "down@fresh.io"})
    with django_capture_on_commit_callbacks(execute=True):
        lead_process(lead_id=lead.id)
    assert lead_crm_lookup(lead_id=lead.id) == "failed"  # the lead goes on without HubSpot
    opened = [line for line in json_lines() if "breaker opened" in line["message"]]
    assert len(opened) == 1, json_lines()
    assert opened[0]["lead_id"] == str(lead.id)
    assert portal["hs"].token not in json.dumps(json_lines())


def test_an_owner_hubspot_had_is_not_overwritten_when_the_lookup_failed(
    portal, settings, django_capture_on_commit_callbacks
):
    """The contact is owned in HubSpot since before the lead came; the lookup failed, so the
    lead was routed by the rules. Write-back reads the owner, does not overwrite it, and the
    history says whose it is (review finding B5)."""
    settings.CRM_LOOKUP_MAX_ATTEMPTS = 1
    hs = portal["hs"]
    contact = hs.add_contact(email="owned@acme.com", hubspot_owner_id=portal["owners"]["ops"])
    lead = LeadFactory(raw_payload={"email": "owned@acme.com"})
    hs.fail_next(1, status=503)
    assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    lead.refresh_from_db()
    assert lead.crm["hubspot"]["status"] == "failed"
    first = Assignment.objects.get(lead=lead, active=True)
    delivery = _write_back(lead)
    assert delivery.status == DeliveryStatus.DELIVERED, delivery.last_error
    assert hs.contact(contact)["hubspot_owner_id"] == portal["owners"]["ops"]
    assert "PATCH" not in [r.method for r in hs.requests]
    lead.refresh_from_db()
    assert lead.crm["hubspot"]["written"]["outcome"] == "owned"
    # The lead page says why nothing was written.
    [(label, lines)] = crm_findings(lead.crm)
    assert label == "HubSpot"
    assert (
        f"Owner not written: contact {contact} was already owned in HubSpot by "
        f"{portal['owners']['ops']}, an owner LeadRouter had not seen, and HubSpot's owner wins"
    ) in lines
    reasons = list(
        Event.objects.filter(lead=lead, type="reassigned").values_list("data__reason", flat=True)
    )
    assert len(reasons) == 1
    assert reasons[0].startswith("already owned in HubSpot by ops@example.com, who is no rep")
    first.refresh_from_db()
    assert first.touch_source == "hubspot"  # worked outside LeadRouter: the SLA clock stops
    assert crm_touches_sync(portal["conn"]).reassigned == 0  # recorded once


def test_a_write_back_waiting_for_the_rate_limit_is_sent_again_when_the_wait_is_over(
    portal, sent: Sent, settings, django_capture_on_commit_callbacks
):
    """Deferred by our shared budget (HubSpot asked every worker to wait 4 s): re-sent by a
    message of its own with that wait as countdown, not left for the 15 s sweep, which re-sends
    it only if that message is lost (benchmark finding b)."""
    lead = LeadFactory(raw_payload={"email": "paced@fresh.io", "last_name": "Paced"})
    _route(lead, django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get(assignment__lead=lead, channel="crm")
    crm_pause(portal["conn"], 4.0)
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    sent.clear()
    before = len(portal["hs"].requests)
    with django_capture_on_commit_callbacks(execute=True):
        assert delivery_attempt(delivery_id=delivery.pk) == "deferred"
    assert len(portal["hs"].requests) == before
    requeued = [(args, options) for name, args, options in sent if name == "delivery.deliver"]
    assert len(requeued) == 1
    assert requeued[0][0] == [delivery.pk]
    countdown = requeued[0][1]["countdown"]
    assert 3.5 <= countdown <= 6.5
    delivery.refresh_from_db()
    assert delivery.attempts == 0
    assert delivery.next_attempt_at is not None
    assert delivery.dispatched_at == delivery.next_attempt_at
    sent.clear()
    deliveries_sweep_due(now=delivery.next_attempt_at + dt.timedelta(seconds=1))
    assert delivery.pk not in sent.ids("delivery.deliver")
    lost = settings.DELIVERY_REDISPATCH_SECONDS + 1
    deliveries_sweep_due(now=delivery.next_attempt_at + dt.timedelta(seconds=lost))
    assert delivery.pk in sent.ids("delivery.deliver")


def test_a_token_without_a_scope_the_lookup_needs_raises_an_alert_naming_it(portal):
    """The probe makes the lookup's searches too: the owners alone answer for a token that
    lacks crm.objects.companies.read, and the alert would never open."""
    hs, connection = portal["hs"], portal["conn"]
    hs.revoke_scope("crm.objects.companies.read")
    CrmConnection.objects.filter(pk=connection.pk).update(last_ok_at=None)  # idle: probed
    assert crm_health_check() == {"HubSpot": "auth"}
    alert = Alert.objects.get(kind="crm", status="open")
    assert "companies search" in alert.message
    assert "crm.objects.companies.read" in alert.message
    assert "crm.objects.contacts.read" not in alert.message
    hs.restore_scope("crm.objects.companies.read")
    assert crm_health_check() == {}
    assert not Alert.objects.filter(kind="crm", status="open").exists()


def test_a_company_search_refused_keeps_the_person_found(
    portal, django_capture_on_commit_callbacks
):
    """The token lacks the companies scope: the contact found is still used (its owner gets
    the lead) and the trace says the company half is missing and why."""
    hs = portal["hs"]
    hs.revoke_scope("crm.objects.companies.read")
    contact = hs.add_contact(email="pat@acme.com", hubspot_owner_id=portal["owners"]["ben"])
    lead = LeadFactory(raw_payload={"email": "pat@acme.com", "company": "Acme"})
    assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert (assignment.kind, assignment.rep_id) == (AssignmentKind.CRM_OWNER, portal["ben"].pk)
    lead.refresh_from_db()
    entry = lead.crm["hubspot"]
    assert entry["status"] == "done"
    assert entry["person"]["id"] == contact
    assert entry["company"] is None
    assert "crm.objects.companies.read" in entry["missing"]["company"]
    notes = [step["why"] for step in assignment.trace if step["why"].startswith("HubSpot: ")]
    assert len(notes) == 1, assignment.trace
    assert f"contact {contact} found" in notes[0]
    assert "company not looked up: credential problem" in notes[0]
    assert "crm.objects.companies.read" in notes[0]


def test_a_company_search_that_fails_once_is_tried_again_without_the_person(
    portal, django_capture_on_commit_callbacks
):
    hs = portal["hs"]
    contact = hs.add_contact(email="pat@acme.com", hubspot_owner_id=portal["owners"]["ana"])
    hs.add_company(name="Acme", domain="acme.com", hubspot_owner_id=portal["owners"]["ben"])
    failure = {"status": "error", "message": "internal error", "category": "INTERNAL_ERROR"}
    hs.respond_next(failure, status=503, path="companies/search")
    lead = LeadFactory(raw_payload={"email": "pat@acme.com", "company": "Acme"})
    with django_capture_on_commit_callbacks(execute=True):
        lead_process(lead_id=lead.id)
    assert lead_crm_lookup(lead_id=lead.id) == "retry"
    lead.refresh_from_db()
    assert lead.crm["hubspot"]["status"] == "pending"
    assert lead.crm["hubspot"]["found"]["person"]["id"] == contact
    Lead.objects.filter(id=lead.id).update(crm_next_at=timezone.now())
    assert lead_crm_lookup(lead_id=lead.id) == "done"
    searches = [p for p in hs.paths("POST") if p.endswith("/search")]
    assert searches.count("/crm/v3/objects/contacts/search") == 1  # the person kept, not re-read
    assert searches.count("/crm/v3/objects/companies/search") == 2
    lead.refresh_from_db()
    entry = lead.crm["hubspot"]
    assert (entry["person"]["id"], entry["company"]["name"]) == (contact, "Acme")
    assert not entry.get("missing")


def test_while_the_token_is_refused_lookups_do_not_ask_hubspot(
    portal, django_capture_on_commit_callbacks
):
    """After a 401 the connection's auth alert is open: the next leads are routed without
    HubSpot at once, spending no request that would be refused, until the health probe sees it
    answer again."""
    hs, connection = portal["hs"], portal["conn"]
    hs.expire_tokens()
    first = LeadFactory(raw_payload={"email": "one@fresh.io"})
    assert _route(first, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    assert crm_health_check() == {"HubSpot": "auth"}
    asked = len(hs.requests)
    second = LeadFactory(raw_payload={"email": "two@fresh.io"})
    assert _route(second, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    assert len(hs.requests) == asked  # not asked
    second.refresh_from_db()
    assert second.crm["hubspot"]["status"] == "failed"
    assert "credential refused" in second.crm["hubspot"]["reason"]
    whys = [step["why"] for step in Assignment.objects.get(lead=second).trace]
    assert any(
        why.startswith("HubSpot unavailable for this lead: credential refused") for why in whys
    ), whys
    # A new token: the probe sees HubSpot answer, the alert resolves, lookups ask again.
    connection.secret_encrypted = secret_seal(hs.rotate_token())
    connection.save()
    clear_connection_cache()
    assert crm_health_check() == {}
    third = LeadFactory(raw_payload={"email": "three@fresh.io"})
    assert _route(third, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    third.refresh_from_db()
    assert third.crm["hubspot"]["status"] == "done"


def test_a_missing_scope_does_not_stop_the_half_that_works(
    portal, django_capture_on_commit_callbacks
):
    """A permission one call lacks is no refused credential: lookups go on for the person."""
    hs = portal["hs"]
    hs.revoke_scope("crm.objects.companies.read")
    for i in range(2):
        lead = LeadFactory(raw_payload={"email": f"p{i}@acme{i}.com"})
        assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
        lead.refresh_from_db()
        assert lead.crm["hubspot"]["status"] == "done", lead.crm
    assert hs.paths("POST").count("/crm/v3/objects/contacts/search") == 2
