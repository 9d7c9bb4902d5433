"""The configuration version the database bumps, and the live configuration that follows it."""

from __future__ import annotations

import pytest
from django.utils import timezone

from routing.decisions import clear_live_config_cache, live_config
from routing.models import ConfigVersion, Rep, Team, TeamMembership, Territory, ValueList
from tests.routing.factories import make_rep, published_ruleset, team_with

pytestmark = pytest.mark.django_db


def version() -> int:
    return ConfigVersion.objects.values_list("version", flat=True).get()


def test_every_configuration_change_bumps_it_and_per_lead_writes_do_not():
    rep = make_rep(email="a@x.example")
    team = team_with([rep])
    steps = [
        lambda: Team.objects.filter(pk=team.pk).update(name="Renamed"),
        lambda: Team.objects.filter(pk=team.pk).update(strategy="least_loaded"),
        lambda: Rep.objects.filter(pk=rep.pk).update(timezone="Europe/Berlin"),
        lambda: TeamMembership.objects.filter(team=team).update(weight=3),
        lambda: Territory.objects.create(name="DACH", countries=["DE"], team=team),
        lambda: ValueList.objects.create(name="competitors", values=["rival.io"]),
        lambda: ValueList.objects.all().delete(),
    ]
    for step in steps:
        before = version()
        step()
        assert version() > before, step
    before = version()
    Team.objects.filter(pk=team.pk).update(rotation_state={"team_id": team.pk})
    Rep.objects.filter(pk=rep.pk).update(last_assigned_at=timezone.now())
    Rep.objects.filter(pk=rep.pk).update(out_of_office_until=timezone.now())  # read per lead
    assert version() == before


def test_the_live_configuration_follows_a_change_made_with_a_queryset_update():
    """The old fingerprint (row counts and the newest updated_at) missed changes that do not
    touch updated_at, such as a queryset update(): the cached team kept its old strategy."""
    clear_live_config_cache()
    team = team_with([make_rep(email="a@x.example"), make_rep(email="b@x.example")])
    published_ruleset({"name": "All", "action": {"type": "team", "team": team.name}})
    assert live_config().teams[team.pk].strategy == "round_robin"
    Team.objects.filter(pk=team.pk).update(strategy="least_loaded")
    assert live_config().teams[team.pk].strategy == "least_loaded"
    clear_live_config_cache()


def test_checking_the_configuration_is_one_query(django_assert_num_queries):
    clear_live_config_cache()
    team = team_with([make_rep(email="a@x.example")])
    published_ruleset({"name": "All", "action": {"type": "team", "team": team.name}})
    Territory.objects.bulk_create(
        Territory(name=f"T{i}", countries=["US"], postal_prefixes=[f"{i:05d}"], team=team)
        for i in range(500)
    )
    live_config()
    with django_assert_num_queries(1):
        live_config()
    clear_live_config_cache()
