"""The "Sales managers" group and who sees which leads on the history pages."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, Permission
from django.db import transaction

SALES_MANAGERS_GROUP = "Sales managers"

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
