"""Factories for the routing models (the engine's plain-data builders are in engine/factories)."""

from __future__ import annotations

from typing import Any, cast

import factory
from django.db import transaction
from django.utils import timezone

from routing.loads import rep_load_recount
from routing.models import (
    Account,
    Assignment,
    AssignmentKind,
    Rep,
    Rule,
    RuleSet,
    RuleSetStatus,
    Team,
    TeamMembership,
    Territory,
    ValueList,
)


class RepFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Rep

    email = factory.Sequence(lambda n: f"rep{n}@example.com")
    name = factory.Sequence(lambda n: f"Rep {n}")
    timezone = "UTC"


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team

    name = factory.Sequence(lambda n: f"Team {n}")


class TeamMembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = TeamMembership

    team = factory.SubFactory(TeamFactory)
    rep = factory.SubFactory(RepFactory)
    position = factory.Sequence(lambda n: n)
    weight = 1


class TerritoryFactory(factory.django.DjangoModelFactory):
    """A country-wide territory owned by a new team."""

    class Meta:
        model = Territory

    name = factory.Sequence(lambda n: f"Territory {n}")
    countries = factory.LazyFunction(lambda: ["DE"])
    team = factory.SubFactory(TeamFactory)


class AccountFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Account

    domain = factory.Sequence(lambda n: f"account{n}.example")
    name = factory.Sequence(lambda n: f"Account {n}")


class ValueListFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ValueList

    name = factory.Sequence(lambda n: f"list-{n}")
    values = factory.LazyFunction(lambda: ["a.example", "b.example"])


class RuleSetFactory(factory.django.DjangoModelFactory):
    """A draft ruleset; ``published=True`` makes it the live one (published_at set)."""

    class Meta:
        model = RuleSet

    class Params:
        published = factory.Trait(
            status=RuleSetStatus.PUBLISHED, published_at=factory.LazyFunction(timezone.now)
        )

    version = factory.Sequence(lambda n: n + 1)
    name = "Inbound routing"


class RuleFactory(factory.django.DjangoModelFactory):
    """An always-matching exclude rule in a new draft ruleset."""

    class Meta:
        model = Rule

    ruleset = factory.SubFactory(RuleSetFactory)
    priority = factory.Sequence(lambda n: (n + 1) * 10)
    name = factory.Sequence(lambda n: f"Rule {n}")
    action = factory.LazyFunction(lambda: {"type": "exclude", "reason": "test"})


class AssignmentFactory(factory.django.DjangoModelFactory):
    """An initial, active assignment of a new lead to a new rep."""

    class Meta:
        model = Assignment
        skip_postgeneration_save = True

    lead = factory.SubFactory("tests.leads.factories.LeadFactory")
    rep = factory.SubFactory(RepFactory)
    rep_name = factory.LazyAttribute(lambda o: o.rep.name)
    kind = AssignmentKind.INITIAL
    active = True

    @factory.post_generation
    def load(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        """Written around the services: the rep's load counters recounted, as they would be."""
        if create:
            with transaction.atomic():
                rep_load_recount(
                    rep_id=self.rep_id, zone_name=self.rep.timezone, now=timezone.now()
                )


def team_with(reps: list[Rep], *, strategy: str = "round_robin", **fields: Any) -> Team:
    """A team whose members are ``reps`` in that order (weight 1 unless ``weights`` given)."""
    weights = fields.pop("weights", None) or [1] * len(reps)
    team = cast(Team, TeamFactory(strategy=strategy, **fields))
    for position, (rep, weight) in enumerate(zip(reps, weights, strict=True)):
        TeamMembershipFactory(team=team, rep=rep, position=position, weight=weight)
    return team


def published_ruleset(*rules: dict[str, Any]) -> RuleSet:
    """A published ruleset holding ``rules`` (rules-format dicts; priorities 10, 20, ...).

    Made a draft, given its rules, then published (a published version's rules are frozen).
    """
    ruleset = cast(RuleSet, RuleSetFactory())
    for i, data in enumerate(rules):
        Rule.objects.create(
            ruleset=ruleset,
            priority=data.get("priority", (i + 1) * 10),
            name=data["name"],
            when=data.get("when"),
            action=data["action"],
            sla_minutes=data.get("sla_minutes"),
        )
    return publish_as_is(ruleset)


def publish_as_is(ruleset: RuleSet) -> RuleSet:
    """Mark a draft published, without the compile check of ``ruleset_publish`` (tests only)."""
    ruleset.status = RuleSetStatus.PUBLISHED
    ruleset.published_at = timezone.now()
    RuleSet.objects.filter(pk=ruleset.pk).update(
        status=ruleset.status, published_at=ruleset.published_at
    )
    return ruleset


def make_rep(**fields: Any) -> Rep:
    """A saved rep (RepFactory, typed)."""
    return cast(Rep, RepFactory(**fields))


# The Django permission each scope of a configuration API token needs its owner to hold
# (routing.config_api.auth.HasScope): a token does no more than its user may.
SCOPE_PERMS = {
    "read": ("routing.view_rep", "routing.view_configdraft"),
    "roster": ("routing.change_rep",),
    "draft": ("routing.change_configdraft",),
    "publish": ("routing.add_configsnapshot",),
}


def user_with_perms(username: str, *perms: str) -> Any:
    """A user (got or created) holding the permissions ``perms`` (``app.codename``), or, when
    a perm is a scope name (``read``, ``roster``, ``draft``, ``publish``, or ``"read,roster"``),
    those the scope needs."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.get_or_create(username=username)[0]
    names: list[str] = []
    for perm in perms:
        for item in perm.split(","):
            names.extend(SCOPE_PERMS.get(item.strip(), (item.strip(),)))
    for name in names:
        app_label, codename = name.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return User.objects.get(pk=user.pk)  # fresh: no cached permissions
