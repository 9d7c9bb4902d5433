"""The configuration version the database bumps, and the live configuration that follows it."""

from __future__ import annotations

import pytest
from django.utils import timezone

from routing.decisions import clear_live_config_cache, live_config
from routing.models import ConfigVersion, Rep, Team, TeamMembership, Territory, ValueList
from tests.routing.factories import make_rep, published_ruleset, team_with

pytestmark = pytest.mark.django_db


def version() -> int:
    """The version (0 before the first change after a flush emptied the table)."""
    return ConfigVersion.objects.values_list("version", flat=True).first() or 0


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


@pytest.mark.django_db(transaction=True)
def test_migrate_puts_back_triggers_a_table_rebuild_dropped():
    """SQLite rebuilds a table to alter a column, dropping its triggers: the configuration
    version then never moved again. Every migrate now puts them back (and the audit's)."""
    from django.core.management import call_command
    from django.db import DatabaseError, connection

    from audit.models import Event
    from audit.triggers import triggers_drop
    from routing.config_triggers import config_triggers_drop
    from tests.leads.factories import LeadFactory

    config_triggers_drop(connection)
    triggers_drop(connection)
    before = version()
    Team.objects.create(name="Unwatched")
    assert version() == before
    call_command("migrate", verbosity=0)
    Team.objects.create(name="Watched")
    assert version() > before
    LeadFactory()
    with pytest.raises(DatabaseError, match="append-only"):
        Event.objects.update(actor="x")
