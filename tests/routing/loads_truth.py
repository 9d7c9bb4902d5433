"""Ground truth for the reps' load counters: what the counters must equal, counted over the
assignments, and what they say (read as a decision reads them). Shared by the load tests."""

from __future__ import annotations

from datetime import datetime

from routing.loads import LOAD_COLUMNS, load_from_row, load_today, local_midnight
from routing.models import Assignment, Rep


def counted(now: datetime) -> dict[int, tuple[int, int]]:
    """Per rep: (open leads, assignments since the rep's local midnight), from the assignments."""
    result = {}
    for rep_id, zone in Rep.objects.values_list("id", "timezone"):
        open_count = Assignment.objects.filter(
            rep_id=rep_id, active=True, touched_at__isnull=True
        ).count()
        today = Assignment.objects.filter(
            rep_id=rep_id, assigned_at__gte=local_midnight(now, zone or "UTC")
        ).count()
        result[rep_id] = (open_count, today)
    return result


def stored(now: datetime) -> dict[int, tuple[int, int | None]]:
    """Per rep: (open, today) as the counter rows say at ``now`` (today None: a row kept in
    another time zone than the rep's, which a decision counts instead of trusting)."""
    result = {}
    for row in Rep.objects.values("id", "timezone", *LOAD_COLUMNS):
        load = load_from_row(row)
        result[row["id"]] = (load.open_count, load_today(load, row["timezone"] or "UTC", now))
    return result
