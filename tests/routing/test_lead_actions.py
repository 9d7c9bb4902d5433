"""POST /api/v1/leads/<id>/touch/, /reassign/ and /reroute/ (api.md, "Leads")."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from rest_framework.authtoken.models import Token

from audit.models import Event
from leads.models import Lead, LeadStatus
from routing.decisions import clear_live_config_cache
from routing.models import Assignment, AssignmentKind, Rep
from routing.rules_io import rules_import
from routing.services import lead_process, lead_reassign
from tests.leads.factories import LeadFactory
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db


@pytest.fixture
def rules():
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    yield
    clear_live_config_cache()


def _client(client, *perms: str, username: str = "manager"):
    user = User.objects.create_user(username, password="pw")
    for perm in ("view_lead", *perms):
        user.user_permissions.add(Permission.objects.get(codename=perm))
    client.defaults["HTTP_AUTHORIZATION"] = f"Token {Token.objects.create(user=user).key}"
    return client, user


def _assigned(email: str = "x@acme.com") -> Lead:
    lead = LeadFactory(raw_payload={"email": email})
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    return lead


def post(client, url, body=None):
    return client.post(url, body or {}, content_type="application/json")


def test_touch_is_idempotent_and_audited(client, rules):
    api, _ = _client(client, "touch_lead")
    lead = _assigned()
    first = post(api, f"/api/v1/leads/{lead.id}/touch/")
    assert first.status_code == 200, first.json()
    touched_at = first.json()["assignment"]["touched_at"]
    assert touched_at is not None
    again = post(api, f"/api/v1/leads/{lead.id}/touch/")
    assert again.status_code == 200
    assert again.json()["assignment"]["touched_at"] == touched_at
    types = [e["type"] for e in again.json()["events"]]
    assert types == ["received", "assigned", "touched"]
    assert again.json()["events"][-1]["actor"] == "user:manager"
    assert again.json()["events"][-1]["data"] == {"sla_met": True}


def test_the_owner_may_touch_their_own_lead_and_nobody_else_without_the_permission(client, rules):
    lead = _assigned()
    ana_user = User.objects.create_user("ana", password="pw")
    ana_user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    Rep.objects.filter(email="ana@example.com").update(user=ana_user)
    other, _ = _client(client, username="ben")
    assert post(other, f"/api/v1/leads/{lead.id}/touch/").status_code == 403
    client.defaults["HTTP_AUTHORIZATION"] = f"Token {Token.objects.create(user=ana_user).key}"
    assert post(client, f"/api/v1/leads/{lead.id}/touch/").status_code == 200


def test_touching_a_lead_without_an_owner_is_a_conflict(client):
    api, _ = _client(client, "touch_lead")
    lead = LeadFactory()
    lead_process(lead_id=lead.id)  # no ruleset: unassigned
    response = post(api, f"/api/v1/leads/{lead.id}/touch/")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_assigned"


def test_reassign_supersedes_the_owner_with_actor_and_reason(client, rules):
    api, _ = _client(client, "reassign_lead")
    lead = _assigned()
    response = post(
        api, f"/api/v1/leads/{lead.id}/reassign/", {"rep": "BEN@example.com", "reason": "speaks DE"}
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["assignment"]["rep"]["email"] == "ben@example.com"
    assert body["status"] == "assigned"
    event = body["events"][-1]
    assert event["type"] == "reassigned"
    assert event["actor"] == "user:manager"
    assert event["data"]["reason"] == "speaks DE"
    assert event["data"]["from"]["name"] == "Ana"
    chain = list(Assignment.objects.filter(lead=lead).order_by("id"))
    assert [(a.kind, a.active) for a in chain] == [
        (AssignmentKind.INITIAL, False),
        (AssignmentKind.REASSIGNMENT, True),
    ]
    assert chain[1].supersedes_id == chain[0].pk
    # The same rep again: nothing changes.
    again = post(
        api, f"/api/v1/leads/{lead.id}/reassign/", {"rep": "ben@example.com", "reason": "x"}
    )
    assert again.status_code == 200
    assert Assignment.objects.filter(lead=lead).count() == 2


def test_an_unassigned_lead_gets_its_first_owner_by_hand(client):
    api, _ = _client(client, "reassign_lead")
    Rep.objects.create(email="cleo@example.com", name="Cleo")
    lead = LeadFactory()
    lead_process(lead_id=lead.id)
    response = post(
        api, f"/api/v1/leads/{lead.id}/reassign/", {"rep": "cleo@example.com", "reason": "mine"}
    )
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "assigned"
    assert Assignment.objects.get(lead=lead).kind == AssignmentKind.INITIAL


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"rep": "nobody@example.com", "reason": "r"}, 422, "unknown_rep"),
        ({"rep": "ben@example.com"}, 400, "invalid_body"),
        ({"rep": "ben@example.com", "reason": "   "}, 400, "invalid_body"),
        ({"rep": 5, "reason": "r"}, 400, "invalid_body"),
        ({"rep": "ben@example.com", "reason": "r" * 1001}, 400, "invalid_body"),
        ([1, 2], 400, "invalid_body"),
    ],
)
def test_bad_reassignments_are_clear_errors_and_change_nothing(client, rules, body, status, code):
    api, _ = _client(client, "reassign_lead")
    lead = _assigned()
    response = post(api, f"/api/v1/leads/{lead.id}/reassign/", body)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert Assignment.objects.filter(lead=lead).count() == 1
    assert not Event.objects.filter(lead=lead, type="reassigned").exists()


def test_reassigning_to_an_inactive_rep_or_a_lead_in_progress_is_refused(client, rules):
    api, _ = _client(client, "reassign_lead")
    lead = _assigned()
    Rep.objects.filter(email="ben@example.com").update(active=False)
    response = post(
        api, f"/api/v1/leads/{lead.id}/reassign/", {"rep": "ben@example.com", "reason": "r"}
    )
    assert (response.status_code, response.json()["error"]["code"]) == (422, "rep_inactive")
    waiting = LeadFactory()
    response = post(
        api, f"/api/v1/leads/{waiting.id}/reassign/", {"rep": "ana@example.com", "reason": "r"}
    )
    assert (response.status_code, response.json()["error"]["code"]) == (409, "lead_in_progress")


def test_actions_need_their_permission_and_an_existing_lead(client, rules):
    api, _ = _client(client)
    lead = _assigned()
    for action in ("touch", "reassign", "reroute"):
        assert post(api, f"/api/v1/leads/{lead.id}/{action}/").status_code == 403
    api2, _ = _client(client, "reassign_lead", "reroute_lead", "touch_lead", username="boss")
    for action in ("touch", "reassign", "reroute"):
        response = post(
            api2, f"/api/v1/leads/{uuid.uuid4()}/{action}/", {"rep": "a@b.c", "reason": "r"}
        )
        assert response.status_code == 404, action
        assert response.json()["error"]["code"] == "not_found"
    assert post(api2, "/api/v1/leads/not-a-uuid/touch/").status_code == 404
    client.defaults.pop("HTTP_AUTHORIZATION")
    assert post(client, f"/api/v1/leads/{lead.id}/touch/").status_code in (401, 403)


def test_reroute_sends_an_unassigned_lead_through_routing_again(client, settings):
    settings.ENQUEUE_IN_BACKGROUND = False
    api, _ = _client(client, "reroute_lead")
    clear_live_config_cache()
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=lead.id) == LeadStatus.UNASSIGNED
    rules_import(RULES, publish=True)
    clear_live_config_cache()
    response = post(api, f"/api/v1/leads/{lead.id}/reroute/")
    assert response.status_code == 202, response.json()
    assert response.json()["status"] == "received"
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    types = list(Event.objects.filter(lead=lead).order_by("seq").values_list("type", flat=True))
    assert types == ["received", "unassigned", "reroute_requested", "assigned"]
    again = post(api, f"/api/v1/leads/{lead.id}/reroute/")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "not_reroutable")
    clear_live_config_cache()


def test_every_new_owner_gets_a_delivery_and_failures_never_undo_it(client, rules, settings):
    """Assignments, sticky duplicates and reassignments each schedule the rep's e-mail and a
    webhook per subscribed endpoint, in the assignment's transaction; a reassignment also tells
    the rep it left (``lead.reassigned_away``, e-mail only: never to an endpoint)."""
    from routing.delivery.models import Delivery, WebhookEndpoint

    settings.DELIVERY_ALLOW_PRIVATE_URLS = True
    WebhookEndpoint.objects.create(name="crm", url="http://127.0.0.1:9/hook")
    lead = _assigned("x@acme.com")
    twin = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=twin.id) == LeadStatus.DUPLICATE
    api, _ = _client(client, "reassign_lead")
    response = post(
        api, f"/api/v1/leads/{lead.id}/reassign/", {"rep": "ben@example.com", "reason": "r"}
    )
    assert response.status_code == 200
    rows = Delivery.objects.order_by("id").values_list(
        "assignment__lead_id", "channel", "event", "recipient"
    )
    by_lead = Counter((lead_id, channel, event) for lead_id, channel, event, _ in rows)
    assert by_lead == {
        (lead.id, "email", "lead.assigned"): 1,
        (lead.id, "webhook", "lead.assigned"): 1,
        (twin.id, "email", "lead.assigned"): 1,
        (twin.id, "webhook", "lead.assigned"): 1,
        (lead.id, "email", "lead.reassigned"): 1,
        (lead.id, "webhook", "lead.reassigned"): 1,
        (lead.id, "email", "lead.reassigned_away"): 1,
    }
    emails = [r for _, channel, _, r in rows if channel == "email"]
    assert emails == ["ana@example.com", "ana@example.com", "ben@example.com", "ana@example.com"]


def test_a_deactivated_reps_untouched_leads_go_to_someone_else(admin_client, rules, settings):
    """Deactivating a rep in the admin routes their untouched leads again; touched ones stay."""
    from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

    settings.REROUTE_OPEN_LEADS_ON_ABSENCE = True
    leads = [_assigned(f"p{i}@acme.com") for i in range(4)]  # ana, ben, ana, ben
    ana = Rep.objects.get(email="ana@example.com")
    touched = leads[2]
    Assignment.objects.filter(lead=touched).update(touched_at=timezone.now())
    response = admin_client.post(
        "/admin/routing/rep/",
        {"action": "deactivate", ACTION_CHECKBOX_NAME: [ana.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert "1 open lead(s) routed to someone else" in response.content.decode()
    moved = Assignment.objects.get(lead=leads[0], active=True)
    assert moved.rep.email == "ben@example.com"
    assert moved.kind == AssignmentKind.REASSIGNMENT
    assert moved.supersedes.rep_id == ana.pk
    assert Assignment.objects.get(lead=touched, active=True).rep_id == ana.pk
    event = Event.objects.filter(lead=leads[0]).order_by("seq").last()
    assert event.type == "reassigned"
    assert event.data["manual"] is False
    assert event.data["reason"] == "Ana deactivated"
    assert Lead.objects.get(pk=leads[0].pk).status == LeadStatus.ASSIGNED


def test_a_lead_with_no_other_eligible_owner_stays_with_its_rep(rules):
    from routing.services import rep_reroute_open_leads

    lead = _assigned()
    Rep.objects.update(active=False)
    clear_live_config_cache()
    ana = Rep.objects.get(email="ana@example.com")
    report = rep_reroute_open_leads(rep_id=ana.pk, actor="user:m", reason="Ana deactivated")
    assert (report.moved, report.kept) == (0, 1)
    assert Assignment.objects.get(lead=lead, active=True).rep_id == ana.pk
    assert Lead.objects.get(pk=lead.pk).status == LeadStatus.ASSIGNED


def test_a_manual_reassignment_counts_its_sla_in_working_hours_too(client):
    """Only routed assignments counted in working hours; a reassignment at 16:50 to a rep
    working 09:00-17:00 fell due at 17:20 instead of 09:20 the next working day."""
    from datetime import datetime
    from unittest import mock

    from routing.models import Team, TeamMembership

    hours = {"days": [1, 2, 3, 4, 5], "start": "09:00", "end": "17:00"}
    ana = Rep.objects.create(email="ana@example.com", name="Ana", working_hours=hours)
    ben = Rep.objects.create(email="ben@example.com", name="Ben", working_hours=hours)
    team = Team.objects.create(name="Day shift", respect_working_hours=True, sla_minutes=30)
    for position, rep in enumerate((ana, ben)):
        TeamMembership.objects.create(team=team, rep=rep, position=position)
    lead = LeadFactory(status=LeadStatus.ASSIGNED)
    Assignment.objects.create(
        lead=lead, rep=ana, team=team, team_name=team.name, rep_name="Ana", sla_minutes=30
    )
    wednesday = datetime(2025, 3, 5, 16, 50, tzinfo=UTC)
    with mock.patch("routing.services.timezone.now", return_value=wednesday):
        moved = lead_reassign(lead_id=lead.pk, rep_email=ben.email, reason="r", actor="user:m")
    assert moved.sla_due_at == datetime(2025, 3, 6, 9, 20, tzinfo=UTC)


def test_a_lead_reassigned_by_hand_joins_the_new_reps_team():
    """A lead moved to a rep of another team, or given its first owner by hand, belongs to that
    rep's team, so that the team's (scoped) manager sees it."""
    from tests.routing.factories import make_rep, team_with

    ana, ben = make_rep(email="ana@x.example"), make_rep(email="ben@x.example")
    emea = team_with([ana], name="EMEA")
    na = team_with([ben], name="NA")
    clear_live_config_cache()
    rules_import(
        {
            "ruleset": {
                "name": "R",
                "rules": [
                    {"name": "EMEA", "priority": 1, "action": {"type": "team", "team": "EMEA"}}
                ],
            }
        },
        publish=True,
    )
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assert Assignment.objects.get(lead=lead, active=True).team == emea

    moved = lead_reassign(lead_id=lead.id, rep_email=ben.email, reason="NA", actor="user:m")
    assert (moved.team_id, moved.team_name) == (na.pk, "NA")
    back = lead_reassign(lead_id=lead.id, rep_email=ana.email, reason="EMEA", actor="user:m")
    assert (back.team_id, back.team_name) == (emea.pk, "EMEA")

    orphan = LeadFactory(raw_payload={"email": "y@acme.com"}, status=LeadStatus.UNASSIGNED)
    first = lead_reassign(lead_id=orphan.id, rep_email=ben.email, reason="hand", actor="user:m")
    assert (first.team_id, first.team_name) == (na.pk, "NA")
    clear_live_config_cache()
