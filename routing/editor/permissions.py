"""The RevOps group: who may edit routing in the admin."""

from __future__ import annotations

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
)


@transaction.atomic
def revops_group_sync() -> Group:
    """Create the RevOps group if needed and give it exactly the routing permissions."""
    group, _ = Group.objects.get_or_create(name=REVOPS_GROUP)
    wanted = Permission.objects.filter(
        Q(content_type__app_label="routing", content_type__model__in=_ROUTING_MODELS)
        | Q(content_type__app_label="leads", content_type__model="source")
        | Q(content_type__app_label="leads", codename="view_lead")
    )
    group.permissions.set(wanted)
    return group
