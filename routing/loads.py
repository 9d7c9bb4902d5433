"""Each rep's load as counters: open leads and today's assignments (``RepLoad``, one row a rep).

A decision needs, for every capped rep and every member of a least-loaded team, how many
leads the rep holds untouched and how many they were given since their local midnight.
Counting assignments for that grows with the leads; these rows cost one per rep, whatever the
rep holds. They are written in the transaction of every change that moves them:

- an assignment (``load_assigned``, from ``assignment_create``: routing, sticky duplicates,
  CRM owners, manual, SLA and CRM reassignments, the release of an absent rep's leads): the
  new owner's open +1 and today +1, and, when it supersedes an untouched assignment, the
  previous owner's open -1;
- a first touch (``assignment_first_touch`` in ``routing.decisions``: the page or API, a touch
  or an owner change read from a CRM): the owner's open -1.
An excluded or unassigned lead has no assignment and moves nothing.

"Today" is the rep's local day: ``day_count`` counts assignments at or after ``day_start``, a
midnight in the zone ``timezone``; ``prev_count`` those of the day before (``prev_start``).
Midnight writes nothing: a row whose ``day_start`` is before the rep's current midnight reads
as 0 today, and the next assignment rolls it. A decision whose clock is a moment behind a
midnight another worker already rolled still reads its own day (``prev_count``). A row counted
in another zone than the rep's current one (the rep's time zone was changed) is not trusted:
its day is counted from the assignments (one indexed query for that rep) until the rep's next
assignment recounts the row under the rep's lock, or the reconciliation repairs it.

Locks, in the order every writer takes them: the lead's row, the team's row, the new owner's
rep row, then ``RepLoad`` rows in rep id order. Increments happen only under the rep's row
lock, so counts read after taking it (``load_locked``) include every committed assignment;
decrements take only the ``RepLoad`` row, so a concurrent reader may see one open lead more
than there is, never fewer (a cap is never exceeded). ``rep_loads_reconcile`` (a beat job)
compares every row with the assignments, repairs what differs under the same locks, logs it and
adds it to ``leadrouter_rep_load_drift`` on /metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import connection, transaction
from django.db.models import Case, Count, F, IntegerField, Q, Sum, Value, When
from django.db.models.functions import Greatest
from django.utils import timezone

from routing.models import Assignment, Rep, RepLoad

logger = logging.getLogger(__name__)

__all__ = [
    "LOAD_COLUMNS",
    "Load",
    "ReconcileReport",
    "assigned_since_local_midnight",
    "load_assigned",
    "load_from_row",
    "load_locked",
    "load_released",
    "load_today",
    "local_midnight",
    "rep_load_drift_totals",
    "rep_load_recount",
    "rep_loads_reconcile",
]


def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def local_midnight(now: datetime, zone_name: str) -> datetime:
    """The start of ``now``'s day in the time zone (UTC for an unknown zone)."""
    zone = _zone(zone_name) or ZoneInfo("UTC")
    local = now.astimezone(zone)
    return datetime.combine(local.date(), time(0), tzinfo=zone)


def _day_before(midnight: datetime, zone_name: str) -> datetime:
    return local_midnight(midnight - timedelta(seconds=1), zone_name)


# --- Reading --------------------------------------------------------------------------------------

# The counter columns as ``Rep.objects.values(...)`` reads them (a LEFT JOIN: a rep without a
# row has never been given a lead through the services).
LOAD_COLUMNS = (
    "load__open_count",
    "load__timezone",
    "load__day_start",
    "load__day_count",
    "load__prev_start",
    "load__prev_count",
)


@dataclass(frozen=True, slots=True)
class Load:
    """One rep's counters as stored."""

    open_count: int = 0
    timezone: str | None = None  # None: no row
    day_start: datetime | None = None
    day_count: int = 0
    prev_start: datetime | None = None
    prev_count: int = 0


def load_from_row(row: Mapping[str, Any], prefix: str = "load__") -> Load:
    """The counters from a ``values()`` row (``LOAD_COLUMNS``) or a ``RepLoad`` field dict."""
    if row.get(f"{prefix}timezone") is None:
        return Load()
    return Load(
        open_count=row[f"{prefix}open_count"],
        timezone=row[f"{prefix}timezone"],
        day_start=row[f"{prefix}day_start"],
        day_count=row[f"{prefix}day_count"],
        prev_start=row[f"{prefix}prev_start"],
        prev_count=row[f"{prefix}prev_count"],
    )


def load_today(
    load: Load, zone_name: str, now: datetime, midnight: datetime | None = None
) -> int | None:
    """Assignments since the rep's local midnight of ``now`` (none after ``now`` is expected,
    but one a worker with a later clock made counts too, as a count of ``assigned_at >=
    midnight`` would); None when the row was counted in another zone (count instead)."""
    if load.timezone is None:
        return 0
    if load.timezone != zone_name:
        return None
    midnight = midnight or local_midnight(now, zone_name)
    if load.day_start is None or load.day_start < midnight:
        return 0
    if load.day_start == midnight:
        return load.day_count
    # A later day was rolled by a worker whose clock passed midnight first.
    earlier = load.prev_count if load.prev_start is not None and load.prev_start >= midnight else 0
    return load.day_count + earlier


def _counted_today(rep_id: int, zone_name: str, now: datetime) -> int:
    midnight = local_midnight(now, zone_name)
    return Assignment.objects.filter(rep_id=rep_id, assigned_at__gte=midnight).count()


def load_counts(
    rep_id: int,
    zone_name: str,
    load: Load,
    now: datetime,
    midnights: dict[str, datetime] | None = None,
) -> tuple[int, int]:
    """(open, today) for a decision at ``now``: from the counters, counting the day only for a
    row kept in another zone than the rep's. ``midnights``: local midnights by zone, filled
    as it goes (a snapshot of many reps works each zone's out once)."""
    midnight = None
    if midnights is not None and load.timezone == zone_name:
        midnight = midnights.get(zone_name)
        if midnight is None:
            midnight = midnights[zone_name] = local_midnight(now, zone_name)
    today = load_today(load, zone_name, now, midnight)
    if today is None:
        today = _counted_today(rep_id, zone_name, now)
    return load.open_count, today


def load_locked(rep_id: int, zone_name: str, now: datetime) -> tuple[int, int]:
    """(open, today) read in a statement of its own: call it holding the rep's row lock, so it
    sees every committed assignment to the rep (every increment is made under that lock)."""
    row = (
        RepLoad.objects.filter(rep_id=rep_id)
        .values("open_count", "timezone", "day_start", "day_count", "prev_start", "prev_count")
        .first()
    )
    return load_counts(rep_id, zone_name, load_from_row(row or {}, prefix=""), now)


# --- Writing --------------------------------------------------------------------------------------


_INT = IntegerField()


def _count_assignment(
    rep_id: int, zone_name: str, now: datetime, opened: int, count: int = 1
) -> None:
    """The rep was given ``count`` leads at ``now`` (``opened``: its open count's change)."""
    day = local_midnight(now, zone_name)
    roll = Q(day_start__isnull=True) | Q(day_start__lt=day)
    # The assignment belongs to the day before the row's: a worker whose clock is behind.
    behind = Q(day_start__gt=day)
    behind_new = behind & (Q(prev_start__isnull=True) | Q(prev_start__lt=day))
    updated = RepLoad.objects.filter(rep_id=rep_id, timezone=zone_name).update(
        open_count=Greatest(F("open_count") + opened, Value(0), output_field=_INT),
        day_count=Case(
            When(day_start=day, then=F("day_count") + count),
            When(roll, then=Value(count)),
            default=F("day_count"),
            output_field=_INT,
        ),
        prev_count=Case(
            When(roll, then=F("day_count")),
            When(behind & Q(prev_start=day), then=F("prev_count") + count),
            When(behind_new, then=Value(count)),
            default=F("prev_count"),
            output_field=_INT,
        ),
        prev_start=Case(
            When(roll, then=F("day_start")),
            When(behind_new, then=Value(day)),
            default=F("prev_start"),
        ),
        day_start=Case(When(roll, then=Value(day)), default=F("day_start")),
    )
    if not updated:
        # No row yet, or one kept in the rep's previous zone: count it all (this assignment is
        # already inserted). The caller holds the rep's row lock.
        rep_load_recount(rep_id=rep_id, zone_name=zone_name, now=now)


def load_released(rep_id: int) -> None:
    """One of the rep's open leads is no longer open (touched, or given to someone else)."""
    RepLoad.objects.filter(rep_id=rep_id).update(
        open_count=Greatest(F("open_count") - 1, Value(0), output_field=_INT)
    )


def load_assigned(
    *, rep_id: int, zone_name: str, now: datetime, released_rep_id: int | None = None
) -> None:
    """A lead given to ``rep_id`` at ``now``, superseding an untouched lead of
    ``released_rep_id`` (if any): both rows changed in rep id order. Call it holding the new
    owner's rep row lock, after inserting the assignment."""
    for changed in sorted({rep_id, *([released_rep_id] if released_rep_id is not None else [])}):
        if changed == rep_id:
            _count_assignment(rep_id, zone_name, now, 0 if released_rep_id == rep_id else 1)
        else:
            load_released(changed)


def load_assigned_many(*, counts: Sequence[tuple[int, str, datetime, int]]) -> None:
    """New leads (no supersession) given to several reps: ``counts`` holds (rep id, the rep's
    zone, the latest assignment's time, how many) for each rep and local day. One statement for
    all of them on PostgreSQL (``routing.batch``), the same arithmetic as ``_count_assignment``;
    a rep without its row in that zone is recounted. Call it holding the reps' row locks,
    after inserting the assignments."""
    per_rep: dict[int, int] = {}
    for rep_id, *_rest in counts:
        per_rep[rep_id] = per_rep.get(rep_id, 0) + 1
    together = [row for row in counts if per_rep[row[0]] == 1 and row[3] > 0]
    alone = [row for row in counts if per_rep[row[0]] > 1 and row[3] > 0]  # across a midnight
    if connection.vendor != "postgresql":
        alone, together = alone + together, []
    if together:
        days = [local_midnight(now, zone_name) for _rep, zone_name, now, _n in together]
        table = RepLoad._meta.db_table
        roll = "(r.day_start IS NULL OR r.day_start < v.day)"
        behind = "(r.day_start > v.day)"
        behind_new = f"({behind} AND (r.prev_start IS NULL OR r.prev_start < v.day))"
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} AS r SET "  # noqa: S608 - names are the model's, values bound
                "open_count = GREATEST(r.open_count + v.n, 0), "
                f"day_count = CASE WHEN r.day_start = v.day THEN r.day_count + v.n "
                f"WHEN {roll} THEN v.n ELSE r.day_count END, "
                f"prev_count = CASE WHEN {roll} THEN r.day_count "
                f"WHEN {behind} AND r.prev_start = v.day THEN r.prev_count + v.n "
                f"WHEN {behind_new} THEN v.n ELSE r.prev_count END, "
                f"prev_start = CASE WHEN {roll} THEN r.day_start "
                f"WHEN {behind_new} THEN v.day ELSE r.prev_start END, "
                f"day_start = CASE WHEN {roll} THEN v.day ELSE r.day_start END "
                "FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[], %s::int[]) "
                "AS v(rep_id, zone, day, n) "
                "WHERE r.rep_id = v.rep_id AND r.timezone = v.zone RETURNING r.rep_id",
                [
                    [row[0] for row in together],
                    [row[1] for row in together],
                    days,
                    [row[3] for row in together],
                ],
            )
            done = {row[0] for row in cursor.fetchall()}
        for rep_id, zone_name, now, _n in together:
            if rep_id not in done:
                # No row yet, or one kept in the rep's previous zone: count it all.
                rep_load_recount(rep_id=rep_id, zone_name=zone_name, now=now)
    for rep_id, zone_name, now, n in alone:
        _count_assignment(rep_id, zone_name, now, n, n)


def _true_counts(rep_id: int, zone_name: str, now: datetime) -> dict[str, Any]:
    day = local_midnight(now, zone_name)
    prev = _day_before(day, zone_name)
    open_count = Assignment.objects.filter(
        rep_id=rep_id, active=True, touched_at__isnull=True
    ).count()
    days = Assignment.objects.filter(rep_id=rep_id, assigned_at__gte=prev).aggregate(
        day=Count("id", filter=Q(assigned_at__gte=day)),
        prev=Count("id", filter=Q(assigned_at__lt=day)),
    )
    return {
        "open_count": open_count,
        "timezone": zone_name,
        "day_start": day,
        "day_count": days["day"],
        "prev_start": prev,
        "prev_count": days["prev"],
    }


def rep_load_recount(
    *, rep_id: int, zone_name: str, now: datetime, missing_is_drift: bool = False
) -> tuple[int, int]:
    """Count the rep's open and today's leads from the assignments and store them.

    Call it in a transaction holding the rep's row lock (no assignment to the rep can commit
    meanwhile); the ``RepLoad`` row is locked before counting, so a touch or a release that
    committed first is counted and one still open waits and then applies its -1 to the count.
    Returns the drift it repaired: (open, today), each the absolute difference. A missing row
    is drift only for the reconciliation (``missing_is_drift``): a rep's first assignment
    creates it.
    """
    row = RepLoad.objects.select_for_update().filter(rep_id=rep_id).first()
    true = _true_counts(rep_id, zone_name, now)
    if row is None:
        drift = (true["open_count"], true["day_count"]) if missing_is_drift else (0, 0)
        RepLoad.objects.create(
            rep_id=rep_id, reconciled_at=now, drift_open=drift[0], drift_today=drift[1], **true
        )
        return drift
    before = load_from_row(
        {
            name: getattr(row, name)
            for name in (
                "open_count",
                "timezone",
                "day_start",
                "day_count",
                "prev_start",
                "prev_count",
            )
        },
        prefix="",
    )
    stored_today = load_today(before, zone_name, now)
    drift_open = abs(before.open_count - true["open_count"])
    drift_today = abs(stored_today - true["day_count"]) if stored_today is not None else 0
    for name, value in true.items():
        setattr(row, name, value)
    row.drift_open += drift_open
    row.drift_today += drift_today
    row.reconciled_at = now
    row.save()
    return drift_open, drift_today


# --- Reconciliation -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What a reconciliation found: reps checked, suspected (checked again under locks),
    repaired, and the drift repaired."""

    reps: int
    suspects: int
    repaired: int
    drift_open: int
    drift_today: int


def assigned_since_local_midnight(*, now: datetime, zones: set[str]) -> dict[int, int]:
    """Assignments per rep since the rep's own local midnight of ``now``, counted from the
    assignments (one grouped query per time zone in ``zones``; a rep in another zone is not
    counted). The definition of "today" the caps use, for the pages and the reconciliation."""
    today: dict[int, int] = {}
    for zone_name in sorted(zones):
        today.update(
            Assignment.objects.filter(
                rep__timezone=zone_name, assigned_at__gte=local_midnight(now, zone_name or "UTC")
            )
            .order_by()
            .values_list("rep_id")
            .annotate(n=Count("id"))
        )
    return today


def _suspects(now: datetime) -> tuple[int, list[int]]:
    """(reps, the ids whose counters differ from the assignments), read without locks: grouped
    counts (open per rep; today's per rep, one query per time zone in use) and the rows. A
    difference may be a transaction in flight: each suspect is checked again under locks."""
    reps = list(Rep.objects.order_by("id").values("id", "timezone", *LOAD_COLUMNS))
    open_true = dict(
        Assignment.objects.filter(active=True, touched_at__isnull=True)
        .order_by()
        .values_list("rep_id")
        .annotate(n=Count("id"))
    )
    today_true = assigned_since_local_midnight(now=now, zones={row["timezone"] for row in reps})
    suspects = []
    for row in reps:
        zone_name = row["timezone"] or "UTC"
        load = load_from_row(row)
        stored = (load.open_count, load_today(load, zone_name, now))
        if stored != (open_true.get(row["id"], 0), today_true.get(row["id"], 0)):
            suspects.append(row["id"])
    return len(reps), suspects


def rep_loads_reconcile(*, now: datetime | None = None) -> ReconcileReport:
    """Compare every rep's counters with the assignments and repair those that differ.

    One pass without locks finds the suspects; each is then recounted in its own transaction
    under the rep's row lock and its ``RepLoad`` row's (the order the assignment paths take),
    so an assignment or touch in flight is neither lost nor counted twice. Each repair is
    logged, and its drift added to the row's totals (``leadrouter_rep_load_drift``).
    """
    now = now or timezone.now()
    checked, suspects = _suspects(now)
    repaired = total_open = total_today = 0
    for rep_id in suspects:
        with transaction.atomic():
            zone_name = (
                Rep.objects.select_for_update(no_key=True)
                .filter(pk=rep_id)
                .values_list("timezone", flat=True)
                .first()
            )
            if zone_name is None:
                continue  # deleted meanwhile
            drift_open, drift_today = rep_load_recount(
                rep_id=rep_id, zone_name=zone_name or "UTC", now=now, missing_is_drift=True
            )
        if drift_open or drift_today:
            repaired += 1
            total_open += drift_open
            total_today += drift_today
            logger.warning(
                "rep %s: load counters drifted from the assignments (open off by %d, today off "
                "by %d); repaired",
                rep_id,
                drift_open,
                drift_today,
            )
    if repaired:
        logger.warning(
            "rep load reconciliation: %d of %d reps repaired (open drift %d, today drift %d)",
            repaired,
            checked,
            total_open,
            total_today,
        )
    return ReconcileReport(
        reps=checked,
        suspects=len(suspects),
        repaired=repaired,
        drift_open=total_open,
        drift_today=total_today,
    )


def rep_load_drift_totals() -> dict[str, int]:
    """The drift every reconciliation repaired so far, by counter (for /metrics)."""
    totals = RepLoad.objects.aggregate(open=Sum("drift_open"), today=Sum("drift_today"))
    return {"open": totals["open"] or 0, "today": totals["today"] or 0}
