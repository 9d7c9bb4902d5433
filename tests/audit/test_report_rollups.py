"""The long report windows read the rollups (audit.rollups): every figure equals the same figure
over the raw rows, for seeded random data, in zones with DST, +05:30 and +05:45, on SQLite and
PostgreSQL; p50/p95 stay inside the histogram bin of the exact value; the triggers follow
touches, status changes and deletions, and the backfill rebuilds the same rows."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, transaction

from audit import reports, rollups
from audit.models import AssignmentDay, EventType, ReportSlot
from audit.services import event_record, event_record_for_assignment
from leads.models import Lead, LeadStatus
from routing.models import (
    FIRST_ASSIGNMENT_KINDS,
    Assignment,
    AssignmentKind,
    TeamMembership,
    TeamStrategy,
)
from tests.leads.factories import LeadFactory
from tests.routing.factories import AssignmentFactory, RepFactory, TeamFactory

pytestmark = pytest.mark.django_db

# Autumn: Europe falls back on 25 October, New York on 1 November (inside the 30-day window);
# spring: New York springs forward on 8 March.
NOWS = (datetime(2026, 11, 3, 10, 7, 31, tzinfo=UTC), datetime(2026, 3, 20, 15, 52, tzinfo=UTC))
ZONES = ("UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata", "Asia/Kathmandu")
STATUSES = (
    LeadStatus.ASSIGNED,
    LeadStatus.EXCLUDED,
    LeadStatus.UNASSIGNED,
    LeadStatus.DUPLICATE,
    LeadStatus.FAILED,
    LeadStatus.RECEIVED,
)


def _moment(rng: random.Random, now: datetime) -> datetime:
    """A time in the last 95 days, a third of them near an edge of a 30- or 90-day window."""
    pick = rng.random()
    if pick < 0.35:
        centre = now - timedelta(days=rng.choice((30, 90, 0)))
        moment = centre + timedelta(seconds=rng.uniform(-36 * 3600, 0))
    else:
        moment = now - timedelta(seconds=rng.uniform(0, 95 * 86400))
    return moment.replace(microsecond=rng.choice((0, rng.randrange(1_000_000))))


def _company(seed: int, now: datetime, leads: int = 160) -> dict[str, Any]:
    """Random leads, assignments, touches, SLAs, reassignments and events, then some changes
    made afterwards (touches, status changes, a deletion) that the triggers must follow."""
    rng = random.Random(seed)
    teams = [
        TeamFactory(name="RR", strategy=TeamStrategy.ROUND_ROBIN),
        TeamFactory(name="Weighted", strategy=TeamStrategy.WEIGHTED),
    ]
    reps = [RepFactory(name=f"Rep {i}", timezone=ZONES[i % len(ZONES)]) for i in range(5)]
    for i, rep in enumerate(reps):
        TeamMembership.objects.create(team=teams[i % 2], rep=rep, position=i, weight=1 + i % 3)
    made: list[Assignment] = []
    for _ in range(leads):
        received = _moment(rng, now)
        status = rng.choices(STATUSES, weights=(70, 8, 6, 6, 3, 7))[0]
        lead = LeadFactory(status=status, received_at=received, received_event=False)
        routed = {
            LeadStatus.EXCLUDED: EventType.EXCLUDED,
            LeadStatus.UNASSIGNED: EventType.UNASSIGNED,
        }
        if status in routed:
            event_record(type=routed[status], lead=lead, at=received + timedelta(seconds=2))
        if status not in (LeadStatus.ASSIGNED, LeadStatus.DUPLICATE):
            continue
        rep = rng.choice(reps)
        team = rng.choice([*teams, None])
        assigned = received + timedelta(seconds=rng.choice((0.4, rng.uniform(0, 4000))))
        due = assigned + timedelta(minutes=rng.choice((30, 60))) if rng.random() < 0.8 else None
        touched = None
        if rng.random() < 0.6:
            touched = assigned + timedelta(seconds=rng.uniform(1, 3 * 3600))
        kind = rng.choice(FIRST_ASSIGNMENT_KINDS)
        assignment = AssignmentFactory(
            lead=lead,
            rep=rep,
            team=team,
            team_name=team.name if team else "",
            kind=kind,
            assigned_at=assigned,
            sla_due_at=due,
            touched_at=touched,
        )
        event_record_for_assignment(type=EventType.ASSIGNED, assignment=assignment, at=assigned)
        made.append(assignment)
    for old in rng.sample(made, len(made) // 8):
        at = old.assigned_at + timedelta(minutes=rng.uniform(10, 600))
        if at >= now:
            continue
        Assignment.objects.filter(pk=old.pk).update(active=False)
        new = AssignmentFactory(
            lead=old.lead,
            rep=rng.choice(reps),
            team=old.team,
            team_name=old.team_name,
            kind=AssignmentKind.REASSIGNMENT,
            supersedes=old,
            assigned_at=at,
            sla_due_at=at + timedelta(minutes=45),
            touched_at=None,
        )
        why = rng.choice(({"reason": "sla_breached"}, {"manual": True}, {"crm": "hubspot"}, {}))
        event_record_for_assignment(
            type=EventType.REASSIGNED,
            assignment=new,
            at=at,
            data={"from": {"id": old.rep_id, "name": old.rep_name}, **why},
        )
    # After the fact: first touches, a lead retried into another status, a deletion.
    untouched = [a for a in made if a.touched_at is None]
    for assignment in untouched[: len(untouched) // 2]:
        Assignment.objects.filter(pk=assignment.pk).update(
            touched_at=assignment.assigned_at + timedelta(minutes=rng.uniform(0.5, 200))
        )
    for lead in Lead.objects.filter(status=LeadStatus.UNASSIGNED)[:3]:
        Lead.objects.filter(pk=lead.pk).update(status=LeadStatus.FAILED)
    lone = [a for a in made if not Assignment.objects.filter(supersedes=a).exists()]
    Assignment.objects.filter(pk=lone[0].pk).delete()
    return {"teams": teams, "reps": reps}


def _spans(now: datetime, zone: str) -> list[reports.Span]:
    found = []
    for window, bucket in (("30d", "6h"), ("30d", "1d"), ("90d", "1d"), ("90d", "6h")):
        w = reports.WINDOWS[window]
        span = reports.span_of(w, reports.BUCKETS[bucket], now, ZoneInfo(zone))
        assert span.rollup
        found.append(span)
    return found


COUNTS = ("assigned", "new", "reassigned_in", "sla_met", "sla_missed", "away")
PERCENTILES = {"tta_p50": 0.5, "tta_p95": 0.95, "ttft_p50": 0.5, "ttft_p95": 0.95}


def _counts(figures: reports.Figures) -> dict[str, int]:
    return {name: getattr(figures, name) for name in COUNTS}


def _durations(span: reports.Span, column: str | None, measure: str) -> dict[Any, list[float]]:
    """The exact durations of the window, in seconds, per group (Python over the raw rows)."""
    found: dict[Any, list[float]] = {}
    rows = Assignment.objects.filter(assigned_at__gte=span.start, assigned_at__lt=span.end)
    for assignment in rows.select_related("lead"):
        group = getattr(assignment, column) if column else None
        if measure == "tta" and assignment.kind in FIRST_ASSIGNMENT_KINDS:
            value = assignment.assigned_at - assignment.lead.received_at
        elif measure == "ttft" and assignment.touched_at is not None:
            value = assignment.touched_at - assignment.assigned_at
        else:
            continue
        found.setdefault(group, []).append(value.total_seconds())
    return found


def _check_percentiles(
    figures: reports.Figures, durations: dict[str, dict[Any, list[float]]], group: Any
) -> None:
    """The estimate lies in the bin of the exact lower-rank value (percentile_cont's)."""
    for name, fraction in PERCENTILES.items():
        values = sorted(durations[name[: name.index("_p")]].get(group, []))
        found = getattr(figures, name)
        if not values:
            assert found is None, name
            continue
        low = values[int(fraction * (len(values) - 1))]
        lo, hi = rollups.bin_bounds(rollups.duration_bin(low))
        assert lo - 1e-6 <= found.total_seconds() <= max(hi, lo) + 1e-6, (name, group, low)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("now", NOWS, ids=["autumn", "spring"])
def test_rollup_figures_equal_the_raw_rows(seed: int, now: datetime) -> None:
    company = _company(seed, now)
    team_ids = [company["teams"][0].pk]
    for zone in ZONES:
        for span in _spans(now, zone):
            raw = dataclasses.replace(span, rollup=False)
            where = (zone, span.start, span.bucket)
            assert reports.intake_counts(span) == reports.intake_counts(raw), where
            assert reports.routed_counts(span) == reports.routed_counts(raw), where
            assert reports.outcomes(span=span) == reports.outcomes(span=raw), where
            # The dashboard's: all three from one read of the slot rollup.
            assert reports.window_counts(span) == reports.WindowCounts(
                reports.intake_counts(raw), reports.routed_counts(raw), reports.outcomes(span=raw)
            ), where
            for scope in (None, team_ids):
                assert _counts(reports.totals(span=span, team_ids=scope)) == _counts(
                    reports.totals(span=raw, team_ids=scope)
                ), where
                teams = reports.team_rows(span=span, team_ids=scope)
                assert [(t.id, _counts(t.figures)) for t in teams] == [
                    (t.id, _counts(t.figures)) for t in reports.team_rows(span=raw, team_ids=scope)
                ], where
                reps = reports.rep_rows(span=span, team_ids=scope)
                assert [(r.id, _counts(r.figures)) for r in reps] == [
                    (r.id, _counts(r.figures)) for r in reports.rep_rows(span=raw, team_ids=scope)
                ], where
                assert reports.fairness(span=span, team_ids=scope) == reports.fairness(
                    span=raw, team_ids=scope
                ), where
                # The dashboard's: the counts of the one read of the rollups for the tables.
                initial = reports.window_tables(span=span, team_ids=scope).initial
                assert reports.fairness(
                    span=span, team_ids=scope, initial=initial
                ) == reports.fairness(span=raw, team_ids=scope), where
        # Percentiles, per rep and in total, on the 90-day window of this zone.
        span = _spans(now, zone)[2]
        by_rep = {m: _durations(span, "rep_id", m) for m in ("tta", "ttft")}
        for row in reports.rep_rows(span=span):
            _check_percentiles(row.figures, by_rep, row.id)
        total = {m: _durations(span, None, m) for m in ("tta", "ttft")}
        _check_percentiles(reports.totals(span=span), total, None)


def test_rollup_counts_equal_plain_sql() -> None:
    """Plain SQL over the raw rows, for the window's whole slots and days."""
    now = NOWS[0]
    _company(3, now, leads=80)
    span = _spans(now, "Asia/Kathmandu")[2]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM leads_lead WHERE received_at >= %s AND received_at < %s",
            [span.start, span.end],
        )
        assert reports.outcomes(span=span).received == cursor.fetchone()[0]
        cursor.execute(
            "SELECT COUNT(*), SUM(CASE WHEN kind = 'reassignment' THEN 1 ELSE 0 END)"
            " FROM routing_assignment WHERE assigned_at >= %s AND assigned_at < %s",
            [span.start, span.end],
        )
        assigned, reassigned = cursor.fetchone()
    total = reports.totals(span=span)
    assert (total.assigned, total.reassigned_in) == (assigned, reassigned)


def _rollup_rows() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    slots = sorted(
        (row["slot"], row["measure"], row["shard"], row["n"])
        for row in ReportSlot.objects.values()
        if row["n"]
    )
    days = sorted(
        tuple(row[c] for c in ("day", "team_key", "rep_id", *rollups.SUM_COLUMNS))
        for row in AssignmentDay.objects.values()
        if row["assigned"]
    )
    return slots, days


def test_backfill_rebuilds_what_the_triggers_kept() -> None:
    _company(4, NOWS[1], leads=60)
    kept = _rollup_rows()
    assert kept[0]
    assert kept[1]
    with transaction.atomic():
        rollups.rollups_rebuild(connection)
    assert _rollup_rows() == kept


def test_percentile_of_a_histogram_stays_in_its_bin() -> None:
    values = [0.2, 3.0, 3.1, 45.0, 46.0, 47.0, 3600.0, 86_400.0, 9e6]
    counts = [0] * rollups.BINS
    for value in values:
        counts[rollups.duration_bin(value)] += 1
    for fraction in (0.0, 0.5, 0.95, 1.0):
        exact = sorted(values)[int(fraction * (len(values) - 1))]
        found = rollups.histogram_percentile(counts, fraction)
        assert found is not None
        lo, hi = rollups.bin_bounds(rollups.duration_bin(exact))
        assert lo <= found.total_seconds() <= max(hi, lo)
    assert rollups.histogram_percentile([0] * rollups.BINS, 0.5) is None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_writers_on_the_same_rollup_rows_lose_no_count() -> None:
    """Two connections writing leads and assignments of the same rep, day and 15 minutes at
    once: every row counted (INSERT ... ON CONFLICT DO UPDATE SET n = n + excluded.n)."""
    rep = RepFactory()
    team = TeamFactory()
    at = datetime(2026, 11, 3, 10, 1, tzinfo=UTC)
    per_writer = 25
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            barrier.wait()
            for _ in range(per_writer):
                with transaction.atomic():
                    lead = LeadFactory(
                        status=LeadStatus.ASSIGNED, received_at=at, received_event=False
                    )
                    Assignment.objects.create(
                        lead=lead, rep=rep, team=team, assigned_at=at + timedelta(seconds=30)
                    )
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=write) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    day = AssignmentDay.objects.get(day=at.date(), team_key=team.pk, rep_id=rep.pk)
    in_histogram = sum(getattr(day, c) for c in rollups.TTA_COLUMNS)
    assert (day.assigned, day.first, in_histogram) == (2 * per_writer,) * 3
    received = ReportSlot.objects.filter(measure="lead:assigned").values_list("n", flat=True)
    assert sum(received) == 2 * per_writer


def _statement_pair_deadlocks() -> bool:
    """Two statements that take the same two counter rows, each in its rows' order, on real
    connections: a claim (received -> processing) of leads in shards 1 then 2, and a batch's
    outcomes (processing -> assigned) of leads in shards 2 then 1. A third connection holds
    the claim's second counter until the batch's statement is under way, so the two meet
    half-way. True if PostgreSQL cut one off as a deadlock."""
    import psycopg
    from psycopg import errors as pg_errors

    at = datetime(2026, 11, 3, 10, 1, tzinfo=UTC)
    # Leads in id order (the order the UPDATEs change them in); the shard is the id's last byte.
    claimed = [uuid.UUID(int=(1 << 124) + 1), uuid.UUID(int=(2 << 124) + 2)]  # shards 1, 2
    routed = [uuid.UUID(int=(3 << 124) + 2), uuid.UUID(int=(4 << 124) + 1)]  # shards 2, 1
    for lead_id in claimed:
        LeadFactory(id=lead_id, status=LeadStatus.RECEIVED, received_at=at, received_event=False)
    for lead_id in routed:
        LeadFactory(id=lead_id, status=LeadStatus.PROCESSING, received_at=at, received_event=False)
    settings = connection.settings_dict
    dsn = {
        "dbname": settings["NAME"],
        "host": settings["HOST"] or None,
        "port": settings["PORT"] or None,
        "user": settings["USER"] or None,
        "password": settings["PASSWORD"] or None,
    }

    def connect() -> Any:
        return psycopg.connect(**{k: v for k, v in dsn.items() if v is not None})

    holder, claim, batch = connect(), connect(), connect()
    try:
        for each in (claim, batch):
            each.execute("SET deadlock_timeout = '100ms'")
            each.execute("SET lock_timeout = '20s'")
        holder.execute(
            "SELECT n FROM audit_reportslot WHERE measure = 'lead:received' AND shard = 2 "
            "FOR UPDATE"
        )
        outcome: dict[str, BaseException | None] = {}

        def run(name: str, conn: Any, sql: str, ids: list[uuid.UUID]) -> None:
            try:
                conn.execute(sql, [ids])
                conn.commit()
                outcome[name] = None
            except BaseException as error:
                conn.rollback()
                outcome[name] = error

        def waiting(conn: Any) -> bool:
            row = holder.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                [conn.info.backend_pid],
            ).fetchone()
            return row is not None and row[0] == "Lock"

        def until(check: Any) -> None:
            deadline = time.monotonic() + 10
            while not check():
                assert time.monotonic() < deadline, "a statement did not get as far as expected"
                time.sleep(0.02)

        first = threading.Thread(
            target=run,
            args=(
                "claim",
                claim,
                "UPDATE leads_lead SET status = 'processing' WHERE id = ANY(%s)",
                claimed,
            ),
        )
        first.start()
        until(lambda: waiting(claim))
        second = threading.Thread(
            target=run,
            args=(
                "batch",
                batch,
                "UPDATE leads_lead SET status = 'assigned' WHERE id = ANY(%s)",
                routed,
            ),
        )
        second.start()
        until(lambda: waiting(batch) or "batch" in outcome)
        holder.rollback()
        first.join(30)
        second.join(30)
    finally:
        for each in (holder, claim, batch):
            each.close()
    failures = [error for error in outcome.values() if error is not None]
    assert all(isinstance(error, pg_errors.DeadlockDetected) for error in failures), failures
    return bool(failures)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_row_triggers_deadlocked_two_statements_and_the_statement_triggers_do_not() -> None:
    """Migration 0009's row-level triggers upserted each lead's counters in the order a
    statement changed its leads: a claim and a batch's outcomes on leads of the same shards
    in opposite orders deadlocked (CI: claims cut off, chunks failed). The statement-level
    triggers (migration 0010) sum a statement's changes and take the counter rows in key
    order: the same two statements wait for each other in turn, and every count is exact."""
    try:
        rollups.rollup_row_triggers_create(connection)
        assert _statement_pair_deadlocks()
    finally:
        rollups.rollup_triggers_create(connection)
    Lead.objects.all().delete()
    with transaction.atomic():
        rollups.rollups_rebuild(connection)
    assert not _statement_pair_deadlocks()
    statuses = dict(Lead.objects.values_list("id", "status"))
    assert sorted(statuses.values()) == ["assigned", "assigned", "processing", "processing"]
    kept = _rollup_rows()
    with transaction.atomic():
        rollups.rollups_rebuild(connection)
    assert _rollup_rows() == kept
