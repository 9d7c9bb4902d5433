"""The report rollups: what the long report windows (over 7 days) read instead of every row.

Two tables, kept by database triggers (PostgreSQL and SQLite) in the same transaction as the
write that changes them, whichever code path makes it (services, ``update()``, raw SQL):

- ``audit_reportslot``: per 15 minutes (UTC) of ``leads_lead.received_at``, the leads by their
  current status (``lead:<status>``), and per 15 minutes of ``audit_event.at`` the routed events
  (``routed``: assigned, excluded, unassigned). A row per slot, measure and *shard* (8 per
  measure, by the lead's or event's id), so concurrent intakes do not all wait on one row.
  15 minutes because every zone's offset in use is a multiple of it (+05:30, +05:45): an hour
  or day bar of any zone is a whole number of slots.
- ``audit_assignmentday``: per UTC day of ``assigned_at``, team and rep, the counts of the
  report tables and a histogram of time to assign and time to first touch (``BINS`` bins on a
  log scale, ``BIN_STEPS`` per doubling), from which p50 and p95 are read.

An insert adds the row's contribution (+1), a delete takes it away (-1), an update of a column
that matters takes the old row's away and adds the new one's: ``UPDATE ... SET n = n + 1``
through ``INSERT ... ON CONFLICT DO UPDATE``, so two writers on the same row never lose one.
The windows' partial edges (before the first whole slot or day, after the last) are read from
the raw rows by audit.reports.
"""

# The SQL here is built from this module's constants only (names, thresholds), never input.
# ruff: noqa: S608

from __future__ import annotations

import bisect
from datetime import timedelta
from typing import Any

SLOT = timedelta(minutes=15)
SHARDS = 8
BIN_STEPS = 4  # bins per doubling: each bin's upper bound is 2 ** (1/4) ≈ 1.19 times its lower
BIN_TOP = 22  # 2 ** 22 s ≈ 48.5 days: longer durations share the last bin
# THRESHOLDS[k] is the lower bound, in seconds, of bin k + 1; bin 0 is under one second.
THRESHOLDS: tuple[float, ...] = tuple(2 ** (k / BIN_STEPS) for k in range(BIN_STEPS * BIN_TOP + 1))
BINS = len(THRESHOLDS) + 1
FIRST_KINDS = ("initial", "duplicate", "crm_owner")  # routing.models.FIRST_ASSIGNMENT_KINDS
ROUTED_TYPES = ("assigned", "excluded", "unassigned")  # audit.dashboard.ROUTED_EVENTS

COUNT_COLUMNS = (
    "assigned",
    "first",
    "initial",
    "reassigned_in",
    "with_sla",
    "sla_met",
    "sla_late",
)
TTA_COLUMNS = tuple(f"tta_{k}" for k in range(BINS))
TTFT_COLUMNS = tuple(f"ttft_{k}" for k in range(BINS))
SUM_COLUMNS = COUNT_COLUMNS + TTA_COLUMNS + TTFT_COLUMNS

SLOT_TABLE = "audit_reportslot"
DAY_TABLE = "audit_assignmentday"


def duration_bin(seconds: float) -> int:
    """The histogram bin of a duration in seconds (the triggers' CASE ladder, in Python)."""
    return bisect.bisect_right(THRESHOLDS, seconds)


def bin_bounds(index: int) -> tuple[float, float]:
    """``[low, high)`` in seconds of bin ``index`` (the last one's high is its low)."""
    if index == 0:
        return 0.0, THRESHOLDS[0]
    low = THRESHOLDS[index - 1]
    return low, THRESHOLDS[index] if index < len(THRESHOLDS) else low


def histogram_percentile(counts: list[int], fraction: float) -> timedelta | None:
    """The ``fraction`` percentile of a histogram: the value of 0-based rank
    ``floor(fraction * (n - 1))`` (the lower of the two percentile_cont interpolates between),
    placed inside its bin by its rank there. Never outside that value's bin: at most one bin
    (19 %) off it, under a second for durations under a second."""
    total = sum(counts)
    if not total:
        return None
    rank = int(fraction * (total - 1))  # the lower of the two values percentile_cont blends
    before = 0
    for index, n in enumerate(counts):
        if n and rank < before + n:
            low, high = bin_bounds(index)
            seconds = low + (high - low) * (rank - before + 0.5) / n
            return timedelta(seconds=seconds)
        before += n
    low, _ = bin_bounds(len(counts) - 1)
    return timedelta(seconds=low)


# --- SQL, per database ----------------------------------------------------------------------
# Built from this module's constants only (table and column names, thresholds): no input.


def _seconds(vendor: str, later: str, earlier: str) -> str:
    if vendor == "postgresql":
        # float8: the bin ladder compares doubles, far cheaper than numeric.
        return f"extract(epoch FROM ({later} - {earlier}))::float8"
    return f"((julianday({later}) - julianday({earlier})) * 86400.0)"


def _bin(expression: str) -> str:
    ladder = " ".join(f"WHEN {expression} < {t!r} THEN {k}" for k, t in enumerate(THRESHOLDS))
    return f"CASE WHEN {expression} IS NULL THEN -1 {ladder} ELSE {BINS - 1} END"


def _day(vendor: str, column: str) -> str:
    if vendor == "postgresql":
        return f"({column} AT TIME ZONE 'UTC')::date"
    return f"date({column})"


def _slot(vendor: str, column: str) -> str:
    if vendor == "postgresql":
        return f"to_timestamp(floor(extract(epoch FROM {column}) / 900) * 900)"
    return (
        f"strftime('%Y-%m-%d %H:', {column}) || "
        f"printf('%02d', (CAST(strftime('%M', {column}) AS INTEGER) / 15) * 15) || ':00'"
    )


def _lead_shard(vendor: str, column: str) -> str:
    if vendor == "postgresql":
        return f"get_byte(uuid_send({column}), 15) % {SHARDS}"
    return f"(instr('0123456789abcdef', lower(substr({column}, -1, 1))) - 1) % {SHARDS}"


def _fence(vendor: str) -> str:
    """Keeps a subquery from being merged into the one around it: merged, each use of a
    column (the bin, 2 x 90 times) would repeat its whole expression (the ladder, the
    duration), thousands of evaluations a row."""
    return " OFFSET 0" if vendor == "postgresql" else " LIMIT -1 OFFSET 0"


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _assignment_values(vendor: str, row: str, received: str, source: str = "") -> str:
    """A SELECT of one assignment's contributions (before the sign), ``row`` its columns'
    qualifier (``NEW``, ``OLD`` or a table alias), ``received`` its lead's received_at,
    ``source`` the FROM clause of ``row`` (none in a trigger). The durations are computed
    once, in the inner SELECT, and binned by the outer one."""
    first = f"{row}.kind IN ({_quoted(FIRST_KINDS)})"
    tta = f"CASE WHEN {first} THEN {_seconds(vendor, f'{row}.assigned_at', received)} END"
    ttft = _seconds(vendor, f"{row}.touched_at", f"{row}.assigned_at")
    return f"""SELECT w.day, w.team_key, w.rep_id, w.is_first, w.is_initial, w.is_reassignment,
        w.has_sla, w.met, w.late, {_bin("w.tta_s")} AS tb, {_bin("w.ttft_s")} AS fb
    FROM (SELECT {_day(vendor, f"{row}.assigned_at")} AS day,
        coalesce({row}.team_id, 0) AS team_key, {row}.rep_id AS rep_id,
        CASE WHEN {first} THEN 1 ELSE 0 END AS is_first,
        CASE WHEN {row}.kind = 'initial' THEN 1 ELSE 0 END AS is_initial,
        CASE WHEN {row}.kind = 'reassignment' THEN 1 ELSE 0 END AS is_reassignment,
        CASE WHEN {row}.sla_due_at IS NOT NULL THEN 1 ELSE 0 END AS has_sla,
        CASE WHEN {row}.touched_at <= {row}.sla_due_at THEN 1 ELSE 0 END AS met,
        CASE WHEN {row}.touched_at > {row}.sla_due_at THEN 1 ELSE 0 END AS late,
        {tta} AS tta_s, {ttft} AS ttft_s {source}{_fence(vendor)}) AS w{_fence(vendor)}"""


def assignment_values_sql(vendor: str, source: str) -> str:
    """A SELECT of each assignment's contributions (``day``, ``team_key``, ``rep_id``, the
    0/1 flags ``is_first``, ``is_initial``, ``is_reassignment``, ``has_sla``, ``met``,
    ``late``, and the bins ``tb``, ``fb``, -1 for none), for ``source``: a FROM clause naming
    the assignments ``a`` and their leads ``l`` (and any WHERE). The expressions are the
    triggers', so rows read this way bin exactly as the rollup does (audit.reports reads a
    window's partial days so)."""
    return _assignment_values(vendor, "a", "l.received_at", source)


def _assignment_sums(sign: str) -> str:
    """The rollup columns from ``_assignment_values`` (as ``v``), each times ``sign``."""
    parts = [
        f"{sign} AS assigned",
        f"{sign} * v.is_first AS first",
        f"{sign} * v.is_initial AS initial",
        f"{sign} * v.is_reassignment AS reassigned_in",
        f"{sign} * v.has_sla AS with_sla",
        f"{sign} * v.met AS sla_met",
        f"{sign} * v.late AS sla_late",
    ]
    parts += [f"CASE WHEN v.tb = {k} THEN {sign} ELSE 0 END AS tta_{k}" for k in range(BINS)]
    parts += [f"CASE WHEN v.fb = {k} THEN {sign} ELSE 0 END AS ttft_{k}" for k in range(BINS)]
    return ", ".join(parts)


def _day_upsert(vendor: str, row: str, sign: int) -> str:
    columns = ", ".join(SUM_COLUMNS)
    received = f"(SELECT l.received_at FROM leads_lead l WHERE l.id = {row}.lead_id)"
    updates = ", ".join(f"{c} = {DAY_TABLE}.{c} + excluded.{c}" for c in SUM_COLUMNS)
    return f"""INSERT INTO {DAY_TABLE} (day, team_key, rep_id, {columns})
        SELECT v.day, v.team_key, v.rep_id, {_assignment_sums(str(sign))}
        FROM ({_assignment_values(vendor, row, received)}) AS v WHERE true
        ON CONFLICT (day, team_key, rep_id) DO UPDATE SET {updates}"""


def _slot_upsert(slot: str, measure: str, shard: str, sign: int) -> str:
    return f"""INSERT INTO {SLOT_TABLE} (slot, measure, shard, n)
        SELECT {slot}, {measure}, {shard}, {sign} WHERE true
        ON CONFLICT (slot, measure, shard) DO UPDATE SET n = {SLOT_TABLE}.n + excluded.n"""


def _lead_upsert(vendor: str, row: str, sign: int) -> str:
    return _slot_upsert(
        _slot(vendor, f"{row}.received_at"),
        f"'lead:' || {row}.status",
        _lead_shard(vendor, f"{row}.id"),
        sign,
    )


def _event_upsert(vendor: str) -> str:
    return _slot_upsert(_slot(vendor, "NEW.at"), "'routed'", f"NEW.id % {SHARDS}", 1)


_ASSIGNMENT_CHANGED = " OR ".join(
    f"OLD.{c} IS DISTINCT FROM NEW.{c}"
    for c in ("kind", "team_id", "rep_id", "lead_id", "sla_due_at", "touched_at", "assigned_at")
)
_LEAD_CHANGED = (
    "OLD.status IS DISTINCT FROM NEW.status OR OLD.received_at IS DISTINCT FROM NEW.received_at"
)
_ROUTED = f"NEW.type IN ({_quoted(ROUTED_TYPES)})"


def _slot_rows(vendor: str, rows: str, sign: int, where: str = "") -> str:
    """A SELECT of (slot, measure, shard, n) for each lead of a transition table."""
    return (
        f"SELECT {_slot(vendor, 'r.received_at')} AS slot, 'lead:' || r.status AS measure, "
        f"{_lead_shard(vendor, 'r.id')} AS shard, {sign} AS n FROM {rows} AS r{where}"
    )


def _slot_fold(changes: str) -> str:
    """Upsert ``changes`` (a SELECT of slot, measure, shard, n) summed per counter row, in
    the counters' key order: every statement takes its counter rows in that one order, so two
    statements (a claim of 50 leads and a batch's outcomes) cannot take two rows in opposite
    orders and deadlock."""
    return f"""INSERT INTO {SLOT_TABLE} (slot, measure, shard, n)
        SELECT c.slot, c.measure, c.shard, sum(c.n) FROM ({changes}) AS c
        GROUP BY c.slot, c.measure, c.shard HAVING sum(c.n) <> 0
        ORDER BY c.slot, c.measure, c.shard
        ON CONFLICT (slot, measure, shard) DO UPDATE SET n = {SLOT_TABLE}.n + excluded.n"""


_LEAD_MOVED = "o.status IS DISTINCT FROM n.status OR o.received_at IS DISTINCT FROM n.received_at"


def _postgres_create() -> list[str]:
    """The triggers on PostgreSQL. A lead's and an event's counters are kept by statement-level
    triggers over the statement's transition tables (``_slot_fold``: one upsert a statement,
    in key order); an assignment's day rows by row-level ones (an assignment is made, touched
    or moved under its rep's row lock, so two writers of one rep's day rows take turns)."""
    v = "postgresql"
    moved = f"(SELECT o.* FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE {_LEAD_MOVED})"
    moved_new = f"(SELECT n.* FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE {_LEAD_MOVED})"
    lead_insert = _slot_fold(_slot_rows(v, "new_rows", 1))
    lead_delete = _slot_fold(_slot_rows(v, "old_rows", -1))
    lead_update = _slot_fold(f"{_slot_rows(v, moved, -1)} UNION ALL {_slot_rows(v, moved_new, 1)}")
    events = _slot_fold(
        f"SELECT {_slot(v, 'e.at')} AS slot, 'routed' AS measure, e.id % {SHARDS} AS shard, "
        f"1 AS n FROM new_rows AS e WHERE e.type IN ({_quoted(ROUTED_TYPES)})"
    )
    return [
        *_postgres_assignment_create(),
        f"""CREATE OR REPLACE FUNCTION report_leads_change() RETURNS trigger AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN {lead_insert};
            ELSIF TG_OP = 'DELETE' THEN {lead_delete};
            ELSE {lead_update}; END IF;
            RETURN NULL;
        END $$ LANGUAGE plpgsql""",
        """CREATE TRIGGER report_leads_insert AFTER INSERT ON leads_lead
        REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION report_leads_change()""",
        """CREATE TRIGGER report_leads_update AFTER UPDATE ON leads_lead
        REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION report_leads_change()""",
        """CREATE TRIGGER report_leads_delete AFTER DELETE ON leads_lead
        REFERENCING OLD TABLE AS old_rows
        FOR EACH STATEMENT EXECUTE FUNCTION report_leads_change()""",
        f"""CREATE OR REPLACE FUNCTION report_events_insert() RETURNS trigger AS $$
        BEGIN {events}; RETURN NULL; END $$ LANGUAGE plpgsql""",
        """CREATE TRIGGER report_events_insert AFTER INSERT ON audit_event
        REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION report_events_insert()""",
    ]


def _postgres_assignment_create() -> list[str]:
    v = "postgresql"
    return [
        f"""CREATE OR REPLACE FUNCTION report_assignment_change() RETURNS trigger AS $$
        BEGIN
            IF TG_OP IN ('UPDATE', 'DELETE') THEN {_day_upsert(v, "OLD", -1)}; END IF;
            IF TG_OP IN ('INSERT', 'UPDATE') THEN {_day_upsert(v, "NEW", 1)}; END IF;
            RETURN NULL;
        END $$ LANGUAGE plpgsql""",
        """CREATE TRIGGER report_assignment_insert_delete AFTER INSERT OR DELETE
        ON routing_assignment FOR EACH ROW EXECUTE FUNCTION report_assignment_change()""",
        f"""CREATE TRIGGER report_assignment_update AFTER UPDATE ON routing_assignment
        FOR EACH ROW WHEN ({_ASSIGNMENT_CHANGED})
        EXECUTE FUNCTION report_assignment_change()""",
    ]


def postgres_row_triggers_create() -> list[str]:
    """The row-level triggers of migration 0009, kept for its reverse (0010) and for the
    test that shows why they went: each row's counters upserted in the order the statement
    happens to change its rows, so two statements deadlock on the counter rows."""
    v = "postgresql"
    return [
        *_postgres_assignment_create(),
        f"""CREATE OR REPLACE FUNCTION report_lead_change() RETURNS trigger AS $$
        BEGIN
            IF TG_OP IN ('UPDATE', 'DELETE') THEN {_lead_upsert(v, "OLD", -1)}; END IF;
            IF TG_OP IN ('INSERT', 'UPDATE') THEN {_lead_upsert(v, "NEW", 1)}; END IF;
            RETURN NULL;
        END $$ LANGUAGE plpgsql""",
        """CREATE TRIGGER report_lead_insert_delete AFTER INSERT OR DELETE ON leads_lead
        FOR EACH ROW EXECUTE FUNCTION report_lead_change()""",
        f"""CREATE TRIGGER report_lead_update AFTER UPDATE ON leads_lead
        FOR EACH ROW WHEN ({_LEAD_CHANGED}) EXECUTE FUNCTION report_lead_change()""",
        f"""CREATE OR REPLACE FUNCTION report_event_insert() RETURNS trigger AS $$
        BEGIN {_event_upsert(v)}; RETURN NULL; END $$ LANGUAGE plpgsql""",
        f"""CREATE TRIGGER report_event_insert AFTER INSERT ON audit_event
        FOR EACH ROW WHEN ({_ROUTED}) EXECUTE FUNCTION report_event_insert()""",
    ]


_POSTGRES_DROP = [
    "DROP TRIGGER IF EXISTS report_leads_insert ON leads_lead",
    "DROP TRIGGER IF EXISTS report_leads_update ON leads_lead",
    "DROP TRIGGER IF EXISTS report_leads_delete ON leads_lead",
    "DROP TRIGGER IF EXISTS report_events_insert ON audit_event",
    "DROP FUNCTION IF EXISTS report_leads_change()",
    "DROP FUNCTION IF EXISTS report_events_insert()",
    "DROP TRIGGER IF EXISTS report_assignment_insert_delete ON routing_assignment",
    "DROP TRIGGER IF EXISTS report_assignment_update ON routing_assignment",
    "DROP TRIGGER IF EXISTS report_lead_insert_delete ON leads_lead",
    "DROP TRIGGER IF EXISTS report_lead_update ON leads_lead",
    "DROP TRIGGER IF EXISTS report_event_insert ON audit_event",
    "DROP FUNCTION IF EXISTS report_assignment_change()",
    "DROP FUNCTION IF EXISTS report_lead_change()",
    "DROP FUNCTION IF EXISTS report_event_insert()",
]


def _sqlite_create() -> list[str]:
    v = "sqlite"
    changed_a = _ASSIGNMENT_CHANGED.replace("IS DISTINCT FROM", "IS NOT")
    changed_l = _LEAD_CHANGED.replace("IS DISTINCT FROM", "IS NOT")
    return [
        f"""CREATE TRIGGER IF NOT EXISTS report_assignment_insert AFTER INSERT
        ON routing_assignment BEGIN {_day_upsert(v, "NEW", 1)}; END""",
        f"""CREATE TRIGGER IF NOT EXISTS report_assignment_delete AFTER DELETE
        ON routing_assignment BEGIN {_day_upsert(v, "OLD", -1)}; END""",
        f"""CREATE TRIGGER IF NOT EXISTS report_assignment_update AFTER UPDATE
        ON routing_assignment WHEN {changed_a}
        BEGIN {_day_upsert(v, "OLD", -1)}; {_day_upsert(v, "NEW", 1)}; END""",
        f"""CREATE TRIGGER IF NOT EXISTS report_lead_insert AFTER INSERT ON leads_lead
        BEGIN {_lead_upsert(v, "NEW", 1)}; END""",
        f"""CREATE TRIGGER IF NOT EXISTS report_lead_delete AFTER DELETE ON leads_lead
        BEGIN {_lead_upsert(v, "OLD", -1)}; END""",
        f"""CREATE TRIGGER IF NOT EXISTS report_lead_update AFTER UPDATE ON leads_lead
        WHEN {changed_l}
        BEGIN {_lead_upsert(v, "OLD", -1)}; {_lead_upsert(v, "NEW", 1)}; END""",
        f"""CREATE TRIGGER IF NOT EXISTS report_event_insert AFTER INSERT ON audit_event
        WHEN {_ROUTED} BEGIN {_event_upsert(v)}; END""",
    ]


_SQLITE_DROP = [
    f"DROP TRIGGER IF EXISTS {name}"
    for name in (
        "report_assignment_insert",
        "report_assignment_delete",
        "report_assignment_update",
        "report_lead_insert",
        "report_lead_delete",
        "report_lead_update",
        "report_event_insert",
    )
]


def _statements(vendor: str, *, create: bool) -> list[str]:
    if vendor == "postgresql":
        return _postgres_create() if create else _POSTGRES_DROP
    if vendor == "sqlite":
        return _sqlite_create() if create else _SQLITE_DROP
    raise NotImplementedError(f"no report rollup triggers for the {vendor} database")


def rollup_triggers_create(connection: Any) -> None:
    """Create the triggers that keep the rollups (idempotent: dropped first)."""
    rollup_triggers_drop(connection)
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=True):
            cursor.execute(sql)


def rollup_row_triggers_create(connection: Any) -> None:
    """PostgreSQL: the row-level triggers of migration 0009 instead (its reverse, a test)."""
    rollup_triggers_drop(connection)
    with connection.cursor() as cursor:
        for sql in postgres_row_triggers_create():
            cursor.execute(sql)


def rollup_triggers_drop(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=False):
            cursor.execute(sql)


def _rebuild_statements(vendor: str) -> list[str]:
    columns = ", ".join(SUM_COLUMNS)
    sums = ", ".join(f"sum(x.{c})" for c in SUM_COLUMNS)
    values = _assignment_values(
        vendor,
        "a",
        "l.received_at",
        "FROM routing_assignment a JOIN leads_lead l ON l.id = a.lead_id",
    )
    per_assignment = f"""SELECT v.day, v.team_key, v.rep_id, {_assignment_sums("1")}
        FROM ({values}) AS v"""
    return [
        f"DELETE FROM {DAY_TABLE}",
        f"DELETE FROM {SLOT_TABLE}",
        f"""INSERT INTO {DAY_TABLE} (day, team_key, rep_id, {columns})
        SELECT x.day, x.team_key, x.rep_id, {sums} FROM ({per_assignment}) AS x
        GROUP BY x.day, x.team_key, x.rep_id""",
        f"""INSERT INTO {SLOT_TABLE} (slot, measure, shard, n)
        SELECT {_slot(vendor, "received_at")}, 'lead:' || status, {_lead_shard(vendor, "id")},
            count(*)
        FROM leads_lead GROUP BY 1, 2, 3""",
        f"""INSERT INTO {SLOT_TABLE} (slot, measure, shard, n)
        SELECT {_slot(vendor, "at")}, 'routed', id % {SHARDS}, count(*)
        FROM audit_event WHERE type IN ({_quoted(ROUTED_TYPES)}) GROUP BY 1, 3""",
    ]


def rollups_rebuild(connection: Any) -> None:
    """Recompute both rollups from the raw rows (the backfill), in the caller's transaction;
    on PostgreSQL writers of the three tables wait until it commits, so nothing is missed or
    counted twice."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("LOCK TABLE leads_lead, routing_assignment, audit_event IN SHARE MODE")
        for sql in _rebuild_statements(connection.vendor):
            cursor.execute(sql)
