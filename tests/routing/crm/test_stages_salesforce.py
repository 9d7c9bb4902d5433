"""The CRM stages end to end against the Salesforce stand-in, through the real client library:
the roster, the lookup parked on its queue and handed back, the owner who already has the person,
owner write-back through the outbox, first touch and owner changes read back, and what happens
when the CRM is rate limiting, failing or refusing the credential."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from audit.models import Event
from leads.models import CrmLookupStatus, Lead, LeadStatus
from routing import decisions
from routing.crm.health import crm_health_check
from routing.crm.lookup import clear_connection_cache, crm_sweep_due, lead_crm_lookup
from routing.crm.models import CrmConnection, CrmOwner
from routing.crm.salesforce import clear_token_cache
from routing.crm.secrets import secret_seal
from routing.crm.touches import crm_touches_sync
from routing.delivery.models import Delivery, DeliveryStatus
from routing.delivery.services import delivery_attempt
from routing.models import Assignment, AssignmentKind
from routing.monitoring.models import Alert
from routing.services import lead_process
from tests.leads.factories import LeadFactory
from tests.routing.crm.orgs import salesforce_org
from tests.routing.enrichment.conftest import Sent, sent
from tests.support.crm_salesforce import SalesforceStandIn, salesforce_standin

__all__ = ["salesforce_standin", "sent"]

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    decisions.clear_live_config_cache()
    clear_connection_cache()
    clear_token_cache()
    yield
    clear_token_cache()
    decisions.clear_live_config_cache()


@pytest.fixture
def org(salesforce_standin: SalesforceStandIn, settings: Any) -> dict[str, Any]:
    """An org with two users who are reps, one who is not, and a connection to it."""
    settings.CRM_CA_BUNDLE = salesforce_standin.ca_file
    settings.CRM_LOOKUP_BACKOFF_SECONDS = 0
    # The pace is tested elsewhere (test_limits, test_pace, the worker tests): with a burst
    # of 10, two leads' lookups and write-backs outrun the bucket's refill now that the
    # stand-in answers without Nagle's 40 ms; the org's default is 60,000 a minute, burst 100.
    return salesforce_org(
        salesforce_standin,
        {"name": "Named accounts", "action": {"type": "account_owner"}},
        touches_enabled=True,
    )


def _route(lead: Lead, capture: Any) -> str | None:
    """The pipeline as the workers run it: park, look up, hand back, route."""
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
    delivery_attempt(delivery_id=delivery.pk)
    delivery.refresh_from_db()
    return delivery


def test_roster_links_users_to_reps_by_email(org):
    owners = dict(CrmOwner.objects.filter(kind="salesforce").values_list("email", "rep__email"))
    assert owners["ana@example.com"] == "ana@example.com"
    assert owners["ben@example.com"] == "ben@example.com"
    assert owners["ops@example.com"] is None  # a user who is no rep is mirrored, not linked


def test_a_person_owned_in_salesforce_goes_to_its_owner_and_the_owner_is_kept(
    org, sent: Sent, django_capture_on_commit_callbacks
):
    sf = org["sf"]
    sf.add_lead(Email="pat@acme.com", LastName="Pat", Company="Acme", OwnerId=org["users"]["ben"])
    lead = LeadFactory(raw_payload={"email": "pat@acme.com", "company": "Acme"})
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_process(lead_id=lead.id) == LeadStatus.PROCESSING  # parked for the CRM
    lead.refresh_from_db()
    assert lead.crm_status == CrmLookupStatus.PENDING
    assert sent.ids("crm.lookup_lead") == [str(lead.id)]
    assert not Assignment.objects.filter(lead=lead).exists()

    with django_capture_on_commit_callbacks(execute=True):
        assert lead_crm_lookup(lead_id=lead.id) == "done"
    assert str(lead.id) in sent.ids("routing.process_lead")
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.rep_id == org["ben"].pk
    assert assignment.kind == AssignmentKind.CRM_OWNER
    assert "already owned in Salesforce by" in assignment.reason
    types = list(Event.objects.filter(lead=lead).order_by("seq").values_list("type", flat=True))
    assert types[:3] == ["received", "crm_checked", "assigned"]

    # Write-back finds the owner already right: nothing is patched.
    before = [r.method for r in sf.requests]
    delivery = _write_back(lead)
    assert delivery.status == DeliveryStatus.DELIVERED, delivery.last_error
    assert "PATCH" not in [r.method for r in sf.requests[len(before) :]]


def test_a_new_person_is_round_robined_and_written_to_salesforce_once(
    org, sent: Sent, django_capture_on_commit_callbacks
):
    sf = org["sf"]
    lead = LeadFactory(
        raw_payload={"email": "new@fresh.io", "first_name": "Nia", "last_name": "New"},
    )
    assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.kind != AssignmentKind.CRM_OWNER
    delivery = _write_back(lead)
    assert delivery.status == DeliveryStatus.DELIVERED, delivery.last_error
    created = [r for r in sf.requests if r.method == "POST" and "/sobjects/Lead" in r.path]
    assert len(created) == 1
    # The org's lead assignment rule must not re-own what we write (it runs by default).
    assert created[0].auto_assign == "FALSE"
    lead.refresh_from_db()
    written = lead.crm["salesforce"]["written"]
    assert written["outcome"] == "created"
    owner = sf.record("Lead", written["id"])
    assert owner is not None
    expected = CrmOwner.objects.get(kind="salesforce", rep=assignment.rep).owner_id
    assert owner["OwnerId"] == expected

    # A repeated delivery (a lost acknowledgement) does not create a second person.
    Delivery.objects.filter(pk=delivery.pk).update(
        status=DeliveryStatus.PENDING, next_attempt_at=timezone.now()
    )
    _write_back(lead)
    created = [r for r in sf.requests if r.method == "POST" and "/sobjects/Lead" in r.path]
    assert len(created) == 1


def test_first_touch_and_a_status_change_are_read_back_from_salesforce(
    org, django_capture_on_commit_callbacks
):
    sf = org["sf"]
    one = LeadFactory(raw_payload={"email": "one@fresh.io", "last_name": "One"})
    two = LeadFactory(raw_payload={"email": "two@fresh.io", "last_name": "Two"})
    for lead in (one, two):
        _route(lead, django_capture_on_commit_callbacks)
        _write_back(lead)
        lead.refresh_from_db()
    report = crm_touches_sync(org["connection"])
    assert (report.read, report.touched) == (2, 0)  # nothing done in the CRM yet

    first = one.crm["salesforce"]["written"]["id"]
    sf.add_task(WhoId=first, CreatedDate=dt.datetime.now(dt.UTC) + timedelta(seconds=1))
    second = two.crm["salesforce"]["written"]["id"]
    sf.edit("Lead", second, Status="Working - Contacted")
    report = crm_touches_sync(org["connection"])
    assert report.touched == 2
    touched = {a.lead_id: a for a in Assignment.objects.filter(active=True)}
    assert touched[one.id].touch_source == "salesforce"
    assert touched[one.id].touched_at is not None
    assert touched[two.id].touch_source == "salesforce"
    assert crm_touches_sync(org["connection"]).touched == 0  # recorded once


def test_an_owner_changed_in_salesforce_is_a_reassignment_without_a_write_back(
    org, django_capture_on_commit_callbacks
):
    sf = org["sf"]
    lead = LeadFactory(raw_payload={"email": "moved@fresh.io", "last_name": "Moved"})
    _route(lead, django_capture_on_commit_callbacks)
    _write_back(lead)
    lead.refresh_from_db()
    first = Assignment.objects.get(lead=lead, active=True)
    other = org["ben"] if first.rep_id == org["ana"].pk else org["ana"]
    other_user = CrmOwner.objects.get(kind="salesforce", rep=other).owner_id
    sf.edit("Lead", lead.crm["salesforce"]["written"]["id"], OwnerId=other_user)
    report = crm_touches_sync(org["connection"])
    assert report.reassigned == 1
    current = Assignment.objects.get(lead=lead, active=True)
    assert current.rep_id == other.pk
    assert current.kind == AssignmentKind.REASSIGNMENT
    assert "reassigned in Salesforce" in current.reason
    assert not Delivery.objects.filter(assignment=current, channel="crm").exists()


@pytest.mark.parametrize(
    "why",
    ["inactive", "out of office", "deactivated in the CRM", "on leave", "company holiday"],
)
def test_an_owner_changed_in_salesforce_to_an_ineligible_rep_is_noted_not_assigned(
    org, why, django_capture_on_commit_callbacks
):
    """The new owner maps to a rep who could not take a lead: recorded as an owner who is no
    rep (worked outside LeadRouter, SLA clock stopped), not as an assignment to that rep."""
    from routing.models import Rep

    sf = org["sf"]
    lead = LeadFactory(raw_payload={"email": "parked@fresh.io", "last_name": "Parked"})
    _route(lead, django_capture_on_commit_callbacks)
    _write_back(lead)
    lead.refresh_from_db()
    first = Assignment.objects.get(lead=lead, active=True)
    other = org["ben"] if first.rep_id == org["ana"].pk else org["ana"]
    owner = CrmOwner.objects.get(kind="salesforce", rep=other)
    if why == "inactive":
        Rep.objects.filter(pk=other.pk).update(active=False)
    elif why == "out of office":
        Rep.objects.filter(pk=other.pk).update(
            out_of_office_until=timezone.now() + timedelta(days=3)
        )
    elif why in ("on leave", "company holiday"):
        from tests.routing.crm.test_owner_time_off import away

        away(other, "leave" if why == "on leave" else "holiday")
    else:
        CrmOwner.objects.filter(pk=owner.pk).update(active_in_crm=False)
    sf.edit("Lead", lead.crm["salesforce"]["written"]["id"], OwnerId=owner.owner_id)

    report = crm_touches_sync(org["connection"])

    assert report.reassigned == 1  # an owner change recorded (assignment or note)
    assert not Assignment.objects.filter(lead=lead, rep=other).exists()
    current = Assignment.objects.get(lead=lead, active=True)
    assert current.pk == first.pk
    assert current.touched_at is not None  # the SLA clock stopped
    assert current.touch_source == "salesforce"
    event = Event.objects.filter(lead=lead, type="reassigned").latest("id")
    assert event.data["to_owner"] == owner.owner_id
    assert "the lead is worked outside LeadRouter's reps" in event.data["reason"]
    assert why in event.data["reason"]


def test_rate_limited_lookups_wait_and_then_route_without_the_crm(
    org, settings, django_capture_on_commit_callbacks
):
    settings.CRM_LOOKUP_MAX_ATTEMPTS = 2
    sf = org["sf"]
    sf.limit_next(10)  # 403 REQUEST_LIMIT_EXCEEDED on every call
    lead = LeadFactory(raw_payload={"email": "busy@fresh.io"})
    with django_capture_on_commit_callbacks(execute=True):
        lead_process(lead_id=lead.id)
    assert lead_crm_lookup(lead_id=lead.id) == "retry"
    Lead.objects.filter(id=lead.id).update(crm_next_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_crm_lookup(lead_id=lead.id) == "failed"
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    lead.refresh_from_db()
    assert lead.crm["salesforce"]["status"] == "failed"
    assert "rate limited" in lead.crm["salesforce"]["reason"]
    event = Event.objects.get(lead=lead, type="crm_checked")
    assert "unavailable" in event.data["summary"]


def test_a_failing_crm_opens_the_breaker_and_later_leads_do_not_wait_for_it(
    org, settings, django_capture_on_commit_callbacks
):
    settings.CRM_BREAKER_FAILURES = 2
    settings.CRM_LOOKUP_MAX_ATTEMPTS = 1
    sf = org["sf"]
    sf.fail_next(50, status=503)
    leads = [LeadFactory(raw_payload={"email": f"p{i}@fresh.io"}) for i in range(3)]
    for lead in leads[:2]:
        with django_capture_on_commit_callbacks(execute=True):
            lead_process(lead_id=lead.id)
        assert lead_crm_lookup(lead_id=lead.id) == "failed"
    calls = len(sf.requests)
    with django_capture_on_commit_callbacks(execute=True):
        lead_process(lead_id=leads[2].id)
    assert lead_crm_lookup(lead_id=leads[2].id) == "failed"
    assert len(sf.requests) == calls  # the open breaker made no call
    leads[2].refresh_from_db()
    assert "breaker open" in leads[2].crm["salesforce"]["reason"]


def test_a_refused_credential_raises_the_crm_alert_and_routing_goes_on(
    org, settings, django_capture_on_commit_callbacks
):
    connection = org["connection"]
    connection.secret_encrypted = secret_seal("not-the-secret")
    connection.save()
    clear_connection_cache()
    clear_token_cache()
    lead = LeadFactory(raw_payload={"email": "auth@fresh.io"})
    assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    lead.refresh_from_db()
    assert "credential" in lead.crm["salesforce"]["reason"]
    problems = crm_health_check()
    assert problems == {"Salesforce": "auth"}
    alert = Alert.objects.get(kind="crm", status="open")
    assert alert.subject == "Salesforce"
    # The credential is replaced: the probe succeeds and the alert resolves.
    connection.secret_encrypted = secret_seal(org["sf"].client_secret)
    connection.save()
    clear_token_cache()
    assert crm_health_check() == {}
    assert not Alert.objects.filter(kind="crm", status="open").exists()


def test_the_sweeper_resends_a_lookup_whose_message_was_lost(
    org, sent: Sent, django_capture_on_commit_callbacks
):
    lead = LeadFactory(raw_payload={"email": "lost@fresh.io"})
    lead_process(lead_id=lead.id)  # the on-commit publication is never run: lost
    assert sent.ids("crm.lookup_lead") == []
    assert crm_sweep_due() >= 1
    assert sent.ids("crm.lookup_lead") == [str(lead.id)]


def _other(org: dict[str, Any], rep_id: int) -> Any:
    return org["ben"] if rep_id == org["ana"].pk else org["ana"]


def test_an_owner_changed_in_salesforce_after_our_write_is_not_overwritten_by_a_reassignment(
    org, django_capture_on_commit_callbacks
):
    from routing.services import lead_reassign

    sf = org["sf"]
    lead = LeadFactory(raw_payload={"email": "kept@fresh.io", "last_name": "Kept"})
    _route(lead, django_capture_on_commit_callbacks)
    _write_back(lead)
    lead.refresh_from_db()
    person_id = lead.crm["salesforce"]["written"]["id"]
    sf.edit("Lead", person_id, OwnerId=org["users"]["ops"])  # someone in Salesforce took it
    first = Assignment.objects.get(lead=lead, active=True)
    with django_capture_on_commit_callbacks(execute=True):
        lead_reassign(
            lead_id=lead.id,
            rep_email=_other(org, first.rep_id).email,
            reason="cover",
            actor="manager",
        )
    delivery = _write_back(lead)
    assert delivery.status == DeliveryStatus.DELIVERED, delivery.last_error
    record = sf.record("Lead", person_id)
    assert record is not None
    assert record["OwnerId"] == org["users"]["ops"]  # the later change, in Salesforce, won
    lead.refresh_from_db()
    assert lead.crm["salesforce"]["written"]["outcome"] == "kept"
    reasons = list(
        Event.objects.filter(lead=lead, type="reassigned").values_list("data__reason", flat=True)
    )
    assert any("owner changed in Salesforce" in (reason or "") for reason in reasons), reasons


def test_a_reassignment_before_the_first_write_updates_the_owner_the_lookup_found(
    org, django_capture_on_commit_callbacks
):
    """The superseded assignment's write was cancelled, so Salesforce still shows the owner the
    lookup found: that is no change made in Salesforce, and the new owner is written."""
    from routing.services import lead_reassign

    sf = org["sf"]
    person_id = sf.add_lead(
        Email="old@acme.com", LastName="Old", Company="Acme", OwnerId=org["users"]["ops"]
    )
    lead = LeadFactory(raw_payload={"email": "old@acme.com"})
    _route(lead, django_capture_on_commit_callbacks)  # ops is no rep: round robin
    first = Assignment.objects.get(lead=lead, active=True)
    target = _other(org, first.rep_id)
    with django_capture_on_commit_callbacks(execute=True):
        lead_reassign(lead_id=lead.id, rep_email=target.email, reason="cover", actor="manager")
    for delivery in Delivery.objects.filter(assignment=first, channel="crm"):
        delivery_attempt(delivery_id=delivery.pk)
    delivery = _write_back(lead)
    assert delivery.status == DeliveryStatus.DELIVERED, delivery.last_error
    record = sf.record("Lead", person_id)
    assert record is not None
    assert record["OwnerId"] == CrmOwner.objects.get(kind="salesforce", rep=target).owner_id


def test_an_earlier_activity_does_not_hide_the_first_touch_after_a_later_assignment(
    org, django_capture_on_commit_callbacks
):
    """Two leads read in one batch, assigned hours apart: the later one's person has a Task
    from before its assignment (a previous rep's) and one after it (its rep's first touch)."""
    sf = org["sf"]
    old = LeadFactory(raw_payload={"email": "old@fresh.io", "last_name": "Old"})
    new = LeadFactory(raw_payload={"email": "new@fresh.io", "last_name": "New"})
    for lead in (old, new):
        _route(lead, django_capture_on_commit_callbacks)
        _write_back(lead)
        lead.refresh_from_db()
    now = timezone.now().replace(microsecond=0)  # Salesforce keeps whole seconds
    Assignment.objects.filter(lead=old).update(assigned_at=now - timedelta(hours=3))
    assigned = now - timedelta(hours=1)
    Assignment.objects.filter(lead=new).update(assigned_at=assigned)
    person = new.crm["salesforce"]["written"]["id"]
    sf.add_task(WhoId=person, CreatedDate=assigned - timedelta(minutes=30))  # a previous rep's
    first_touch = assigned + timedelta(minutes=10)
    sf.add_task(WhoId=person, CreatedDate=first_touch)
    report = crm_touches_sync(org["connection"])
    assert report.touched == 1
    touched = Assignment.objects.get(lead=new, active=True)
    assert touched.touch_source == "salesforce"
    assert touched.touched_at is not None
    assert abs((touched.touched_at - first_touch).total_seconds()) < 0.01


@pytest.mark.parametrize("edited", [False, True], ids=["untouched", "edited"])
def test_an_owner_salesforce_had_is_not_overwritten_when_the_lookup_failed(
    org, settings, edited, django_capture_on_commit_callbacks
):
    """Ben owns the Lead in Salesforce; the lookup failed, so the rules gave it to Ana. The
    write-back keeps Ben (an owner we never saw) and the lead follows him, said as the owner
    Salesforce had, not as an owner change, even when the record was edited after the
    assignment (LastModifiedDate moves on any edit) (review finding B5)."""
    settings.CRM_LOOKUP_MAX_ATTEMPTS = 1
    sf = org["sf"]
    person_id = sf.add_lead(
        Email="owned@acme.com", LastName="Owned", Company="Acme", OwnerId=org["users"]["ben"]
    )
    ben = org["ben"]
    ben.out_of_office_until = timezone.now() + timedelta(hours=1)  # so the rules pick Ana
    ben.save()
    lead = LeadFactory(raw_payload={"email": "owned@acme.com"})
    sf.fail_next(1, status=503)
    assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    ben.out_of_office_until = None
    ben.save()
    lead.refresh_from_db()
    assert lead.crm["salesforce"]["status"] == "failed"
    first = Assignment.objects.get(lead=lead, active=True)
    assert first.rep_id == org["ana"].pk
    if edited:
        sf.edit("Lead", person_id, Status="Working - Contacted")
    sf.reset_log()
    with django_capture_on_commit_callbacks(execute=True):
        delivery = _write_back(lead)
    assert delivery.status == DeliveryStatus.DELIVERED, delivery.last_error
    assert sf.record("Lead", person_id)["OwnerId"] == org["users"]["ben"]
    assert "PATCH" not in [r.method for r in sf.requests]
    current = Assignment.objects.get(lead=lead, active=True)
    assert current.rep_id == org["ben"].pk
    assert current.reason == "already owned in Salesforce by Ben (found at write-back)"
    assert not Delivery.objects.filter(assignment=current, channel="crm").exists()
    lead.refresh_from_db()
    assert lead.crm["salesforce"]["written"]["outcome"] == "owned"
    reasons = list(
        Event.objects.filter(lead=lead, type="reassigned").values_list("data__reason", flat=True)
    )
    assert len(reasons) == 1
    assert not any("changed" in reason for reason in reasons), reasons
    assert crm_touches_sync(org["connection"]).reassigned == 0


def test_an_object_the_integration_user_cannot_read_raises_an_alert_naming_it(org):
    sf, connection = org["sf"], org["connection"]
    sf.hide_object("Account")
    CrmConnection.objects.filter(pk=connection.pk).update(last_ok_at=None)  # idle: probed
    assert crm_health_check() == {"Salesforce": "auth"}
    alert = Alert.objects.get(kind="crm", status="open")
    assert "cannot read Account" in alert.message
    sf.show_object("Account")
    assert crm_health_check() == {}
    assert not Alert.objects.filter(kind="crm", status="open").exists()


def test_accounts_unreadable_keep_the_person_found_and_alert(
    org, django_capture_on_commit_callbacks
):
    sf = org["sf"]
    sf.hide_object("Account")
    sf.add_contact(Email="pat@acme.com", LastName="Pat", OwnerId=org["users"]["ana"])
    lead = LeadFactory(raw_payload={"email": "pat@acme.com", "company": "Acme"})
    assert _route(lead, django_capture_on_commit_callbacks) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert (assignment.kind, assignment.rep_id) == (AssignmentKind.CRM_OWNER, org["ana"].pk)
    lead.refresh_from_db()
    entry = lead.crm["salesforce"]
    assert entry["status"] == "done"
    assert entry["person"]["object"] == "Contact"
    assert "cannot read" in entry["missing"]["company"]
    # The lookup itself says it is a permission: the alert opens without waiting for a probe.
    assert crm_health_check(probe=False) == {"Salesforce": "auth"}


def test_a_reassignment_after_the_lead_was_converted_is_written_on_its_contact(
    org, django_capture_on_commit_callbacks
):
    """The Lead we wrote was converted in Salesforce since: the reassignment's owner goes to the
    Contact it became (delivered, not a dead letter for CANNOT_UPDATE_CONVERTED_LEAD)."""
    from routing.services import lead_reassign

    sf = org["sf"]
    lead = LeadFactory(raw_payload={"email": "conv@fresh.io", "last_name": "Conv"})
    _route(lead, django_capture_on_commit_callbacks)
    _write_back(lead)
    lead.refresh_from_db()
    person_id = lead.crm["salesforce"]["written"]["id"]
    contact = sf.convert_lead(person_id)  # the Contact keeps the Lead's (our) owner
    first = Assignment.objects.get(lead=lead, active=True)
    target = _other(org, first.rep_id)
    with django_capture_on_commit_callbacks(execute=True):
        lead_reassign(lead_id=lead.id, rep_email=target.email, reason="cover", actor="manager")
    delivery = _write_back(lead)
    assert delivery.status == DeliveryStatus.DELIVERED, delivery.last_error
    expected = CrmOwner.objects.get(kind="salesforce", rep=target).owner_id
    record = sf.record("Contact", contact)
    assert record is not None
    assert record["OwnerId"] == expected
    lead.refresh_from_db()
    written = lead.crm["salesforce"]["written"]
    assert (written["object"], written["id"], written["outcome"]) == ("Contact", contact, "updated")


def test_a_lead_a_duplicate_rule_blocks_is_written_on_the_record_it_matched(
    org, django_capture_on_commit_callbacks
):
    """The lookup finds nobody by e-mail; the org's duplicate rule blocks the create because a
    Lead with the same name and company exists, owned by us before: that Lead gets the owner."""
    sf = org["sf"]
    sf.lead_duplicate_rule(True)
    existing = sf.add_lead(
        Email="work@acme.com", FirstName="Dee", LastName="Dup", Company="Acme",
        OwnerId=org["users"]["ops"],
    )  # fmt: skip
    lead = LeadFactory(
        raw_payload={
            "email": "private@home.example",
            "first_name": "Dee",
            "last_name": "Dup",
            "company": "Acme",
        }
    )
    _route(lead, django_capture_on_commit_callbacks)  # nobody found: round robin
    assignment = Assignment.objects.get(lead=lead, active=True)
    delivery = _write_back(lead)
    assert delivery.status == DeliveryStatus.DELIVERED, delivery.last_error
    assert len(sf.records["Lead"]) == 1  # nothing created
    lead.refresh_from_db()
    written = lead.crm["salesforce"]["written"]
    assert (written["object"], written["id"]) == ("Lead", existing)
    # ops (no rep) owned it in Salesforce, unseen by the lookup: kept, worked outside.
    assert written["outcome"] == "owned"
    record = sf.record("Lead", existing)
    assert record is not None
    assert record["OwnerId"] == org["users"]["ops"]
    assert assignment.rep_id in (org["ana"].pk, org["ben"].pk)
