"""Defects the issue-7 review found in the pages, each with the test that failed first."""

from __future__ import annotations

import base64
import json

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


@pytest.mark.parametrize("text", [" =1+1", " @SUM(A1)", "\xa0=1+1", "\n=1+1", "\t+1", " \t-2"])
def test_formulas_behind_leading_whitespace_are_neutralised(text: str):
    assert cell_safe(text) == "'" + text


@given(st.text(max_size=30))
def test_no_exported_cell_reads_as_a_formula_even_after_trimming(text: str):
    cell = cell_safe(text)
    trimmed = cell.lstrip(" \t\r\n\xa0\u2007\u202f")
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
