"""Publishing at the same time as another publish, and while workers route (PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import reverse

from leads.models import Lead, LeadStatus
from routing.editor.permissions import revops_group_sync
from routing.models import Assignment, Rule, RuleSet, RuleSetStatus
from routing.versions import ruleset_new_draft, ruleset_publish_checked, ruleset_rollback
from tests.leads.factories import LeadFactory, SourceFactory
from tests.routing.admin.conftest import GERMANY
from tests.routing.factories import make_rep, published_ruleset, team_with
from tests.routing.test_route_lead import _route_concurrently

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _at_once(*jobs: Callable[[], Any]) -> tuple[list[Any], list[BaseException]]:
    barrier = threading.Barrier(len(jobs))
    results: list[Any] = []
    errors: list[BaseException] = []

    def run(job: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results.append(job())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results, errors


def _live() -> RuleSet:
    team = team_with([make_rep(email="ana@x.example")], name="EMEA SDR")
    return published_ruleset(
        {"name": "Germany", "when": GERMANY, "action": {"type": "team", "team": team.name}}
    )


def test_two_drafts_published_at_once_are_published_one_after_the_other() -> None:
    live = _live()
    for _ in range(3):
        first, second = ruleset_new_draft(ruleset=live), ruleset_new_draft(ruleset=live)
        _results, errors = _at_once(
            lambda first=first: ruleset_publish_checked(ruleset=first),
            lambda second=second: ruleset_publish_checked(ruleset=second),
        )
        assert errors == []
        statuses = dict(RuleSet.objects.values_list("pk", "status"))
        assert sorted(statuses.values()).count(RuleSetStatus.PUBLISHED) == 1
        assert {statuses[first.pk], statuses[second.pk]} == {
            RuleSetStatus.PUBLISHED,
            RuleSetStatus.ARCHIVED,
        }


def test_the_same_draft_published_twice_at_once_is_a_message_not_an_error() -> None:
    live = _live()
    draft = ruleset_new_draft(ruleset=live)
    user = User.objects.create_user("rita", is_staff=True)
    user.groups.add(revops_group_sync())
    url = reverse("admin:routing_ruleset_publish", args=[draft.pk])

    def publish() -> int:
        client = Client()
        client.force_login(user)
        return client.post(url, {"note": "go"}).status_code

    statuses, errors = _at_once(publish, publish)
    assert errors == []
    assert statuses == [302, 302]  # one publishes; the other is told, back on the draft's page
    assert RuleSet.objects.get(status=RuleSetStatus.PUBLISHED).pk == draft.pk


def test_no_lead_is_routed_by_a_half_published_version() -> None:
    reps = [make_rep(email=f"r{i}@x.example") for i in range(3)]
    team = team_with(reps, name="All")
    live = published_ruleset({"name": "v-first", "action": {"type": "team", "team": team.name}})
    source = SourceFactory(slug="webform")
    ids = [
        cast(
            Lead,
            LeadFactory(source=source, status=LeadStatus.PROCESSING, email=f"p{i}@corp.example"),
        ).pk
        for i in range(120)
    ]
    published = {live.version}
    routing_errors: list[BaseException] = []

    def route() -> None:
        routing_errors.extend(_route_concurrently(ids, 4))

    router = threading.Thread(target=route)
    router.start()
    try:
        for step in range(4):
            draft = ruleset_new_draft(ruleset=live)
            for rule in draft.rules.all():
                Rule.objects.filter(pk=rule.pk).update(name=f"v-step-{step}")
            published.add(ruleset_publish_checked(ruleset=draft).version)
            published.add(ruleset_rollback(ruleset=live).version)
            live = RuleSet.objects.get(pk=live.pk)
    finally:
        router.join(timeout=120)
    assert routing_errors == []
    names = {
        version: set(Rule.objects.filter(ruleset__version=version).values_list("name", flat=True))
        for version in published
    }
    assignments = list(Assignment.objects.values_list("ruleset_version", "rule_name"))
    assert len(assignments) == len(ids)
    for version, rule_name in assignments:
        assert version in published
        assert rule_name in names[version]
