"""Priority and tags for leads routed before they were columns, read back from the audit log.

Until ``leads 0014`` / ``routing 0022`` the priority and tags a tag rule gave a lead lived only
in its routing event's ``data`` (``assigned``, ``excluded``, ``unassigned``; always plain, never
sealed: they are not personal). ``priority_tags_backfill`` copies the last such event's values
onto the lead (its columns and ``LeadTag`` rows) and onto the lead's assignments that have none,
as routing does today (an assignment made by hand takes the lead's). It runs from the migration
``routing 0028`` with the migration's historical models, so it uses nothing but the models it
is given and plain Python; idempotent: a lead that has a priority or tags is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leads.priority import priority_clean, tags_clean

ROUTING_EVENTS = ("assigned", "excluded", "unassigned")


@dataclass(slots=True)
class BackfillCounts:
    leads: int = 0
    assignments: int = 0
    tag_rows: int = 0


def _values(data: Any) -> tuple[str, list[str]] | None:
    if not isinstance(data, dict):
        return None
    tags = data.get("tags")
    priority = priority_clean(data.get("priority") if isinstance(data.get("priority"), str) else "")
    kept = tags_clean(tags) if isinstance(tags, list) else []
    return (priority, kept) if priority or kept else None


def priority_tags_backfill(apps: Any, *, batch_size: int = 2000) -> BackfillCounts:
    """Fill every untagged lead's priority and tags from its last routing event, in batches of
    ``batch_size`` leads (keyset by id: bounded memory on any size of table)."""
    lead_model = apps.get_model("leads", "Lead")
    tag_model = apps.get_model("leads", "LeadTag")
    event_model = apps.get_model("audit", "Event")
    assignment_model = apps.get_model("routing", "Assignment")
    counts = BackfillCounts()
    after = None
    while True:
        rows = lead_model.objects.filter(priority="").order_by("pk")
        if after is not None:
            rows = rows.filter(pk__gt=after)
        batch = list(rows.values_list("pk", "tags")[:batch_size])
        if not batch:
            return counts
        after = batch[-1][0]
        untagged = [pk for pk, tags in batch if not tags]
        last: dict[Any, tuple[str, list[str]]] = {}
        events = (
            event_model.objects.filter(lead_id__in=untagged, type__in=ROUTING_EVENTS)
            .order_by("lead_id", "seq")
            .values_list("lead_id", "data")
        )
        for lead_id, data in events.iterator(chunk_size=batch_size):
            values = _values(data)
            if values is not None:
                last[lead_id] = values
            else:
                last.pop(lead_id, None)  # routed again later without tags: none now
        for lead_id, (priority, tags) in last.items():
            lead_model.objects.filter(pk=lead_id).update(priority=priority, tags=tags)
            counts.leads += 1
            if tags:
                created = tag_model.objects.bulk_create(
                    [tag_model(lead_id=lead_id, tag=tag) for tag in tags], ignore_conflicts=True
                )
                counts.tag_rows += len(created)
            counts.assignments += assignment_model.objects.filter(
                lead_id=lead_id, priority="", tags=[]
            ).update(priority=priority, tags=tags)
