"""Reps' live state recorded: a history of every change of ``active`` and
``out_of_office_until``, and each rep's state at a past moment, for replays.

The state itself stays live (it is a fact about people, not part of a configuration version);
database triggers on ``routing_rep`` write a ``RepStateChange`` row for every insert and every
update of those two columns, in the writer's own transaction, whatever wrote (the rep's form, a
bulk action, an import, the roster API, raw SQL), so no path can forget to record. Planned
absences are their own history (``RepAbsence`` rows keep their from-to after they end); when one
that has begun is deleted or its dates changed, a trigger keeps the part that had happened
(``RepAbsencePast``).

``rep_states_at`` answers "how was this rep at moment t": the state after the last change at or
before t; before the first recorded change, the state that change replaced; with no change
recorded, the rep as they are now.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, time
from typing import Any

from django.db.models import F

from routing.engine.availability import holiday_at, zone_named
from routing.engine.strategies import within_working_hours
from routing.engine.types import WorkingHours


def _postgres() -> tuple[list[str], list[str]]:
    create = [
        """
        CREATE OR REPLACE FUNCTION routing_rep_state_record() RETURNS trigger AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                INSERT INTO routing_repstatechange (rep_id, at, was_active, was_out_of_office_until,
                                                  active, out_of_office_until)
                VALUES (NEW.id, clock_timestamp(), NEW.active, NEW.out_of_office_until,
                        NEW.active, NEW.out_of_office_until);
            ELSIF NEW.active IS DISTINCT FROM OLD.active
               OR NEW.out_of_office_until IS DISTINCT FROM OLD.out_of_office_until THEN
                INSERT INTO routing_repstatechange (rep_id, at, was_active, was_out_of_office_until,
                                                  active, out_of_office_until)
                VALUES (NEW.id, clock_timestamp(), OLD.active, OLD.out_of_office_until,
                        NEW.active, NEW.out_of_office_until);
            END IF;
            RETURN NULL;
        END;
        $$ LANGUAGE plpgsql
        """,
        "CREATE TRIGGER routing_rep_state_record AFTER INSERT OR UPDATE OF active, "
        "out_of_office_until ON routing_rep FOR EACH ROW "
        "EXECUTE FUNCTION routing_rep_state_record()",
    ]
    create += [
        """
        CREATE OR REPLACE FUNCTION routing_rep_absence_keep_past() RETURNS trigger AS $$
        BEGIN
            IF OLD.starts_at < clock_timestamp() AND (
                TG_OP = 'DELETE' OR NEW.starts_at IS DISTINCT FROM OLD.starts_at
                OR NEW.ends_at IS DISTINCT FROM OLD.ends_at OR NEW.rep_id <> OLD.rep_id
            ) THEN
                INSERT INTO routing_repabsencepast (rep_id, starts_at, ends_at, recorded_at)
                VALUES (OLD.rep_id, OLD.starts_at, LEAST(OLD.ends_at, clock_timestamp()),
                        clock_timestamp());
            END IF;
            RETURN NULL;
        END;
        $$ LANGUAGE plpgsql
        """,
        "CREATE TRIGGER routing_rep_absence_keep_past AFTER DELETE OR UPDATE ON "
        "routing_repabsence FOR EACH ROW EXECUTE FUNCTION routing_rep_absence_keep_past()",
    ]
    drop = [
        "DROP TRIGGER IF EXISTS routing_rep_state_record ON routing_rep",
        "DROP FUNCTION IF EXISTS routing_rep_state_record()",
        "DROP TRIGGER IF EXISTS routing_rep_absence_keep_past ON routing_repabsence",
        "DROP FUNCTION IF EXISTS routing_rep_absence_keep_past()",
    ]
    return create, drop


def _sqlite() -> tuple[list[str], list[str]]:
    insert = (
        "INSERT INTO routing_repstatechange (rep_id, at, was_active, was_out_of_office_until, "
        "active, out_of_office_until) VALUES (NEW.id, strftime('%Y-%m-%d %H:%M:%f', 'now'), "
    )
    create = [
        "CREATE TRIGGER IF NOT EXISTS routing_rep_state_record_0 AFTER INSERT ON routing_rep "
        "BEGIN "
        + insert
        + "NEW.active, NEW.out_of_office_until, NEW.active, NEW.out_of_office_until); END",
        "CREATE TRIGGER IF NOT EXISTS routing_rep_state_record_1 AFTER UPDATE OF active, "
        "out_of_office_until ON routing_rep WHEN NEW.active IS NOT OLD.active OR "
        "NEW.out_of_office_until IS NOT OLD.out_of_office_until BEGIN "
        + insert
        + "OLD.active, OLD.out_of_office_until, NEW.active, NEW.out_of_office_until); END",
    ]
    now = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    keep = (
        "INSERT INTO routing_repabsencepast (rep_id, starts_at, ends_at, recorded_at) "
        "VALUES (OLD.rep_id, OLD.starts_at, min(OLD.ends_at, " + now + "), " + now + "); END"
    )
    create += [
        "CREATE TRIGGER IF NOT EXISTS routing_rep_absence_keep_past_0 AFTER DELETE ON "
        "routing_repabsence WHEN OLD.starts_at < " + now + " BEGIN " + keep,
        "CREATE TRIGGER IF NOT EXISTS routing_rep_absence_keep_past_1 AFTER UPDATE OF "
        "starts_at, ends_at, rep_id ON routing_repabsence WHEN OLD.starts_at < " + now + " AND "
        "(NEW.starts_at IS NOT OLD.starts_at OR NEW.ends_at IS NOT OLD.ends_at OR "
        "NEW.rep_id IS NOT OLD.rep_id) BEGIN " + keep,
    ]
    drop = [
        "DROP TRIGGER IF EXISTS routing_rep_state_record_0",
        "DROP TRIGGER IF EXISTS routing_rep_state_record_1",
        "DROP TRIGGER IF EXISTS routing_rep_absence_keep_past_0",
        "DROP TRIGGER IF EXISTS routing_rep_absence_keep_past_1",
    ]
    return create, drop


def _statements(vendor: str, *, create: bool) -> list[str]:
    if vendor == "postgresql":
        made, dropped = _postgres()
    elif vendor == "sqlite":
        made, dropped = _sqlite()
    else:
        raise NotImplementedError(f"no rep state triggers for the {vendor} database")
    return made if create else dropped


def rep_state_triggers_create(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=True):
            cursor.execute(sql)


def rep_state_triggers_drop(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=False):
            cursor.execute(sql)


@dataclass(frozen=True, slots=True)
class PastState:
    """A rep's live state at a past moment."""

    active: bool
    out_of_office_until: datetime | None


class RepStateHistory:
    """Recorded changes of some reps, read once; ``at(rep_id, t)`` for each lead of a replay."""

    def __init__(self, rows: Iterable[tuple[int, datetime, bool, Any, bool, Any]]) -> None:
        self._times: dict[int, list[datetime]] = {}
        self._rows: dict[int, list[tuple[PastState, PastState]]] = {}
        for rep_id, at, was_active, was_until, active, until in rows:
            self._times.setdefault(rep_id, []).append(at)
            self._rows.setdefault(rep_id, []).append(
                (PastState(bool(was_active), was_until), PastState(bool(active), until))
            )

    @property
    def rep_ids(self) -> set[int]:
        return set(self._rows)

    def at(self, rep_id: int, moment: datetime) -> PastState | None:
        """The rep's state at ``moment``; None when no change of theirs was read (as now)."""
        times = self._times.get(rep_id)
        if not times:
            return None
        i = bisect.bisect_right(times, moment)
        rows = self._rows[rep_id]
        return rows[i - 1][1] if i else rows[0][0]


def rep_state_history(*, since: datetime) -> RepStateHistory:
    """The changes a replay of leads from ``since`` on needs: for each rep changed after
    ``since``, their changes from the last one at or before it (so the state at ``since`` is
    known too). Reps not changed since then were at every such moment as they are now."""
    from django.db.models import Max

    from routing.timeoff.models import RepStateChange

    changed = set(
        RepStateChange.objects.filter(at__gt=since).values_list("rep_id", flat=True).distinct()
    )
    if not changed:
        return RepStateHistory(())
    starts = dict(
        RepStateChange.objects.filter(rep_id__in=changed, at__lte=since)
        .values("rep_id")
        .annotate(last=Max("at"))
        .values_list("rep_id", "last")
    )
    rows = []
    for row in (
        RepStateChange.objects.filter(rep_id__in=changed)
        .order_by("rep_id", "at", "id")
        .values_list(
            "rep_id", "at", "was_active", "was_out_of_office_until", "active", "out_of_office_until"
        )
    ):
        start = starts.get(row[0])
        if start is None or row[1] >= start:
            rows.append(row)
    return RepStateHistory(rows)


class ReplayRepStates:
    """Each rep as they were when a replayed lead arrived, laid over a replay's snapshot.

    A replay decides every lead at one instant (now, a microsecond apart per lead) with today's
    loads and turns; only the reps' live state goes back in time. ``apply(reps, arrived, at)``
    sets, for the reps whose state or planned absences could differ at ``arrived``, their
    ``active`` and out-of-office state and absences as they were then, moved forward by
    ``at - arrived`` so the engine, asking at ``at``, sees them as they were at ``arrived``;
    it returns what it replaced, which ``restore`` puts back (keeping the load the decision
    added). Holidays and working hours are the replayed configuration's (a draft's calendars and
    hours, or the published ones), but asked *at* ``arrived``: whether the rep was on holiday,
    and inside their working hours, in their own zone when the lead arrived, laid over the
    decision instant (the holiday, if any, on ``at``'s local date; hours that hold at ``at`` or
    never), so a lead that came on Christmas Eve at 03:00 is replayed as it came, not as if it
    came at the moment of the replay.
    """

    def __init__(self, *, since: datetime | None) -> None:
        from routing.engine import Absence
        from routing.timeoff.models import RepAbsence, RepAbsencePast

        self.history = rep_state_history(since=since) if since is not None else None
        self.absences: dict[int, list[Absence]] = {}
        if since is not None:
            # The absences now, and the parts of deleted or changed ones that had happened.
            for model in (RepAbsence, RepAbsencePast):
                for rep_id, starts_at, ends_at in (
                    model.objects.filter(ends_at__gt=since, starts_at__lt=F("ends_at"))
                    .order_by("rep_id", "starts_at")
                    .values_list("rep_id", "starts_at", "ends_at")
                ):
                    self.absences.setdefault(rep_id, []).append(
                        Absence(starts_at=starts_at, ends_at=ends_at)
                    )
            for found in self.absences.values():
                found.sort(key=lambda absence: absence.starts_at)
        self.rep_ids = (self.history.rep_ids if self.history else set()) | set(self.absences)

    def apply(self, reps: dict[int, Any], arrived: datetime, at: datetime) -> dict[int, Any]:
        from dataclasses import replace

        from routing.engine import Absence

        shift = at - arrived
        replaced = {}
        for rep_id in self.rep_ids:
            rep = reps.get(rep_id)
            if rep is None:
                continue
            past = self.history.at(rep_id, arrived) if self.history else None
            active = past.active if past else rep.active
            until = past.out_of_office_until if past else rep.out_of_office_until
            absences = tuple(
                Absence(starts_at=a.starts_at + shift, ends_at=a.ends_at + shift)
                for a in self.absences.get(rep_id, ())
                if a.ends_at > arrived
            )
            replaced[rep_id] = rep
            reps[rep_id] = replace(
                rep,
                active=active,
                out_of_office_until=until + shift
                if until is not None and until > arrived
                else None,
                absences=absences,
            )
        for rep_id, rep in list(reps.items()):
            calendar = _calendar_at(rep, arrived, at)
            if calendar is not None:
                replaced.setdefault(rep_id, rep)
                reps[rep_id] = replace(
                    reps[rep_id], holidays=calendar[0], working_hours=calendar[1]
                )
        return replaced

    def restore(self, reps: dict[int, Any], replaced: dict[int, Any]) -> None:
        from dataclasses import replace

        for rep_id, rep in replaced.items():
            reps[rep_id] = replace(
                reps[rep_id],
                active=rep.active,
                out_of_office_until=rep.out_of_office_until,
                absences=rep.absences,
                holidays=rep.holidays,
                working_hours=rep.working_hours,
            )


# What a replay lays over a rep's working hours: hours that hold at any moment, or at none.
_ALWAYS = WorkingHours(days=frozenset(range(1, 8)), start=time(0), end=time(0))
_NEVER = WorkingHours(days=frozenset(), start=time(0), end=time(0))


def _calendar_at(rep: Any, arrived: datetime, at: datetime) -> tuple[Any, Any] | None:
    """The rep's holidays and working hours as asking at ``at`` must see them to answer as
    asking at ``arrived`` would: ``({at's local date: the holiday of arrived's}, hours that
    hold at at, or never)``; None when both moments get the same answers already, the rep has
    neither, or an unknown zone (the engine answers for that itself)."""
    if not rep.holidays and rep.working_hours is None:
        return None
    zone = zone_named(rep.timezone)
    if zone is None:
        return None
    holiday = holiday_at(rep, arrived)
    hours = rep.working_hours
    worked = hours is not None and within_working_hours(hours, arrived.astimezone(zone))
    if holiday == holiday_at(rep, at) and (
        hours is None or worked == within_working_hours(hours, at.astimezone(zone))
    ):
        return None  # the same answers at both moments: nothing to lay over (and no copy)
    holidays = {at.astimezone(zone).date(): holiday} if holiday is not None else {}
    if hours is not None:
        hours = _ALWAYS if worked else _NEVER
    return holidays, hours
