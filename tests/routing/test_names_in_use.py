"""A team, rep or value list named by a draft or published rule cannot be renamed or deleted."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from routing.models import Rep, Team, ValueList
from tests.routing.factories import make_rep, published_ruleset, team_with

pytestmark = pytest.mark.django_db


@pytest.fixture
def in_use() -> tuple[Team, Rep, ValueList]:
    rep = make_rep(email="Ana@X.example")
    team = team_with([make_rep(email="ben@x.example")])
    lists = ValueList.objects.create(name="competitors", values=["rival.io"])
    published_ruleset(
        {
            "name": "No rivals",
            "when": {
                "not": {"any": [{"field": "email_domain", "op": "in_list", "value": "competitors"}]}
            },
            "action": {"type": "team", "team": team.name},
        },
        {"name": "Ana", "action": {"type": "rep", "rep": "ana@x.example"}},
    )
    return team, rep, lists


def test_renames_of_what_rules_name_are_refused_with_the_rules_named(in_use):
    team, rep, lists = in_use
    team.name = "Renamed"
    with pytest.raises(ValidationError, match='named by rule "No rivals"'):
        team.full_clean()
    rep.email = "ana2@x.example"
    with pytest.raises(ValidationError, match='rule "Ana"'):
        rep.full_clean()
    lists.name = "rivals"
    with pytest.raises(ValidationError, match='rule "No rivals"'):
        lists.full_clean()


def test_unused_objects_and_case_only_changes_are_fine(in_use):
    _team, rep, _lists = in_use
    rep.email = "ANA@x.example"  # the same rep for the rules (e-mails match ignoring case)
    rep.full_clean()
    spare = team_with([make_rep(email="cai@x.example")])
    spare.name = "Spare renamed"
    spare.full_clean()


def test_the_admin_refuses_to_delete_what_rules_name(in_use, client):
    team, _rep, _lists = in_use
    spare = team_with([make_rep(email="dee@x.example")])
    User.objects.create_superuser("root", "r@x.example", "pw")
    client.login(username="root", password="pw")
    page = client.get(f"/admin/routing/team/{team.pk}/delete/")
    assert page.status_code == 403
    # A bulk delete that includes it is refused as a whole; the unused team alone can go.
    refused = client.post(
        "/admin/routing/team/",
        {"action": "delete_selected", "_selected_action": [team.pk, spare.pk], "post": "yes"},
    )
    assert refused.status_code == 403
    assert Team.objects.filter(pk__in=[team.pk, spare.pk]).count() == 2
    client.post(
        "/admin/routing/team/",
        {"action": "delete_selected", "_selected_action": [spare.pk], "post": "yes"},
    )
    assert Team.objects.filter(pk=team.pk).exists()
    assert not Team.objects.filter(pk=spare.pk).exists()
