"""What routing does with a finished CRM lookup (``lead.crm``): the CRM owner, account ownership,
the trace; and that a new lead is parked for the lookup when a connection has it on."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from audit.models import Event, EventType
from leads.models import CrmLookupStatus, LeadStatus
from routing import decisions
from routing.crm.base import CrmUser
from routing.crm.lookup import clear_connection_cache
from routing.crm.models import CrmConnection
from routing.crm.roster import roster_apply
from routing.models import Assignment, AssignmentKind
from routing.services import lead_process
from tests.leads.factories import LeadFactory
from tests.routing.factories import RepFactory, published_ruleset, team_with

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh() -> None:
    decisions.clear_live_config_cache()
    clear_connection_cache()


def _found(person_owner: str | None, company_owner: str | None = None, **extra: Any) -> dict:
    """A finished HubSpot lookup as the stage stores it (the owners mapped by the roster)."""
    from routing.crm.roster import owner_reps

    connection = CrmConnection.objects.get(kind="hubspot")
    reps = owner_reps("hubspot", [x for x in (person_owner, company_owner) if x])
    person = {"object": "contact", "id": "501", "email": "pat@acme.com", "owner_id": person_owner}
    company = {"object": "company", "id": "901", "name": "Acme", "domain": "acme.com"}
    entry = {
        "status": "done",
        "connection": connection.pk,
        "name": connection.name,
        "honour_owner": connection.honour_crm_owner,
        "person": person if person_owner is not None else None,
        "company": {**company, "owner_id": company_owner} if company_owner is not None else None,
        "person_owner": reps[person_owner].to_json() if person_owner else None,
        "company_owner": reps[company_owner].to_json() if company_owner else None,
        "summary": "test",
        **extra,
    }
    return {"hubspot": entry}


@pytest.fixture
def world() -> dict[str, Any]:
    ana = RepFactory(email="ana@example.com", name="Ana")
    ben = RepFactory(email="ben@example.com", name="Ben")
    cy = RepFactory(email="cy@example.com", name="Cy")
    team = team_with([ben, cy])
    connection = CrmConnection.objects.create(kind="hubspot", name="HubSpot")
    roster_apply(
        connection,
        [
            CrmUser(id="7001", email="ana@example.com", active=True),
            CrmUser(id="7002", email="ben@example.com", active=True),
            CrmUser(id="7999", email="someone@example.com", active=True),
        ],
        create_reps=False,
    )
    published_ruleset(
        {"name": "Named accounts", "action": {"type": "account_owner"}},
        {"name": "Everyone", "action": {"type": "team", "team": team.name}},
    )
    return {"ana": ana, "ben": ben, "cy": cy, "team": team, "connection": connection}


def _lead(crm: dict, **fields: Any):
    return LeadFactory(
        raw_payload={"email": "pat@acme.com", **fields},
        crm_status=CrmLookupStatus.DONE,
        crm=crm,
    )


def test_a_person_owned_in_the_crm_by_a_rep_goes_to_that_rep(world):
    lead = _lead(_found("7001"))
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.kind == AssignmentKind.CRM_OWNER
    assert assignment.rep == world["ana"]
    assert assignment.reason == "already owned in HubSpot by Ana (contact 501)"
    assert any(entry["why"] == "HubSpot: test" for entry in assignment.trace)
    event = Event.objects.get(chain=str(lead.id), type=EventType.ASSIGNED)
    assert event.data["kind"] == "crm_owner"


def test_an_owner_out_of_office_is_noted_and_the_rules_decide(world):
    world["ana"].out_of_office_until = timezone.now() + timedelta(days=1)
    world["ana"].save()
    lead = _lead(_found("7001"))
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.kind == AssignmentKind.INITIAL
    assert assignment.rep == world["ben"]
    whys = [entry["why"] for entry in assignment.trace]
    until = f"{world['ana'].out_of_office_until:%Y-%m-%d %H:%M} UTC"
    assert (
        "already owned in HubSpot by Ana (contact 501), who cannot take leads now "
        f"(out of office until {until}): routed by the rules" in whys
    )


def test_an_owner_who_is_no_rep_is_noted_and_the_rules_decide(world):
    lead = _lead(_found("7999"))
    lead_process(lead_id=lead.id)
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.kind == AssignmentKind.INITIAL
    whys = [entry["why"] for entry in assignment.trace]
    assert "HubSpot: contact 501 is owned by someone@example.com, who is no rep" in whys


def test_an_owner_who_is_no_rep_is_logged_with_the_lead_id(world, caplog):
    lead = _lead(_found("7999"))
    with caplog.at_level("INFO", logger="routing.crm.facts"):
        lead_process(lead_id=lead.id)
    records = [r for r in caplog.records if r.name == "routing.crm.facts"]
    assert len(records) == 1
    record = records[0]
    assert record.levelname == "INFO"
    assert getattr(record, "lead_id", None) == str(lead.id)
    assert str(lead.id) in record.getMessage()
    assert "owned by someone@example.com, who is no rep" in record.getMessage()


def _deactivate_in_crm(email: str) -> None:
    from routing.crm.models import CrmOwner

    CrmOwner.objects.filter(kind="hubspot", email=email).update(active_in_crm=False)


def test_an_owner_deactivated_in_the_crm_is_noted_and_the_rules_decide(world):
    _deactivate_in_crm("ana@example.com")  # she left; RevOps has not deactivated the rep yet
    lead = _lead(_found("7001"))
    lead_process(lead_id=lead.id)
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.kind == AssignmentKind.INITIAL
    assert assignment.rep == world["ben"]
    whys = [entry["why"] for entry in assignment.trace]
    assert (
        "HubSpot: contact 501 is owned by Ana, whose HubSpot user is deactivated: "
        "routed by the rules" in whys
    )


def test_a_company_owned_by_a_user_deactivated_in_the_crm_has_no_account_owner(world):
    _deactivate_in_crm("ben@example.com")
    lead = _lead(_found(None, company_owner="7002"))
    lead_process(lead_id=lead.id)
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.rule_name == "Everyone"


def test_honour_crm_owner_off_lets_the_rules_decide(world):
    lead = _lead(_found("7001", honour_owner=False))
    lead_process(lead_id=lead.id)
    assert Assignment.objects.get(lead=lead).rep == world["ben"]


def test_a_crm_company_owner_is_the_account_owner(world):
    lead = _lead(_found(None, company_owner="7002"))
    lead_process(lead_id=lead.id)
    assignment = Assignment.objects.get(lead=lead)
    assert assignment.rep == world["ben"]
    assert assignment.rule_name == "Named accounts"
    facts = decisions.lead_facts(lead)
    assert facts.account is not None
    assert facts.account.name == "Acme"


def test_a_crm_unavailable_for_the_lead_is_in_the_trace(world):
    crm = {
        "hubspot": {
            "status": "failed",
            "connection": world["connection"].pk,
            "reason": "no answer within 120 s",
        }
    }
    lead = LeadFactory(
        raw_payload={"email": "pat@acme.com"}, crm_status=CrmLookupStatus.FAILED, crm=crm
    )
    lead_process(lead_id=lead.id)
    assignment = Assignment.objects.get(lead=lead)
    whys = [entry["why"] for entry in assignment.trace]
    assert "HubSpot unavailable for this lead: no answer within 120 s; routed without it" in whys


def test_a_new_lead_is_parked_for_the_lookup(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    from config.celery import app

    sent: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(app, "send_task", lambda name, args, **kw: sent.append((name, list(args))))
    lead = LeadFactory(raw_payload={"email": "pat@acme.com"})
    with django_capture_on_commit_callbacks(execute=True):
        assert lead_process(lead_id=lead.id) == LeadStatus.PROCESSING
    lead.refresh_from_db()
    assert lead.crm_status == CrmLookupStatus.PENDING
    assert lead.claimed_until is None
    assert sent == [("crm.lookup_lead", [str(lead.id)])]
    assert not Assignment.objects.filter(lead=lead).exists()


def test_no_connection_no_parking(world):
    world["connection"].lookup_enabled = False
    world["connection"].save()
    clear_connection_cache()
    lead = LeadFactory(raw_payload={"email": "pat@acme.com"})
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    lead.refresh_from_db()
    assert lead.crm_status == CrmLookupStatus.NONE


def test_a_replay_reads_the_stored_crm_owner_and_shows_no_change(world):
    from routing.models import RuleSet
    from routing.versions import ruleset_replay

    owned = _lead(_found("7001"))
    lead_process(lead_id=owned.id)
    live = RuleSet.objects.get(status="published")
    result = ruleset_replay(ruleset=live, limit=10)
    assert result.considered == 1
    assert result.changed == 0  # the rules alone would give it to Ben
