"""Whether reps can take a lead now, outside a routing decision: the one place that asks.

The CRM paths (an owner found by the lookup, one found at write-back, an owner changed in the
CRM, a replay of the CRM owner) and the re-routing of away reps all ask here, and here asks the
engine's ``rep_is_eligible`` with each rep's absences and holidays: inactive, out of office, on
leave, a holiday in the rep's time zone. Caps and working hours are not part of it (a CRM owner
keeps their person whatever their load or the hour, as before).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from django.utils import timezone

from routing.engine import RepState, rep_is_eligible
from routing.models import Rep, TeamMembership
from routing.timeoff.facts import time_off_facts

__all__ = ["rep_states", "rep_unavailable_reason", "reps_available"]


def rep_states(*, rep_ids: Iterable[int], now: datetime) -> dict[int, RepState]:
    """The reps among ``rep_ids`` as the engine sees them for availability (no loads)."""
    ids = set(rep_ids)
    if not ids:
        return {}
    members: dict[int, list[int]] = {}
    for team_id, rep_id in TeamMembership.objects.filter(rep_id__in=ids).values_list(
        "team_id", "rep_id"
    ):
        members.setdefault(team_id, []).append(rep_id)
    off = time_off_facts(now=now, team_members=members)
    states = {}
    for row in Rep.objects.filter(pk__in=ids).values(
        "id", "email", "name", "active", "out_of_office_until", "timezone"
    ):
        facts = off.get(row["id"])
        states[row["id"]] = RepState(
            id=row["id"],
            email=row["email"],
            name=row["name"],
            active=row["active"],
            out_of_office_until=row["out_of_office_until"],
            timezone=row["timezone"] or "UTC",
            absences=facts.absences if facts else (),
            holidays=facts.holidays if facts else {},
        )
    return states


def rep_unavailable_reason(
    *, rep_id: int, now: datetime, reps: Mapping[int, RepState] | None = None
) -> str | None:
    """Why the rep cannot take a lead at ``now`` ("inactive", "on leave until ...", "public
    holiday: ..."), or None when they can. From ``reps`` when given (a replay's snapshot),
    else from the database; a rep that is not there "is no rep any more"."""
    states = reps if reps is not None else rep_states(rep_ids=[rep_id], now=now)
    state = states.get(rep_id)
    if state is None:
        return "no rep any more"
    eligible, why = rep_is_eligible(state, None, now, ignore_caps=True)
    return None if eligible else why


def reps_available(*, rep_ids: Iterable[int], now: datetime | None = None) -> set[int]:
    """The reps among ``rep_ids`` who may take a lead at ``now``, caps aside."""
    now = now or timezone.now()
    states = rep_states(rep_ids=rep_ids, now=now)
    return {
        rep_id
        for rep_id, state in states.items()
        if rep_is_eligible(state, None, now, ignore_caps=True)[0]
    }
