"""Custom admin actions need the change permission: a view-only user neither sees nor runs them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from leads.models import Source
from routing.models import RuleSet, RuleSetStatus
from routing.versions import ruleset_new_draft
from tests.leads.factories import SourceFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(db: Any) -> Client:
    """A staff user with every view permission (routing, leads, delivery) and nothing else."""
    user = User.objects.create_user("vera", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label__in=("routing", "leads"), codename__startswith="view_"
        )
    )
    client = Client()
    client.force_login(user)
    return client


def _actions(client: Client, changelist: str) -> list[str]:
    response = client.get(reverse(changelist))
    assert response.status_code == 200
    form = response.context.get("action_form")
    if form is None:
        return []
    return [name for name, _label in form.fields["action"].choices if name]


def test_a_viewer_cannot_publish_a_draft(viewer: Client, live: RuleSet) -> None:
    draft = ruleset_new_draft(ruleset=live)
    assert "publish" not in _actions(viewer, "admin:routing_ruleset_changelist")
    viewer.post(
        reverse("admin:routing_ruleset_changelist"),
        {"action": "publish", "_selected_action": [draft.pk]},
    )
    draft.refresh_from_db()
    live.refresh_from_db()
    assert (draft.status, live.status) == (RuleSetStatus.DRAFT, RuleSetStatus.PUBLISHED)


def test_a_viewer_cannot_rotate_a_source_token_or_secret(viewer: Client) -> None:
    source = SourceFactory(slug="webform")
    before = Source.objects.values("token_hash", "hmac_secret").get(pk=source.pk)
    assert not {"rotate_token", "rotate_hmac_secret"} & set(
        _actions(viewer, "admin:leads_source_changelist")
    )
    for action in ("rotate_token", "rotate_hmac_secret"):
        viewer.post(
            reverse("admin:leads_source_changelist"),
            {"action": action, "_selected_action": [source.pk]},
        )
    assert Source.objects.values("token_hash", "hmac_secret").get(pk=source.pk) == before


def test_a_viewer_gets_no_delivery_actions(viewer: Client) -> None:
    assert "send_test" not in _actions(viewer, "admin:routing_webhookendpoint_changelist")
    assert "retry_now" not in _actions(viewer, "admin:routing_delivery_changelist")


def test_every_custom_action_names_its_permissions() -> None:
    from django.contrib import admin

    missing = [
        f"{model._meta.label}.{name}"
        for model, model_admin in admin.site._registry.items()
        for func, name, _label in model_admin._get_base_actions()
        if model._meta.app_label in ("routing", "leads", "audit")
        and name != "delete_selected"
        and not getattr(func, "allowed_permissions", None)
    ]
    assert missing == []


def test_migrate_creates_the_revops_group_with_its_permissions(db: Any) -> None:
    """No seed_demo: migrate alone (post_migrate) makes the group, able to see who published."""
    from django.contrib.auth.models import Group

    from routing.editor.permissions import REVOPS_GROUP

    group = Group.objects.get(name=REVOPS_GROUP)
    perms = {
        f"{app}.{codename}"
        for app, codename in group.permissions.values_list("content_type__app_label", "codename")
    }
    assert {
        "routing.change_rule",
        "routing.change_ruleset",
        "leads.change_source",
        "leads.view_lead",
        "audit.view_event",
        "routing.view_alert",
        "routing.view_webhookendpoint",
        "routing.view_delivery",
    } <= perms
    read_only = {"routing.change_webhookendpoint", "routing.change_delivery", "leads.change_lead"}
    assert not read_only & perms
