"""The routing models' database constraints and clean() checks."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import ProtectedError

from routing.models import (
    Account,
    Rep,
    Rule,
    RuleSet,
    RuleSetStatus,
    Team,
    TeamMembership,
    Territory,
)
from tests.routing.factories import (
    AccountFactory,
    RepFactory,
    RuleFactory,
    RuleSetFactory,
    TeamFactory,
    TeamMembershipFactory,
    TerritoryFactory,
    ValueListFactory,
    publish_as_is,
)

pytestmark = pytest.mark.django_db


def rejected() -> Any:
    """The database refuses the row; each use sits in its own savepoint (transaction.atomic)."""
    return pytest.raises(IntegrityError)


# --- Database constraints ----------------------------------------------------------------------


def test_only_one_ruleset_can_be_published() -> None:
    RuleSetFactory(published=True)
    with rejected(), transaction.atomic():
        RuleSetFactory(published=True)
    RuleSetFactory(status=RuleSetStatus.ARCHIVED)
    RuleSetFactory(status=RuleSetStatus.ARCHIVED)  # any number of drafts and archived ones
    RuleSetFactory()
    RuleSetFactory()
    assert RuleSet.objects.filter(status=RuleSetStatus.PUBLISHED).count() == 1


def test_a_published_ruleset_has_a_publication_time() -> None:
    with rejected(), transaction.atomic():
        RuleSetFactory(status=RuleSetStatus.PUBLISHED, published_at=None)


@pytest.mark.parametrize("version", [0, 3])
def test_ruleset_versions_are_positive_and_unique(version: int) -> None:
    RuleSetFactory(version=3)
    with rejected(), transaction.atomic():
        RuleSetFactory(version=version)


def test_ruleset_status_must_be_a_known_one() -> None:
    with rejected(), transaction.atomic():
        RuleSetFactory(status="live")


def test_rule_priorities_and_names_are_unique_within_a_ruleset() -> None:
    rule = RuleFactory(priority=10, name="Hot")
    with rejected(), transaction.atomic():
        RuleFactory(ruleset=rule.ruleset, priority=10, name="Other")
    with rejected(), transaction.atomic():
        RuleFactory(ruleset=rule.ruleset, priority=20, name="Hot")
    # Another version may reuse both.
    RuleFactory(ruleset=RuleSetFactory(), priority=10, name="Hot")


@pytest.mark.parametrize(
    "changes",
    [{"sla_minutes": 0}, {"on_sla_breach": "escalate"}, {"name": ""}],
    ids=["sla-zero", "unknown-breach-policy", "empty-name"],
)
def test_rule_fields_are_checked_by_the_database(changes: dict[str, object]) -> None:
    with rejected(), transaction.atomic():
        RuleFactory(**changes)


def test_rep_emails_are_unique_ignoring_case() -> None:
    RepFactory(email="ana@example.com")
    with rejected(), transaction.atomic():
        RepFactory(email="Ana@Example.COM")
    assert Rep.objects.count() == 1


@pytest.mark.parametrize("field", ["max_open", "max_per_day"])
def test_rep_caps_are_positive_when_set(field: str) -> None:
    RepFactory(**{field: None})
    RepFactory(**{field: 1})
    with rejected(), transaction.atomic():
        RepFactory(**{field: 0})


@pytest.mark.parametrize(
    "changes",
    [{"strategy": "random"}, {"sla_minutes": 0}, {"name": ""}],
    ids=["unknown-strategy", "sla-zero", "empty-name"],
)
def test_team_fields_are_checked_by_the_database(changes: dict[str, object]) -> None:
    with rejected(), transaction.atomic():
        TeamFactory(**changes)


def test_membership_weight_is_at_least_one() -> None:
    TeamMembershipFactory(weight=1)
    with rejected(), transaction.atomic():
        TeamMembershipFactory(weight=0)


def test_a_rep_is_in_a_team_once() -> None:
    member = TeamMembershipFactory()
    with rejected(), transaction.atomic():
        TeamMembershipFactory(team=member.team, rep=member.rep, position=member.position + 1)


@pytest.mark.skipif(
    not connection.features.supports_deferrable_unique_constraints,
    reason="only PostgreSQL creates the deferrable unique (team, position) constraint",
)
def test_positions_are_unique_per_team_but_checked_at_commit() -> None:
    team = TeamFactory()
    first = TeamMembershipFactory(team=team, position=0)
    second = TeamMembershipFactory(team=team, position=1)
    with transaction.atomic():
        # A swap passes through a duplicate; the deferred constraint only looks at the end.
        TeamMembership.objects.filter(pk=first.pk).update(position=1)
        TeamMembership.objects.filter(pk=second.pk).update(position=0)
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS team_membership_unique_position IMMEDIATE")
    with rejected(), transaction.atomic():
        TeamMembershipFactory(team=team, position=0)
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS team_membership_unique_position IMMEDIATE")


def test_a_territory_belongs_to_a_team_or_a_rep_never_both_or_neither() -> None:
    team, rep = TeamFactory(), RepFactory()
    TerritoryFactory(team=team, rep=None)
    TerritoryFactory(team=None, rep=rep)
    with rejected(), transaction.atomic():
        TerritoryFactory(team=team, rep=rep)
    with rejected(), transaction.atomic():
        TerritoryFactory(team=None, rep=None)
    assert Territory.objects.count() == 2


def test_account_domains_are_lower_case_and_unique() -> None:
    AccountFactory(domain="acme.com")
    with rejected(), transaction.atomic():
        AccountFactory(domain="Other.com")
    with rejected(), transaction.atomic():
        AccountFactory(domain="acme.com")
    assert Account.objects.count() == 1


def test_a_rep_who_owns_accounts_or_territories_cannot_be_deleted() -> None:
    owner = RepFactory()
    AccountFactory(owner=owner)
    with pytest.raises(ProtectedError), transaction.atomic():
        owner.delete()
    territory_rep = RepFactory()
    TerritoryFactory(team=None, rep=territory_rep)
    with pytest.raises(ProtectedError), transaction.atomic():
        territory_rep.delete()


def test_deleting_a_team_removes_its_memberships() -> None:
    member = TeamMembershipFactory()
    member.team.delete()
    assert not TeamMembership.objects.exists()
    assert Rep.objects.filter(pk=member.rep_id).exists()


# --- clean() -----------------------------------------------------------------------------------


def test_rep_time_zone_must_be_an_iana_name() -> None:
    RepFactory.build(timezone="Europe/Berlin").full_clean()
    with pytest.raises(ValidationError) as caught:
        RepFactory.build(timezone="Mars/Olympus_Mons").full_clean()
    assert caught.value.message_dict == {"timezone": ['unknown time zone "Mars/Olympus_Mons"']}


@pytest.mark.parametrize(
    ("hours", "message"),
    [
        ({"days": [], "start": "08:00", "end": "18:00"}, "working_hours.days: must be a non-empty"),
        ({"days": [1, 8], "start": "08:00", "end": "18:00"}, "working_hours.days[1]: must be"),
        ({"days": [1, 1], "start": "08:00", "end": "18:00"}, "duplicate weekday 1"),
        (
            {"days": [1], "start": "8:00", "end": "18:00"},
            'working_hours.start: must be a time "HH:MM"',
        ),
        ({"days": [1], "start": "08:00", "end": "24:00"}, "working_hours.end: must be a time"),
        ({"days": [1], "start": "08:00", "end": "18:00", "tz": "UTC"}, 'unknown key "tz"'),
        (["08:00", "18:00"], "must be {"),
    ],
)
def test_rep_working_hours_are_checked(hours: object, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RepFactory.build(working_hours=hours).full_clean()
    assert any(message in text for text in caught.value.message_dict["working_hours"])


def test_valid_working_hours_include_overnight_windows_and_none() -> None:
    RepFactory.build(working_hours=None).full_clean()
    RepFactory.build(working_hours={"days": [5, 6], "start": "22:00", "end": "06:00"}).full_clean()


def test_territory_clean_checks_codes_and_owner() -> None:
    team = TeamFactory()
    TerritoryFactory.build(team=team, countries=["US"], regions=["CA"]).full_clean()
    with pytest.raises(ValidationError) as caught:
        TerritoryFactory.build(
            team=team, countries=["XX", "de"], postal_prefixes=["", "941"]
        ).full_clean()
    errors = caught.value.message_dict
    assert "countries[0]: unknown country code 'XX' (ISO 3166-1 alpha-2)" in errors["countries"]
    assert any(text.startswith("postal_prefixes[0]:") for text in errors["postal_prefixes"])
    with pytest.raises(ValidationError, match="either a team or a rep"):
        TerritoryFactory.build(team=team, rep=RepFactory()).full_clean()


def test_account_domain_must_be_a_lower_case_host_name() -> None:
    AccountFactory.build(domain="acme.co.uk").full_clean()
    for domain in ("Acme.com", "https://acme.com", "acme"):
        with pytest.raises(ValidationError):
            AccountFactory.build(domain=domain).full_clean()


def test_value_list_values_are_text() -> None:
    with pytest.raises(ValidationError, match=r"values\[1\]"):
        ValueListFactory.build(values=["a", 3]).full_clean()


def test_rule_clean_validates_the_rule_with_a_path() -> None:
    ValueListFactory(name="competitors")
    TeamFactory(name="EMEA SDR")
    draft = RuleSetFactory()
    RuleFactory.build(
        ruleset=draft,
        when={"all": [{"field": "email_domain", "op": "in_list", "value": "competitors"}]},
        action={"type": "team", "team": "EMEA SDR"},
    ).full_clean()
    with pytest.raises(ValidationError) as caught:
        RuleFactory.build(
            ruleset=draft,
            when={"all": [{"field": "country", "op": "equalz", "value": "DE"}]},
            action={"type": "team", "team": "Nobody"},
        ).full_clean()
    assert caught.value.message_dict == {
        "when": ['when.all[0].op: unknown operator "equalz"'],
        "action": ['action.team: unknown team "Nobody"'],
    }


def test_published_rulesets_and_their_rules_cannot_be_changed_through_clean() -> None:
    live = RuleSetFactory()
    rule = RuleFactory(ruleset=live)
    publish_as_is(live)
    live.note = "edited"
    with pytest.raises(ValidationError, match="only drafts can change"):
        live.full_clean()
    rule.name = "Edited"
    with pytest.raises(ValidationError, match="only drafts can change"):
        rule.full_clean()
    RuleSetFactory(status=RuleSetStatus.DRAFT).full_clean()


def test_str_of_each_model_names_it() -> None:
    rep = RepFactory(name="Ana", email="ana@example.com")
    team = TeamFactory(name="EMEA SDR")
    assert str(rep) == "Ana <ana@example.com>"
    assert str(team) == "EMEA SDR"
    assert str(TeamMembershipFactory(team=team, rep=rep, position=0)) == (
        "EMEA SDR #0: Ana <ana@example.com>"
    )
    assert str(RuleSetFactory(version=7, published=True)) == "v7 Inbound routing (Published)"
    assert str(AccountFactory(domain="acme.com", name="")) == "acme.com"
    assert Team.objects.get().rotation_state == {}


@pytest.mark.django_db
def test_saving_a_team_or_rep_from_a_stale_form_never_rewinds_the_rotation():
    """The admin saves every column: a team loaded before a worker moved its turn put the old
    turn back (Ben got two turns in a row); a rep's last assignment time likewise."""
    from django.utils import timezone

    from routing.models import Rep, Team
    from tests.routing.factories import make_rep, team_with

    ana = make_rep(email="ana@x.example")
    team = team_with([ana])
    stale_team = Team.objects.get(pk=team.pk)
    stale_rep = Rep.objects.get(pk=ana.pk)
    moved = {"team_id": team.pk, "last_rep_id": ana.pk, "last_position": 0}
    Team.objects.filter(pk=team.pk).update(rotation_state=moved)
    now = timezone.now()
    Rep.objects.filter(pk=ana.pk).update(last_assigned_at=now)
    stale_team.sla_minutes = 30
    stale_team.save()
    stale_rep.name = "Ana Renamed"
    stale_rep.save()
    team.refresh_from_db()
    ana.refresh_from_db()
    assert (team.rotation_state, team.sla_minutes) == (moved, 30)
    assert (ana.last_assigned_at, ana.name) == (now, "Ana Renamed")


# --- Published and archived versions are frozen (models and database) --------------------------


@pytest.fixture
def frozen() -> tuple[RuleSet, RuleSet]:
    """An archived version and the published one, each with one rule."""
    old = RuleSetFactory()
    RuleFactory(ruleset=old, name="Old")
    live = RuleSetFactory()
    RuleFactory(ruleset=live, name="Live")
    publish_as_is(old)
    RuleSet.objects.filter(pk=old.pk).update(status=RuleSetStatus.ARCHIVED)
    old.status = RuleSetStatus.ARCHIVED
    return old, publish_as_is(live)


def _refused() -> Any:
    """Refused by the model (VersionReadOnly) or, past it, by the database (IntegrityError)."""
    return pytest.raises((ValidationError, IntegrityError), match="only drafts can change")


def test_the_models_refuse_to_change_a_published_or_archived_version(frozen: Any) -> None:
    for ruleset in frozen:
        rule = ruleset.rules.get()
        rule.name = "Edited"
        with _refused(), transaction.atomic():
            rule.save()
        with _refused(), transaction.atomic():
            rule.delete()
        with _refused(), transaction.atomic():
            Rule.objects.create(ruleset=ruleset, name="New", priority=99, action={"type": "tag"})
        ruleset.note = "edited"
        with _refused(), transaction.atomic():
            ruleset.save()
        with _refused(), transaction.atomic():
            ruleset.delete()
    draft = RuleSetFactory()
    draft.status = RuleSetStatus.PUBLISHED  # publishing is ruleset_publish's, not save()'s
    with _refused(), transaction.atomic():
        draft.save()
    rule = RuleFactory(ruleset=RuleSetFactory())  # a draft's rules change freely
    rule.name = "Renamed"
    rule.save()
    rule.ruleset.note = "fine"
    rule.ruleset.save()
    rule.delete()
    assert sorted(Rule.objects.values_list("name", flat=True)) == ["Live", "Old"]


def _database_refuses() -> Any:
    return pytest.raises(IntegrityError, match="only drafts can change")


def test_the_database_refuses_to_change_a_published_or_archived_version(frozen: Any) -> None:
    for ruleset in frozen:
        with _database_refuses(), transaction.atomic():
            Rule.objects.filter(ruleset=ruleset).update(name="Edited")
        with _database_refuses(), transaction.atomic():
            Rule.objects.bulk_create(
                [Rule(ruleset=ruleset, name="New", priority=99, action={"type": "tag"})]
            )
        with _database_refuses(), transaction.atomic():
            ruleset.rules.all().delete()
        with _database_refuses(), transaction.atomic():
            RuleSet.objects.filter(pk=ruleset.pk).update(note="edited")
        with _database_refuses(), transaction.atomic():
            RuleSet.objects.filter(pk=ruleset.pk).delete()
        with _database_refuses(), transaction.atomic():
            RuleSet.objects.filter(pk=ruleset.pk).update(status=RuleSetStatus.DRAFT)
    old, live = frozen
    with _database_refuses(), transaction.atomic():
        RuleSet.objects.filter(pk=old.pk).update(status=RuleSetStatus.PUBLISHED)
    draft_rule = RuleFactory()
    with _database_refuses(), transaction.atomic():  # a draft's rule moved into a frozen version
        Rule.objects.filter(pk=draft_rule.pk).update(ruleset=live)
    # What publishing does: the live version archived, a draft published.
    RuleSet.objects.filter(pk=live.pk).update(status=RuleSetStatus.ARCHIVED)
    publish_as_is(draft_rule.ruleset)
    assert dict(RuleSet.objects.values_list("pk", "status")) == {
        old.pk: RuleSetStatus.ARCHIVED,
        live.pk: RuleSetStatus.ARCHIVED,
        draft_rule.ruleset_id: RuleSetStatus.PUBLISHED,
    }
    assert sorted(Rule.objects.values_list("name", flat=True)) == sorted(
        ["Live", "Old", draft_rule.name]
    )


def test_deleting_the_user_who_made_and_published_a_version_is_allowed() -> None:
    from django.contrib.auth.models import User

    user = User.objects.create_user("pub")
    draft = RuleSetFactory(created_by=user)
    RuleSet.objects.filter(pk=draft.pk).update(published_by=user)
    live = publish_as_is(draft)
    user.delete()  # SET_NULL on a frozen version: allowed
    live.refresh_from_db()
    assert (live.status, live.created_by, live.published_by) == (
        RuleSetStatus.PUBLISHED,
        None,
        None,
    )
