"""First touch and owner changes read from the CRM, so reps who never open LeadRouter count.

``crm_touches_sync(connection)`` (beat, every ``CRM_TOUCHES_INTERVAL_SECONDS``) takes a batch of
current, untouched assignments made in the last ``CRM_TOUCHES_LOOKBACK_DAYS`` whose person the
CRM knows (found by the lookup or written by write-back), reads their activity in batches of
``ACTIVITY_BATCH`` at the connection's pace, and:

- records the first touch the CRM reports after the assignment (``touch_source`` = the CRM's
  kind, at the CRM's time), so SLAs, caps and least-loaded work for reps who work in the CRM; a
  status changed from the one seen at lookup or write-back counts too, from when it is seen;
- records an owner changed in the CRM after our assignment as a reassignment made in the CRM
  (``crm_owner_changed``): to the rep that owner maps to, or, when the new owner is nobody in
  LeadRouter, as an event that closes the SLA clock (the lead is being worked elsewhere).

A cursor (``touches_cursor``, the assigned time reached) walks the candidates oldest first and
wraps, so every untouched assignment is read once per cycle however many there are.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.models import EventType
from audit.services import event_record, event_record_for_assignment
from leads.models import Lead
from routing.crm.base import ACTIVITY_BATCH, Activity, CrmError
from routing.crm.connections import crm_client
from routing.crm.facts import crm_label
from routing.crm.health import crm_record_error, crm_record_ok
from routing.crm.limits import spender
from routing.crm.models import CrmConnection
from routing.crm.roster import owner_reps, rep_owner_id

logger = logging.getLogger(__name__)


@dataclass
class TouchReport:
    """What one sync did."""

    read: int = 0
    touched: int = 0
    reassigned: int = 0

    def to_json(self) -> dict[str, int]:
        return {"read": self.read, "touched": self.touched, "reassigned": self.reassigned}


def _person_of(crm: Any, kind: str) -> tuple[str, str, str, str | None] | None:
    """(object, id, owner id we wrote or "", status last seen or None) of the lead's person in
    ``kind``, when known."""
    record = crm if isinstance(crm, dict) else {}
    entry = record.get(kind)
    if not isinstance(entry, dict):
        return None
    seen = entry.get("status_seen")
    written = entry.get("written")
    if isinstance(written, dict) and written.get("id"):
        kept = written.get("outcome") in ("kept", "owned")
        ours = "" if kept else str(written.get("owner_id") or "")
        status = seen if isinstance(seen, str) else _status(written)
        return str(written.get("object") or ""), str(written["id"]), ours, status
    person = entry.get("person")
    if isinstance(person, dict) and person.get("id"):
        status = seen if isinstance(seen, str) else _status(person)
        return str(person.get("object") or ""), str(person["id"]), "", status
    return None


def _status(record: dict[str, Any]) -> str | None:
    """The status seen at lookup or write-back; None when not known (a record just created
    reports none: the CRM fills in its default, which the first read then records)."""
    value = record.get("status")
    return value if isinstance(value, str) and value else None


def _status_remember(lead_id: Any, kind: str, status: str) -> None:
    """The status the first read found, as the baseline a later change is measured from."""
    with transaction.atomic():
        lead = Lead.objects.select_for_update(no_key=True).filter(pk=lead_id).first()
        if lead is None:
            return
        record = dict(lead.crm) if isinstance(lead.crm, dict) else {}
        entry = record.get(kind)
        if not isinstance(entry, dict):
            return
        record[kind] = {**entry, "status_seen": status}
        lead.crm = record
        lead.save(update_fields=["crm"])


def assignment_touch_from_crm(
    *, assignment_id: int, kind: str, at: datetime, touch_kind: str = ""
) -> bool:
    """Record a first touch the CRM reported (idempotent); True when this call recorded it."""
    from routing.decisions import assignment_first_touch
    from routing.models import Assignment

    now = timezone.now()
    at = min(at, now)
    with transaction.atomic():
        assignment = (
            Assignment.objects.select_for_update(no_key=True)
            .select_related("rep")
            .filter(pk=assignment_id, active=True, touched_at__isnull=True)
            .first()
        )
        if assignment is None:
            return False
        at = max(at, assignment.assigned_at)
        if not assignment_first_touch(assignment=assignment, at=at, source=kind):
            return False
        late = assignment.sla_due_at is not None and at > assignment.sla_due_at
        event_record_for_assignment(
            type=EventType.TOUCHED,
            assignment=assignment,
            actor=f"crm:{kind}",
            at=now,
            data={
                "sla_met": not late if assignment.sla_due_at is not None else None,
                "source": kind,
                "touched_at": at.isoformat(),
                "reason": f"first touch in {crm_label(kind)}"
                + (f" ({touch_kind})" if touch_kind else ""),
            },
        )
    return True


def crm_owner_changed(
    *,
    lead_id: Any,
    kind: str,
    owner_id: str,
    changed_at: datetime,
    assignment_id: int,
    found: bool = False,
) -> str:
    """The CRM gave the lead's person another owner after our assignment: record it.

    To a rep: a reassignment made in the CRM (no write-back: the CRM has it; webhooks and the
    rep's e-mail go out as for any reassignment). To an owner who is no rep: an event, and the
    assignment's SLA clock stops (touched, source the CRM). Returns ``reassigned``, ``noted``
    or ``unchanged`` (the lead moved on meanwhile, or the owner is already ours).
    ``found``: not a change but the owner the person already had, which write-back found and
    the lookup had not seen (it failed, timed out or found nobody); recorded the same way, said
    as such.
    """
    from routing.decisions import assignment_create, assignment_first_touch, decide_locked
    from routing.delivery.services import deliveries_schedule
    from routing.models import Assignment, AssignmentKind, TeamMembership

    label = crm_label(kind)
    now = timezone.now()
    with transaction.atomic():
        # Under the decide lock shared, like every path that assigns a lead: the reassignment
        # reads the reps' state and the teams' members of one configuration version, never
        # half a publish's (routing.decisions.decide_locked).
        lead = decide_locked(Lead.objects.select_for_update(no_key=True).filter(pk=lead_id)).first()
        if lead is None:
            return "unchanged"
        current = Assignment.objects.filter(lead=lead, active=True).select_related("rep").first()
        if current is None or current.pk != assignment_id:
            return "unchanged"
        if owner_id and owner_id == rep_owner_id(kind, current.rep_id):
            return "unchanged"
        mapped = owner_reps(kind, [owner_id]).get(owner_id) if owner_id else None
        # A rep who could not take a lead (inactive, away, CRM user deactivated) is
        # recorded as an owner who is no rep: the lead is worked outside LeadRouter's reps.
        unable = _why_not_eligible(mapped, now) if mapped is not None else ""
        if (
            mapped is not None
            and mapped.rep_id is not None
            and mapped.rep_id != current.rep_id
            and not unable
        ):
            membership = (
                TeamMembership.objects.filter(rep_id=mapped.rep_id)
                .select_related("team")
                .order_by("team_id")
            )
            in_team = (
                membership.filter(team_id=current.team_id).first()
                if current.team_id is not None
                else None
            ) or membership.first()
            team = in_team.team if in_team is not None else None
            assignment = assignment_create(
                lead=lead,
                rep_id=mapped.rep_id,
                rep_name=mapped.rep_name,
                team_id=team.pk if team is not None else None,
                team_name=team.name if team is not None else "",
                kind=AssignmentKind.REASSIGNMENT,
                supersede=current,
                reason=(
                    f"already owned in {label} by {mapped.rep_name} (found at write-back)"
                    if found
                    else f"reassigned in {label} to {mapped.rep_name}"
                ),
                sla_minutes=current.sla_minutes,
                now=now,
            )
            event_record_for_assignment(
                type=EventType.REASSIGNED,
                assignment=assignment,
                actor=f"crm:{kind}",
                at=now,
                data={
                    "manual": False,
                    "crm": kind,
                    "reason": (
                        f"already owned in {label} by {mapped.rep_name}: found when the owner "
                        "was written back (the lookup had not seen it); not overwritten"
                        if found
                        else f"reassigned in {label} (changed {changed_at.isoformat()})"
                    ),
                    "from": {"id": current.rep_id, "name": current.rep_name},
                },
            )
            deliveries_schedule(assignment=assignment, event=EventType.REASSIGNED, crm=False)
            return "reassigned"
        who = (mapped.owner_email if mapped is not None else "") or owner_id or "nobody"
        no_rep = (
            f"who is {mapped.rep_name}, a rep who cannot take leads ({unable})"
            if mapped is not None and unable
            else "who is no rep"
        )
        event_record(
            type=EventType.REASSIGNED,
            lead=lead,
            actor=f"crm:{kind}",
            at=now,
            data={
                "manual": False,
                "crm": kind,
                "reason": (
                    f"already owned in {label} by {who}, {no_rep}: found when the owner "
                    "was written back (the lookup had not seen it); not overwritten, "
                    "the lead is worked outside LeadRouter's reps"
                    if found
                    else f"owner changed in {label} to {who}, {no_rep}; "
                    "the lead is worked outside LeadRouter's reps"
                ),
                "from": {"id": current.rep_id, "name": current.rep_name},
                "to_owner": owner_id,
            },
        )
        if current.touched_at is None:
            assignment_first_touch(
                assignment=current,
                at=max(current.assigned_at, min(changed_at, now)),
                source=kind,
            )
        return "noted"


def _why_not_eligible(mapped: Any, now: datetime) -> str:
    """Why the owner's rep could not take a lead ("" when it could, or the owner is no rep):
    inactive, out of office, on leave, a holiday, or their CRM user deactivated."""
    from routing.timeoff.availability import rep_unavailable_reason

    if mapped.rep_id is None:
        return ""
    why = rep_unavailable_reason(rep_id=mapped.rep_id, now=now)
    if why is not None:
        return why
    if not mapped.active_in_crm:
        return "deactivated in the CRM"
    return ""


def _candidates(connection: CrmConnection, now: datetime, limit: int) -> list[Any]:
    from routing.models import Assignment

    lookback = now - timedelta(days=settings.CRM_TOUCHES_LOOKBACK_DAYS)
    start = max(lookback, connection.touches_cursor) if connection.touches_cursor else lookback
    return list(
        Assignment.objects.filter(active=True, touched_at__isnull=True, assigned_at__gt=start)
        .select_related("lead")
        .only("id", "assigned_at", "rep_id", "lead__id", "lead__crm")
        .order_by("assigned_at", "id")[:limit]
    )


def crm_touches_sync(connection: CrmConnection, *, now: datetime | None = None) -> TouchReport:
    """One batch of first touches and owner changes from ``connection`` (CrmError on failure)."""
    now = now or timezone.now()
    batch = settings.CRM_TOUCHES_BATCH_SIZE
    rows = _candidates(connection, now, batch)
    report = TouchReport()
    wanted: dict[tuple[str, str], list[tuple[Any, str, str | None]]] = {}
    for row in rows:
        person = _person_of(row.lead.crm, connection.kind)
        if person is not None:
            wanted.setdefault((person[0], person[1]), []).append((row, person[2], person[3]))
    client = crm_client(
        connection,
        spend=spender(connection, wait_seconds=settings.CRM_TOUCHES_INTERVAL_SECONDS / 2),
    )
    people = list(wanted)
    for start in range(0, len(people), ACTIVITY_BATCH):
        chunk = people[start : start + ACTIVITY_BATCH]
        # Each person from its own assignment: a previous rep's activity must not hide the
        # first touch after this one.
        own = {key[1]: min(row.assigned_at for row, _, _ in wanted[key]) for key in chunk}
        since = min(own.values())
        try:
            found = client.activity(chunk, since, own)
        except CrmError as exc:
            crm_record_error(connection, exc)
            raise
        crm_record_ok(connection)
        report.read += len(chunk)
        by_id = {activity.person_id: activity for activity in found}
        for obj, person_id in chunk:
            activity = by_id.get(person_id)
            if activity is None:
                continue
            for row, ours, seen_status in wanted[(obj, person_id)]:
                _apply(connection, row, activity, ours, seen_status, report)
    # Wrap when the batch was not full: the next cycle starts from the oldest again.
    cursor = rows[-1].assigned_at if len(rows) >= batch else None
    CrmConnection.objects.filter(pk=connection.pk).update(touches_cursor=cursor)
    return report


def _apply(
    connection: CrmConnection,
    row: Any,
    activity: Activity,
    ours: str,
    seen_status: str | None,
    report: TouchReport,
) -> None:
    kind = connection.kind
    rep_owner = rep_owner_id(kind, row.rep_id)
    owner = activity.owner_id
    changed_after = activity.owner_changed_at is not None and (
        activity.owner_changed_at > row.assigned_at
    )
    # Only a change we can tell is the CRM's: after our assignment (the CRM says when), or away
    # from the owner our write-back set. Before our write-back lands the CRM still shows the old
    # owner, which is no change at all.
    moved = (
        bool(owner)
        and owner != rep_owner
        and (changed_after or (bool(ours) and ours == rep_owner and owner != ours))
    )
    if moved:
        changed_at = activity.owner_changed_at or timezone.now()
        outcome = crm_owner_changed(
            lead_id=row.lead_id,
            kind=kind,
            owner_id=owner,
            changed_at=changed_at,
            assignment_id=row.pk,
        )
        if outcome != "unchanged":
            report.reassigned += 1
            return
    touched, touch_kind = activity.touched_at, activity.touch_kind
    if seen_status is None:
        # The first read is the baseline, an empty status too (a HubSpot contact has no lead
        # status until a rep sets one: setting it is then a change).
        _status_remember(row.lead_id, kind, activity.status or "")
    elif touched is None and _status_moved(seen_status, activity.status):
        # A status the rep changed (HubSpot lead status, a Salesforce Lead's Status): neither CRM
        # says when without field history, so it counts from when this job first saw it.
        touched, touch_kind = (
            timezone.now(),
            f"status {seen_status or '(none)'} → {activity.status}",
        )
    if (
        touched is not None
        and touched >= row.assigned_at
        and assignment_touch_from_crm(
            assignment_id=row.pk, kind=kind, at=touched, touch_kind=touch_kind
        )
    ):
        report.touched += 1


def _status_moved(seen: str | None, now: str) -> bool:
    """A status that changed from the one seen at lookup or write-back (None: never seen)."""
    return seen is not None and bool(now) and now != seen


def crm_touches_run(*, connections: Sequence[CrmConnection] | None = None) -> dict[str, Any]:
    """The beat job: every active connection with first touch on, one batch each."""
    done: dict[str, Any] = {}
    rows = (
        connections
        if connections is not None
        else list(CrmConnection.objects.filter(active=True, touches_enabled=True).order_by("id"))
    )
    for connection in rows:
        try:
            done[connection.name] = crm_touches_sync(connection).to_json()
        except CrmError as exc:
            done[connection.name] = f"failed: {exc}"
            logger.warning("CRM first-touch sync of %s failed: %s", connection.name, exc)
    return done
