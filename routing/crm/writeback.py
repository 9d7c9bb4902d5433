"""Owner write-back: each assignment's owner written to the CRM, through the delivery outbox.

``deliveries_schedule`` writes one ``crm`` delivery per active connection with write-back on,
in the assignment's transaction; ``delivery_attempt`` calls ``crm_write_owner`` for it, outside
any transaction, with the outbox's retries, backoff, dead letters and admin retry. This module
only decides what to send and what came of it:

- the owner is the rep's CRM owner id from the roster (``CrmOwner``); a rep without one is a
  retryable failure that names the fix (sync the roster, or link the owner in the admin);
- the person is the one the lookup found (or wrote before), else found by e-mail, else created
  (``write_owner`` makes a repeat find what the first try created: one effect per assignment;
  in Salesforce a Lead converted since is written on its Contact, and a create a duplicate rule
  blocks on the record the rule matched);
- an assignment that is no longer the lead's current one is not written (the later one is),
  checked again right before the request that writes (``before_write``);
- one write-back per (lead, connection) at a time (``writeback_lock``: a PostgreSQL advisory
  lock held through the send, released by the database if the worker dies), so a
  reassignment's write and a stale retry of the one before it cannot cross; the second waits,
  deferred (not an attempt), and then finds its assignment superseded or the first one's
  write remembered;
- an owner set in the CRM is never overwritten: the person's current owner is read right
  before the write, and when it is neither the one being written nor the one LeadRouter knew
  (last wrote, else the lookup found) nothing is written (``kept``). When LeadRouter knew an
  owner, the owner moved away from it: a real owner change made in the CRM, recorded as a
  reassignment made there (``routing.crm.touches.crm_owner_changed``); when it knew none (the
  lookup failed, timed out or found nobody, and the person has an owner), it is the owner the
  CRM already had, recorded as such (``found=True``, outcome ``owned``): the lead goes to that
  owner's rep, or is noted as worked outside LeadRouter. Another edit of the record
  (Salesforce's LastModifiedDate moves on any) is no owner change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction
from django.db import connection as db_connection

from leads.models import Lead
from routing.crm.base import CrmError, PersonUpdate
from routing.crm.connections import crm_client
from routing.crm.facts import crm_label
from routing.crm.health import crm_record_error, crm_record_ok
from routing.crm.limits import WRITE_REQUESTS, crm_pause, spender
from routing.crm.models import CrmConnection, CrmOwner
from routing.crm.roster import rep_owner_id
from routing.timeoff.availability import rep_unavailable_reason

logger = logging.getLogger(__name__)

_CREATE_FIELDS = ("email", "first_name", "last_name", "company", "phone", "title", "country")

# A write-back that finds another one of the same lead and connection in flight tries again
# after about this long (deferred: not an attempt).
LOCK_BUSY_RETRY_SECONDS = 1.0

_held: set[str] = set()  # the keys held in this process (databases without advisory locks)
_held_lock = threading.Lock()


@contextmanager
def writeback_lock(*, lead_id: Any, connection_id: int) -> Iterator[bool]:
    """Hold the write-back of ``lead_id`` to connection ``connection_id``; yields False (held
    by someone else, nothing waits) or True.

    PostgreSQL: a session advisory lock (``pg_try_advisory_lock``) on the worker's connection,
    held through the HTTP requests outside any transaction; a worker that dies mid-send loses
    its session and with it the lock. Other databases (SQLite, development with one worker):
    a lock within this process.
    """
    key = f"leadrouter:crm-writeback:{connection_id}:{lead_id}"
    if db_connection.vendor != "postgresql":
        with _held_lock:
            got = key not in _held
            _held.add(key)
        try:
            yield got
        finally:
            if got:
                with _held_lock:
                    _held.discard(key)
        return
    with db_connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", [key])
        row = cursor.fetchone()
    got = bool(row and row[0])
    try:
        yield got
    finally:
        if got:
            try:
                with db_connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [key])
            except DatabaseError as exc:  # the session is gone, and its lock with it
                logger.warning("CRM write-back lock release failed (%s)", exc)


class _Superseded(Exception):
    """The assignment stopped being the lead's current one while its owner was being written."""


@dataclass(frozen=True)
class WriteOutcome:
    """What one write-back attempt came to, for the outbox.

    ``outcome``: ``delivered`` (written, or nothing to write), ``retry`` (try again later,
    after ``retry_after`` seconds at least), ``deferred`` (waited for our own rate limit: not an
    attempt), ``failed`` (retrying will not help), ``cancelled`` (no longer wanted).
    """

    outcome: str
    error: str = ""
    excerpt: str = ""
    retry_after: float | None = None


def _entry(lead: Lead, kind: str) -> dict[str, Any]:
    record = lead.crm if isinstance(lead.crm, dict) else {}
    entry = record.get(kind)
    return entry if isinstance(entry, dict) else {}


def _known_person(entry: dict[str, Any]) -> tuple[str, str, str]:
    """(object, id, owner id we know of) from what we wrote before, else what the lookup found."""
    for key in ("written", "person"):
        value = entry.get(key)
        if isinstance(value, dict) and value.get("id"):
            owner = str(value.get("owner_id") or "")
            return str(value.get("object") or ""), str(value["id"]), owner
    return "", "", ""


def _remember(lead_id: Any, kind: str, written: dict[str, Any]) -> None:
    """Keep what was written on the lead (the next write-back updates the same person)."""
    with transaction.atomic():
        lead = Lead.objects.select_for_update(no_key=True).filter(pk=lead_id).first()
        if lead is None:
            return
        record = dict(lead.crm) if isinstance(lead.crm, dict) else {}
        entry = dict(record.get(kind) or {}) if isinstance(record.get(kind), dict) else {}
        entry["written"] = written
        record[kind] = entry
        lead.crm = record
        lead.save(update_fields=["crm"])


def _owner_is_no_eligible_rep(kind: str, owner_id: str, now: datetime) -> bool:
    """Is ``owner_id`` a rep the lookup would pass over (inactive, out of office, on leave, on
    a holiday, or the CRM user deactivated)? An owner who is no rep at all is not: the lead is
    worked outside."""
    row = (
        CrmOwner.objects.filter(kind=kind, owner_id=owner_id, rep__isnull=False)
        .only("rep_id", "active_in_crm")
        .first()
    )
    if row is None or row.rep_id is None:
        return False
    if not row.active_in_crm:
        return True
    return rep_unavailable_reason(rep_id=row.rep_id, now=now) is not None


def crm_write_owner(*, delivery: Any, now: datetime) -> WriteOutcome:
    """Write the owner of ``delivery.assignment`` to ``delivery.crm_connection``."""
    from routing.models import Assignment

    connection: CrmConnection | None = delivery.crm_connection
    if connection is None or not connection.active or not connection.writeback_enabled:
        return WriteOutcome("cancelled", error="the CRM connection is inactive or write-back off")
    lead_id = (
        Assignment.objects.filter(pk=delivery.assignment_id)
        .values_list("lead_id", flat=True)
        .first()
    )
    if lead_id is None:
        return WriteOutcome("failed", error="the assignment no longer exists")
    with writeback_lock(lead_id=lead_id, connection_id=connection.pk) as held:
        if not held:
            return WriteOutcome(
                "deferred",
                error="another write-back of this lead is in flight",
                retry_after=LOCK_BUSY_RETRY_SECONDS,
            )
        return _write_owner(connection, delivery.assignment_id, now)


def _write_owner(connection: CrmConnection, assignment_id: int, now: datetime) -> WriteOutcome:
    """The write itself, under the lead's write-back lock: everything read here is fresh."""
    from routing.models import Assignment

    assignment = Assignment.objects.select_related("lead", "rep").filter(pk=assignment_id).first()
    if assignment is None:
        return WriteOutcome("failed", error="the assignment no longer exists")
    if not assignment.active:
        return WriteOutcome(
            "cancelled", error="superseded by a later assignment (that one is written instead)"
        )
    label = crm_label(connection.kind)
    owner_id = rep_owner_id(connection.kind, assignment.rep_id)
    if not owner_id:
        return WriteOutcome(
            "retry",
            error=f"{assignment.rep.email} has no {label} owner id: sync the roster "
            f"(Admin → CRM connections) or link the owner to the rep",
        )
    lead = assignment.lead
    entry = _entry(lead, connection.kind)
    # The owner the CRM shows if nobody changed it there: the one we last wrote (or kept), else
    # the one the lookup found. Not the superseded assignment's rep: its write may never have
    # happened (cancelled when superseded), and the CRM would still show the lookup's owner.
    person_object, person_id, known_owner = _known_person(entry)
    fields = {name: getattr(lead, name) for name in _CREATE_FIELDS if getattr(lead, name, "")}
    earlier_reps = (
        Assignment.objects.filter(lead_id=lead.pk)
        .exclude(pk=assignment.pk)
        .values_list("rep_id", flat=True)
    )
    earlier_owners = CrmOwner.objects.filter(kind=connection.kind, rep_id__in=earlier_reps)
    update = PersonUpdate(
        owner_id=owner_id,
        email=lead.email,
        person_id=person_id,
        person_object=person_object,
        external_id=str(lead.pk),
        fields=fields,
        earlier_owner_ids=tuple(
            sorted(set(earlier_owners.values_list("owner_id", flat=True)) - {owner_id})
        ),
    )
    if not person_id and not lead.email:
        return WriteOutcome(
            "failed", error=f"the lead has no e-mail and no {label} record to write the owner to"
        )
    try:
        reserve = WRITE_REQUESTS.get(connection.kind, 2)
        client = crm_client(connection, spend=spender(connection, reserve=reserve, lane=lead.lane))

        def still_current() -> None:
            if not Assignment.objects.filter(pk=assignment_id, active=True).exists():
                raise _Superseded

        result = client.write_owner(update, known_owner_id=known_owner, before_write=still_current)
        if (
            result.outcome == "kept"
            and not known_owner
            and (
                not connection.honour_crm_owner
                or _owner_is_no_eligible_rep(connection.kind, result.person.owner_id, now)
            )
        ):
            # The owner LeadRouter had not seen is not to be followed (the connection does not
            # honour CRM owners) or is a rep who could not take the lead (inactive, away,
            # deactivated in the CRM): replaced by the rules' rep, as it is when the
            # lookup sees it, not given the lead.
            known_owner = result.person.owner_id
            result = client.write_owner(
                update, known_owner_id=known_owner, before_write=still_current
            )
    except _Superseded:
        return WriteOutcome(
            "cancelled",
            error="superseded by a later assignment while its owner was being written "
            "(nothing written: the later one is written instead)",
        )
    except CrmError as exc:
        crm_record_error(connection, exc, lead_id=lead.pk)
        if exc.kind == "rate_limited":
            if exc.status is None:
                return WriteOutcome("deferred", error=str(exc), retry_after=exc.retry_after or 1.0)
            if exc.retry_after:
                crm_pause(connection, exc.retry_after)
            return WriteOutcome("retry", error=str(exc), retry_after=exc.retry_after)
        if exc.kind == "rejected":
            return WriteOutcome("failed", error=str(exc))
        return WriteOutcome("retry", error=str(exc))
    except Exception as exc:  # a module's bug: retried, visible in the outbox
        logger.exception(
            "CRM write-back of lead %s raised", lead.pk, extra={"lead_id": str(lead.pk)}
        )
        return WriteOutcome("retry", error=f"{type(exc).__name__}: {str(exc)[:300]}")
    crm_record_ok(connection, now=now)
    person = result.person
    if result.outcome == "kept":
        from routing.crm.touches import crm_owner_changed

        # A real owner change only when the owner moved away from one LeadRouter knew (wrote,
        # or saw at lookup); without one, the person had an owner LeadRouter never saw (the
        # lookup failed, timed out or found nobody) and nothing changed at all.
        changed = bool(known_owner)
        crm_owner_changed(
            lead_id=lead.pk,
            kind=connection.kind,
            owner_id=person.owner_id,
            changed_at=(person.owner_changed_at or now) if changed else now,
            assignment_id=assignment.pk,
            found=not changed,
        )
        _remember(
            lead.pk,
            connection.kind,
            {**person.to_json(), "at": now.isoformat(), "outcome": "kept" if changed else "owned"},
        )
        if changed:
            excerpt = (
                f"kept: the owner in {label} changed from {known_owner} to {person.owner_id}; "
                "not overwritten"
            )
        else:
            excerpt = (
                f"kept: {person.object} {person.id} is already owned in {label} by "
                f"{person.owner_id}, an owner LeadRouter had not seen; not overwritten"
            )
        return WriteOutcome("delivered", excerpt=excerpt)
    _remember(
        lead.pk,
        connection.kind,
        {
            **person.to_json(),
            "owner_id": owner_id,
            "at": now.isoformat(),
            "outcome": result.outcome,
        },
    )
    return WriteOutcome(
        "delivered", excerpt=f"{result.outcome} {person.object} {person.id} owner {owner_id}"
    )
