"""Defects the issue-7 review found in the pages, each with the test that failed first."""

from __future__ import annotations

import base64
import json
from typing import cast

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from audit.csv import FORMULA_STARTS, cell_safe
from tests.audit.test_pages import logged_in, manager

pytestmark = pytest.mark.django_db


def _cursor(value: object) -> str:
    raw = json.dumps([value, "6f1b8a38-5d0b-4b6e-9a70-2f0f0b1b2c3d"]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "query",
    [
        "until=9999-12-31",
        "since=9999-12-31",
        "until=0001-01-01&since=0001-01-01",
        f"after={base64.urlsafe_b64encode(b'[' * 200_000).decode()}",
        f"after={_cursor('0001-01-01T00:00:00+14:00')}",
        f"sort=email&after={_cursor('a' + chr(0) + 'b')}",
        f"sort=email&after={_cursor(chr(0xD800))}",
        f"sort=company&before={_cursor('x' + chr(0xDFFF))}",
        f"before={_cursor('9999-12-31T23:59:59-14:00')}",
    ],
)
@pytest.mark.parametrize("path", ["/history/", "/history/export.csv"])
def test_crafted_history_parameters_are_never_a_500(client: Client, query: str, path: str):
    logged_in(client, manager())
    response = client.get(f"{path}?{query}")
    assert response.status_code == 200
    if path.endswith(".csv"):
        b"".join(response.streaming_content)


@pytest.mark.parametrize(
    "text",
    [
        " =1+1",
        " @SUM(A1)",
        "\xa0=1+1",
        "\n=1+1",
        "\t+1",
        " \t-2",
        "\u3000=1+1",
        "\u2003=1",
        "\u200b=HYPERLINK(1)",
        "\ufeff=1",
        "\u2060@x",
    ],
)
@pytest.mark.reliability
def test_formulas_behind_leading_whitespace_are_neutralised(text: str):
    assert cell_safe(text) == "'" + text


@pytest.mark.reliability
@given(st.text(max_size=30))
def test_no_exported_cell_reads_as_a_formula_even_after_trimming(text: str):
    cell = cell_safe(text)
    trimmed = cell.lstrip().lstrip("\u200b\u200c\u200d\u2060\ufeff").lstrip()
    assert cell.startswith("'") or not trimmed.startswith(FORMULA_STARTS)


def test_the_page_actions_need_the_right_to_view_leads_too(client: Client):
    from tests.audit.test_pages import routed

    lead = routed("x@acme.com")
    user = User.objects.create_user("only-reassign", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="reassign_lead"))
    user.user_permissions.add(Permission.objects.get(codename="touch_lead"))
    logged_in(client, user)
    assert client.post(f"/history/{lead.pk}/reassign/", {"reason": "r"}).status_code == 403
    assert client.post(f"/history/{lead.pk}/touch/").status_code == 403


def test_a_scoped_manager_sees_only_their_teams_reps_and_no_system_alerts(client, settings):
    from routing.models import TeamMembership
    from routing.monitoring.alerts import alert_raise
    from tests.routing.factories import RepFactory, TeamFactory

    settings.HISTORY_SCOPE_TO_MANAGED_TEAMS = True
    user = manager()
    mine, theirs = TeamFactory(manager=user), TeamFactory()
    my_rep, their_rep = RepFactory(name="Mine"), RepFactory(name="Theirs")
    TeamMembership.objects.create(team=mine, rep=my_rep, position=0)
    TeamMembership.objects.create(team=theirs, rep=their_rep, position=0)
    alert_raise(kind="backlog", subject="pipeline", message="900 leads waiting")
    logged_in(client, user)
    d = client.get("/dashboard/").context["d"]
    assert [load.name for load in d.reps] == ["Mine"]
    assert d.alerts == []


# --- The scope is checked again under the lead's lock -------------------------------------------


def _moved_after_the_check(monkeypatch, target, attribute, lead, *, rep, team):
    """Wrap the view's visibility check so that, right after it passes, another manager's
    reassignment moves ``lead`` to ``rep`` of ``team`` (as if it committed just before the
    action took the lead's lock)."""
    from routing.models import Assignment, AssignmentKind

    original = getattr(target, attribute)

    def check_then_move(*args, **kwargs):
        result = original(*args, **kwargs)
        current = Assignment.objects.get(lead=lead, active=True)
        current.active = False
        current.save(update_fields=["active"])
        Assignment.objects.create(
            lead=lead,
            rep=rep,
            rep_name=rep.name,
            team=team,
            team_name=team.name,
            kind=AssignmentKind.REASSIGNMENT,
            supersedes=current,
            active=True,
        )
        return result

    monkeypatch.setattr(target, attribute, check_then_move)


def _two_teams(user):
    from routing.models import Rep, Team, TeamMembership
    from tests.routing.factories import RepFactory, TeamFactory

    mine, theirs = cast(Team, TeamFactory(manager=user)), cast(Team, TeamFactory())
    my_rep, my_other_rep, their_rep = (cast(Rep, RepFactory()) for _ in range(3))
    TeamMembership.objects.create(team=mine, rep=my_rep, position=0)
    TeamMembership.objects.create(team=mine, rep=my_other_rep, position=1)
    TeamMembership.objects.create(team=theirs, rep=their_rep, position=0)
    return mine, theirs, my_rep, my_other_rep, their_rep


@pytest.mark.parametrize("via", ["page", "api"])
def test_a_lead_moved_to_another_team_after_the_check_is_not_reassigned(
    client, settings, monkeypatch, via
):
    """The scope was checked before the lead's lock: a lead another manager moved to their
    team in between was still reassigned (and taken back) by the first manager."""
    from audit import views
    from routing import api
    from routing.models import Assignment
    from tests.audit.test_pages import owned

    settings.HISTORY_SCOPE_TO_MANAGED_TEAMS = True
    user = manager()
    mine, theirs, my_rep, my_other_rep, their_rep = _two_teams(user)
    lead = owned(rep=my_rep, team=mine)
    if via == "page":
        _moved_after_the_check(monkeypatch, views, "_lead_or_404", lead, rep=their_rep, team=theirs)
        url, body = f"/history/{lead.pk}/reassign/", {"rep": my_other_rep.email, "reason": "mine"}
        response = logged_in(client, user).post(url, body)

    else:
        _moved_after_the_check(
            monkeypatch, api._LeadActionView, "_lead_or_404", lead, rep=their_rep, team=theirs
        )
        response = logged_in(client, user).post(
            f"/api/v1/leads/{lead.pk}/reassign/",
            {"rep": my_other_rep.email, "reason": "mine"},
            content_type="application/json",
        )
        assert response.json()["error"]["code"] == "not_found"
    assert response.status_code == 404
    assert Assignment.objects.get(lead=lead, active=True).rep_id == their_rep.pk


@pytest.mark.parametrize("via", ["page", "api"])
def test_a_lead_moved_to_another_team_after_the_check_is_not_touched(
    client, settings, monkeypatch, via
):
    from django.contrib.auth.models import Permission

    from audit import views
    from routing import api
    from routing.models import Assignment
    from tests.audit.test_pages import owned

    settings.HISTORY_SCOPE_TO_MANAGED_TEAMS = True
    user = manager()
    user.user_permissions.add(Permission.objects.get(codename="touch_lead"))
    mine, theirs, my_rep, _, their_rep = _two_teams(user)
    lead = owned(rep=my_rep, team=mine)
    if via == "page":
        _moved_after_the_check(monkeypatch, views, "_lead_or_404", lead, rep=their_rep, team=theirs)
        response = logged_in(client, user).post(f"/history/{lead.pk}/touch/")
    else:
        _moved_after_the_check(
            monkeypatch, api._LeadActionView, "_lead_or_404", lead, rep=their_rep, team=theirs
        )
        response = logged_in(client, user).post(f"/api/v1/leads/{lead.pk}/touch/")
    assert response.status_code == 404
    assert Assignment.objects.get(lead=lead, active=True).touched_at is None


def test_the_services_check_the_scope_under_the_lock():
    from routing.services import LeadActionError, assignment_touch, lead_reassign
    from tests.audit.test_pages import owned

    user = manager()
    mine, theirs, my_rep, my_other_rep, their_rep = _two_teams(user)
    lead = owned(rep=their_rep, team=theirs)
    with pytest.raises(LeadActionError) as refused:
        lead_reassign(
            lead_id=lead.pk, rep_email=my_rep.email, reason="r", actor="t", scope_team_ids=[mine.pk]
        )
    assert (refused.value.code, refused.value.status) == ("not_found", 404)
    with pytest.raises(LeadActionError) as refused:
        assignment_touch(lead_id=lead.pk, actor="t", scope_team_ids=[mine.pk])
    assert refused.value.status == 404
    mine_lead = owned(rep=my_rep, team=mine)
    for outsider in (their_rep.email, "nobody@example.com"):
        with pytest.raises(LeadActionError) as refused:
            lead_reassign(
                lead_id=mine_lead.pk,
                rep_email=outsider,
                reason="r",
                actor="t",
                scope_team_ids=[mine.pk],
            )
        assert (refused.value.code, refused.value.status) == ("forbidden", 403)
    moved = lead_reassign(
        lead_id=mine_lead.pk,
        rep_email=my_other_rep.email,
        reason="r",
        actor="t",
        scope_team_ids=[mine.pk],
    )
    assert moved.rep_id == my_other_rep.pk


def test_the_timeline_says_which_lead_a_duplicate_copies_and_on_what():
    from audit.models import EventType
    from audit.selectors import timeline_entry
    from audit.services import event_record
    from tests.leads.factories import LeadFactory

    lead = LeadFactory()
    original = "6f1b8a38-5d0b-4b6e-9a70-2f0f0b1b2c3d"
    event = event_record(
        type=EventType.DUPLICATE_DETECTED,
        lead=lead,
        data={"original": original, "matched_on": "email"},
    )
    assert timeline_entry(event).detail == f"duplicate of lead {original} (same email)"
