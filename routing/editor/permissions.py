"""The RevOps group: who may edit routing in the admin."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, Permission
from django.db import transaction
from django.db.models import Q

REVOPS_GROUP = "RevOps"

# Every routing model is theirs to edit, except the operations table; sources they manage too
# (tokens, field maps); leads they only see.
_ROUTING_MODELS = (
    "rep",
    "team",
    "teammembership",
    "territory",
    "account",
    "valuelist",
    "ruleset",
    "rule",
    "routingtestcase",
    "adminjob",  # background replays and imports (the admin shows them read-only)
    "configdraft",  # drafts of the whole configuration
    "configsnapshot",  # its versions: "add" is publishing and rolling back
)


# What they see but do not change: who published (the audit log), alerts and SLA breaches, the
# webhook endpoints and the delivery log.
_VIEW_ONLY = (
    ("audit", "event"),
    ("routing", "alert"),
    ("routing", "slabreach"),
    ("routing", "slacheckfailure"),
    ("routing", "webhookendpoint"),
    ("routing", "delivery"),
    ("routing", "deliveryattempt"),
)


@transaction.atomic
def revops_group_sync() -> Group:
    """Create the RevOps group if needed and give it exactly the routing permissions."""
    group, _ = Group.objects.get_or_create(name=REVOPS_GROUP)
    view_only = Q(pk__in=[])
    for app_label, model in _VIEW_ONLY:
        view_only |= Q(content_type__app_label=app_label, codename=f"view_{model}")
    wanted = Permission.objects.filter(
        Q(content_type__app_label="routing", content_type__model__in=_ROUTING_MODELS)
        | Q(content_type__app_label="leads", content_type__model="source")
        | Q(content_type__app_label="leads", codename="view_lead")
        | view_only
    )
    group.permissions.set(wanted)
    return group


def revops_group_after_migrate(using: str = "default", **kwargs: Any) -> None:
    """post_migrate: the group exists on every database, seeded or not.

    Permissions are made by each app's own post_migrate, and audit's comes after routing's: make
    those of the apps the group needs first (idempotent).
    """
    from django.apps import apps
    from django.contrib.auth.management import create_permissions

    for label in ("leads", "routing", "audit"):
        create_permissions(apps.get_app_config(label), verbosity=0, using=using)
    revops_group_sync()
