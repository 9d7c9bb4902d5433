"""Fixtures of the admin editor tests: a RevOps user, a team and a published ruleset."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from routing import decisions
from routing.editor.permissions import revops_group_sync
from routing.models import RuleSet, Team
from tests.routing.factories import make_rep, published_ruleset, team_with

GERMANY = {"all": [{"field": "country", "op": "eq", "value": "DE"}]}


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    decisions.clear_live_config_cache()


@pytest.fixture
def revops(db: Any) -> User:
    user = User.objects.create_user("rita", password="pw", is_staff=True)
    user.groups.add(revops_group_sync())
    return user


@pytest.fixture
def client_revops(revops: User) -> Client:
    client = Client()
    client.force_login(revops)
    return client


@pytest.fixture
def emea(db: Any) -> Team:
    ana = make_rep(email="ana@x.example", name="Ana")
    ben = make_rep(email="ben@x.example", name="Ben")
    return team_with([ana, ben], name="EMEA SDR", sla_minutes=60)


@pytest.fixture
def live(emea: Team) -> RuleSet:
    return published_ruleset(
        {"name": "Germany", "when": GERMANY, "action": {"type": "team", "team": "EMEA SDR"}},
    )


@pytest.fixture
def eager_tasks() -> Any:
    """Run tasks sent with ``delay`` in the sending thread (for the background-job tests)."""
    from config.celery import app

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.fixture
def outsider(db: Any) -> Client:
    """A staff user outside RevOps who may view the routing pages, not change them."""
    from django.contrib.auth.models import Permission

    user = User.objects.create_user("sam", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="routing", codename__startswith="view_")
    )
    client = Client()
    client.force_login(user)
    return client
