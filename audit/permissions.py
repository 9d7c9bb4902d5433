"""The "Sales managers" group and who sees which leads on the history pages."""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from django.contrib.auth.models import Group, Permission
from django.db import transaction

from audit.config_changes import config_change_record

logger = logging.getLogger(__name__)

SALES_MANAGERS_GROUP = "Sales managers"

# A role in single sign-on's OIDC_GROUP_ROLES that is no group: the admin's staff status.
STAFF_ROLE = "staff"

# View history and the dashboard (view_lead; the export needs nothing more), reassign, touch.
SALES_MANAGER_PERMISSIONS = ("view_lead", "touch_lead", "reassign_lead")

# Users with this permission (RevOps, who configure the teams) are never scoped to teams.
UNSCOPED_PERMISSION = "routing.change_team"


@transaction.atomic
def sales_managers_group_sync() -> Group:
    """Create the Sales managers group if needed and give it at least its permissions."""
    group, _ = Group.objects.get_or_create(name=SALES_MANAGERS_GROUP)
    wanted = Permission.objects.filter(
        content_type__app_label="leads", codename__in=SALES_MANAGER_PERMISSIONS
    )
    group.permissions.add(*wanted)
    return group


def groups_sync_after_migrate(sender: Any, **kwargs: Any) -> None:
    """post_migrate: permissions exist only after the migrations ran, so sync groups then.

    audit comes after leads in INSTALLED_APPS, so the leads permissions exist by now.
    """
    sales_managers_group_sync()


def user_roles_set(
    *,
    user: Any,
    roles: Collection[str],
    managed: Collection[str],
    actor: str,
    login_created: bool = False,
) -> None:
    """Give ``user`` exactly ``roles`` among the ``managed`` ones (single sign-on's mapping).

    A role is a group's name, or ``STAFF_ROLE`` for the staff status (never taken from a
    superuser). Groups and roles outside ``managed`` are left as they are; a managed group that
    does not exist is skipped with a warning (a mapping never creates one). A change, or a login
    made for the sign-in, is audited as ``config_changed`` on the user (action ``sso_roles``).
    """
    wanted = {role for role in roles if role in managed}
    names = sorted({role for role in managed if role != STAFF_ROLE})
    groups = {group.name: group for group in Group.objects.filter(name__in=names)}
    for name in sorted(set(names) - groups.keys()):
        logger.warning(
            "single sign-on: OIDC_GROUP_ROLES names the group %r, which does not exist", name
        )
    current = set(user.groups.filter(name__in=groups).values_list("name", flat=True))
    added = sorted((wanted & groups.keys()) - current)
    removed = sorted(current - wanted)
    if added:
        user.groups.add(*(groups[name] for name in added))
    if removed:
        user.groups.remove(*(groups[name] for name in removed))
    staff_before = bool(user.is_staff)
    if STAFF_ROLE in managed and not user.is_superuser:
        user.is_staff = STAFF_ROLE in wanted
        if user.is_staff != staff_before:
            user.save(update_fields=["is_staff"])
    if added or removed or user.is_staff != staff_before or login_created:
        config_change_record(
            actor=actor,
            obj=user,
            action="sso_roles",
            extra={
                "login": user.get_username(),
                "added": added,
                "removed": removed,
                "staff": bool(user.is_staff),
                "login_created": login_created,
            },
        )
