"""Write services of the routing app, including the worker pipeline."""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError as DBError
from django.db import transaction
from django.db.models import Case, F, Q, When
from django.utils import timezone

from audit.models import EventType
from audit.services import event_record, event_record_for_assignment
from config.logging import log_context, log_context_add
from leads import privacy
from leads.models import EnrichmentStatus, Lead, LeadStatus
from leads.services import (
    BACK_FROM_ENRICHMENT,
    lead_apply_normalization,
    lead_enqueue_later,
    lead_erased_close,
    leads_enqueue,
    leads_enqueue_after_commit,
    realtime_peek,
)
from leads.status_wake import lead_status_announce
from routing.crm.facts import CrmOwnerFound, crm_person_owner, crm_trace_notes
from routing.crm.lookup import crm_lookup_wanted, crm_park
from routing.decisions import (
    RouteResult,
    RoutingContention,
    assignment_create,
    assignment_first_touch,
    decide_locked,
    route_lead,
    stored_trace,
)
from routing.dedup import lead_dedup
from routing.delivery.services import deliveries_schedule
from routing.engine import Decision
from routing.enrichment import (
    enrichment_builtin,
    enrichment_enqueue_after_commit,
    enrichment_event_data,
    enrichment_http_wanted,
    enrichment_trace_note,
)
from routing.erasure import reason_redact
from routing.fetch.meta import lead_meta_fetch_park, lead_meta_fetch_wanted
from routing.models import (
    Assignment,
    AssignmentKind,
    QueueHeartbeat,
    Rep,
    TeamMembership,
    TouchSource,
)
from routing.timeoff.availability import rep_unavailable_reason

logger = logging.getLogger(__name__)


@transaction.atomic
def heartbeat_record(*, queue: str, worker: str) -> QueueHeartbeat:
    """Record that ``worker`` just executed a heartbeat taken from ``queue``."""
    heartbeat, _ = QueueHeartbeat.objects.update_or_create(
        queue=queue, defaults={"last_seen_at": timezone.now(), "worker": worker[:255]}
    )
    return heartbeat


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    """What one ``routing.process_leads`` message did: leads tried, failed, handed back."""

    processed: int
    failures: int
    handed_back: int


def leads_process_chunk(*, lead_ids: list[str], slice_seconds: float | None = None) -> ChunkOutcome:
    """Run the pipeline for a chunk of a batch; one lead's failure does not stop the others.

    A chunk holds a worker process for as long as its leads take (seconds for 100): a realtime
    lead arriving meanwhile would wait for it. So once the chunk has run ``slice_seconds``
    (``ROUTING_CHUNK_SLICE_SECONDS``; 0: never), the leads not reached are published again, to
    the back of their lane's queue, and the process is free: the worker's next message is the
    most urgent one waiting (leads.lanes). The chunk also hands back early, as soon as a
    realtime routing message waits (``leads.services.RealtimePeek``, asked at most every
    ``ROUTING_CHUNK_PEEK_SECONDS``). Should that publish fail, the chunk simply carries on
    (a lead published twice is processed once: the second message finds it taken or done).
    ``SoftTimeLimitExceeded`` is raised through: the leads not reached wait for the sweeper.

    The leads go in batches of ``ROUTING_BATCH_SIZE`` (``routing.batch``: one claim, one routing
    transaction a batch; what a batch cannot route together goes one by one); 1: one by one.
    """
    from celery.exceptions import SoftTimeLimitExceeded

    from routing.batch import leads_process_batch

    budget = settings.ROUTING_CHUNK_SLICE_SECONDS if slice_seconds is None else slice_seconds
    peek_every = settings.ROUTING_CHUNK_PEEK_SECONDS
    started = last_peek = time.monotonic()
    failures = 0
    sliced = budget > 0
    size = max(1, settings.ROUTING_BATCH_SIZE)
    step = size if size > 1 else 1
    for index in range(0, len(lead_ids), step):
        if sliced and index:
            now = time.monotonic()
            due = now - started >= budget
            if not due and peek_every > 0 and now - last_peek >= peek_every:
                last_peek = now
                due = realtime_peek.waiting()  # a form lead waits: let it go first
            if due:
                rest = lead_ids[index:]
                if leads_enqueue(rest) == len(rest):
                    return ChunkOutcome(index, failures, len(rest))
                sliced = False  # the broker did not take them all: finish them here
        if size > 1:
            batch = _lead_uuids(lead_ids[index : index + size])
            if batch:
                failures += leads_process_batch(batch)
            continue
        try:
            lead_process(lead_id=lead_ids[index])
        except SoftTimeLimitExceeded:
            raise
        except Exception:  # recorded on the lead by lead_process; the sweeper retries it
            failures += 1
    return ChunkOutcome(len(lead_ids), failures, 0)


def _lead_uuids(lead_ids: list[str]) -> list[uuid.UUID]:
    """The ids that are lead ids (a malformed one is logged and skipped, as ``lead_process``
    does), without repeats."""
    found: dict[uuid.UUID, None] = {}
    for lead_id in lead_ids:
        try:
            found[uuid.UUID(str(lead_id))] = None
        except ValueError:
            logger.error("process_lead: %r is not a lead id", lead_id)
    return list(found)


def lead_process(*, lead_id: uuid.UUID | str) -> str | None:
    """Run the pipeline for one lead; a no-op unless this call wins the lead's lease.

    The claim is one UPDATE: ``received`` (or ``processing`` whose lease expired: a worker died
    mid-way) becomes ``processing`` with a lease until ``claimed_until`` and one more attempt.
    Only one of several concurrent deliveries of a message can win it; the others return at
    once without counting an attempt. The winner re-checks its lease under a row lock before
    writing the outcome, so an execution that outlived its lease writes nothing. A lead that
    keeps crashing its worker is quarantined as ``failed`` after ``LEAD_MAX_ATTEMPTS`` claims.

    Normalises the lead, then routes it with the live ruleset (``route_lead``): ``assigned``,
    ``excluded``, or ``unassigned`` when no rule yields (or no ruleset is published yet).
    """
    try:
        lead_uuid = uuid.UUID(str(lead_id))
    except ValueError:
        logger.error("process_lead: %r is not a lead id", lead_id)
        return None
    with log_context(lead_id=lead_uuid):  # every line logged meanwhile names the lead
        status = _lead_process(lead_uuid)
    if status is not None and status not in (LeadStatus.RECEIVED, LeadStatus.PROCESSING):
        # Committed: wake the status requests waiting for this lead (leads.status_wake).
        lead_status_announce(lead_ids=[lead_uuid])
    return status


def _lead_process(lead_uuid: uuid.UUID) -> str | None:
    lease = lead_claim(lead_uuid)
    if lease is None:
        return None
    return lead_process_leased(lead_uuid, lease)


def lead_claim(lead_uuid: uuid.UUID) -> datetime | None:
    """Claim one lead until a new lease, in one UPDATE (``lead_process``'s claim): the lease,
    or None (logged) when the lead is not waiting, is leased or is done."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.LEAD_LEASE_SECONDS)
    claimable = (
        Q(status=LeadStatus.RECEIVED)
        | Q(status=LeadStatus.PROCESSING, claimed_until__lt=now)
        | BACK_FROM_ENRICHMENT
    )
    # A lead back from enrichment continues the attempt it was parked in: not counted again.
    claimed = Lead.objects.filter(claimable, id=lead_uuid).update(
        status=LeadStatus.PROCESSING,
        claimed_until=lease,
        attempts=Case(When(BACK_FROM_ENRICHMENT, then=F("attempts")), default=F("attempts") + 1),
    )
    if not claimed:
        logger.info("process_lead: lead %s is not waiting or is leased; nothing to do", lead_uuid)
        return None
    return lease


def lead_claimable() -> Q:
    """The leads a worker may claim now: waiting, leased by a worker that died, or back from
    enrichment (``_lead_process``; ``routing.batch`` claims a batch with the same test)."""
    return (
        Q(status=LeadStatus.RECEIVED)
        | Q(status=LeadStatus.PROCESSING, claimed_until__lt=timezone.now())
        | BACK_FROM_ENRICHMENT
    )


def lead_process_leased(lead_uuid: uuid.UUID, lease: datetime) -> str | None:
    """The pipeline for one lead this worker has claimed until ``lease`` (one routing
    transaction), with the per-lead handling of failures: put off, retried or quarantined.

    In a log context of its own: the source it adds once the lead is read must not outlive it
    (a batch's leftovers come here without ``lead_process``'s context)."""
    with log_context(lead_id=lead_uuid):
        try:
            return _lead_process_claimed(lead_uuid, lease)
        except privacy.PrivacyKeyError as exc:
            return _quarantine_keyless(lead_uuid, lease, exc)
        except Exception as exc:
            if _hand_back(lead_uuid, lease, exc):
                return None  # put off, not failed
            if isinstance(exc, _Defer):  # put off too often: route it without waiting longer
                raise RuntimeError(f"lead {lead_uuid} was put off too many times") from exc
            raise


class _Defer(Exception):
    """Put this lead off for a while without counting an attempt (rolls its transaction back)."""


def _hand_back(lead_uuid: uuid.UUID, lease: datetime, exc: Exception) -> bool:
    """After an attempt that raised: the lead goes back to `received` and is sent again later.

    Being put off (``_Defer``: its original is still waiting for enrichment) and lock
    contention (a deadlock, a lock wait cut off, no stable decision) are not the lead's fault:
    the attempt is not counted, and it is retried after 0.5 s, 1 s, 2 s ... (at most 60 s), up
    to ``LEAD_MAX_DEFERRALS`` times; contention beyond that counts as a failed attempt. Any
    other error is kept on the lead (``last_error``) and retried after a growing delay; the
    attempt bound quarantines it. A crash (no exception) leaves the lease to expire. Returns
    whether the lead was put off (rather than failed).
    """
    row = Lead.objects.filter(id=lead_uuid).values_list("deferrals", "attempts").first()
    deferrals, attempts = row if row is not None else (0, 0)
    deferred = (isinstance(exc, _Defer) or is_contention(exc)) and (
        deferrals < settings.LEAD_MAX_DEFERRALS
    )
    now = timezone.now()
    if deferred:
        delay = min(60.0, 0.5 * 2 ** min(deferrals, 10)) * random.uniform(0.8, 1.2)  # noqa: S311
        logger.warning("lead %s put off for %.1f s: %s", lead_uuid, delay, exc)
    else:
        delay = min(120.0, settings.LEAD_RETRY_BACKOFF_SECONDS * 4 ** max(0, attempts - 1))
        logger.error("processing lead %s failed", lead_uuid, exc_info=exc)
    handed_back = Lead.objects.filter(
        id=lead_uuid, status=LeadStatus.PROCESSING, claimed_until=lease
    ).update(
        status=LeadStatus.RECEIVED,
        claimed_until=None,
        last_error=f"{type(exc).__name__}: {exc}"[:2000],
        attempts=F("attempts") - 1 if deferred else F("attempts"),
        deferrals=F("deferrals") + 1 if deferred else F("deferrals"),
        # The sweeper leaves it alone meanwhile (it re-sends only if this publish is lost).
        requeued_at=now,
    )
    if handed_back:
        lead_enqueue_later(lead_uuid, delay=delay)
    return deferred


# SQLSTATEs of lock contention: deadlock_detected, serialization_failure, lock_not_available.
_CONTENTION_SQLSTATES = frozenset({"40P01", "40001", "55P03"})


def is_contention(exc: BaseException) -> bool:
    """Whether ``exc`` is lock contention worth retrying at once rather than a real failure."""
    if isinstance(exc, RoutingContention):
        return True
    if isinstance(exc, DBError):
        cause = exc.__cause__ or exc
        return getattr(cause, "sqlstate", None) in _CONTENTION_SQLSTATES
    return False


# --- Hooks into enrichment and delivery -------------------------------------------------------


def schedule_delivery(*, assignment: Assignment, event: str, fresh: bool = False) -> None:
    """Outbound webhooks and the rep's e-mail for a new owner, sent after commit (never undone).

    ``fresh``: ``assignment`` was created in this transaction (see ``deliveries_schedule``).
    """
    deliveries_schedule(assignment=assignment, event=event, fresh=fresh)


def _quarantine(lead: Lead, now: datetime) -> str:
    lead.status = LeadStatus.FAILED
    cause = (
        f"last error: {lead.last_error}"
        if lead.last_error
        else "none finished (worker crash or time limit)"
    )
    lead.last_error = f"gave up after {lead.attempts - 1} attempts; {cause}"[:2000]
    lead.processed_at = now
    lead.save(update_fields=["status", "last_error", "processed_at", "claimed_until"])
    event_record(type=EventType.FAILED, lead=lead, at=now, data={"error": lead.last_error})
    logger.error("lead %s quarantined as failed: %s", lead.id, lead.last_error)
    return lead.status


def _quarantine_keyless(lead_uuid: uuid.UUID, lease: datetime, exc: Exception) -> str | None:
    """A lead whose person key cannot be opened (a master key removed or lost) or whose key
    material is malformed fails at once, with the reason on the lead: retrying cannot help until
    an operator puts the key back, so it neither retries nor comes back to the queue.
    ``leadrouter_leads_failed_privacy_key`` counts these leads; once the key is back, route them
    again (the lead page's *Route again*, or the admin's action). The ``failed`` event holds
    no personal data: it is written without the person's key."""
    now = timezone.now()
    message = (
        f"{privacy.LEAD_ERROR_PREFIX}: {exc} (docs/operations.md, 'Losing a key'); route it again "
        "once the key is back in PRIVACY_KEYS"
    )[:2000]
    with transaction.atomic(durable=True):
        lead = (
            Lead.objects.select_for_update(of=("self",), no_key=True)
            .filter(id=lead_uuid, status=LeadStatus.PROCESSING, claimed_until=lease)
            .first()
        )
        if lead is None:
            logger.warning("process_lead: lease on lead %s lost; writing nothing", lead_uuid)
            return None
        lead.status = LeadStatus.FAILED
        lead.claimed_until = None
        lead.last_error = message
        lead.processed_at = now
        lead.save(update_fields=["status", "claimed_until", "last_error", "processed_at"])
        # `reason` is plain data: nothing here needs (or may use) the key that cannot be opened.
        event_record(type=EventType.FAILED, lead=lead, at=now, data={"reason": message})
    logger.error("lead %s failed: %s", lead_uuid, message)
    return LeadStatus.FAILED


def _assign_sticky(lead: Lead, now: datetime) -> Assignment | None:
    """Give a duplicate to its original's owner when that rep is still active.

    Sticky: caps are ignored and no team's turn moves (rules-format.md "Dedup"). The original's
    row is locked first, so a reassignment of the original cannot slip in between. While the
    original is itself still being processed (waiting for enrichment) the duplicate is put off
    (``_Defer``), up to LEAD_MAX_DEFERRALS times, instead of being routed to someone else.
    """
    if lead.duplicate_of_id is None:
        return None
    original = Lead.objects.select_for_update(no_key=True).filter(pk=lead.duplicate_of_id).first()
    if original is None:
        return None
    if original.status in (LeadStatus.RECEIVED, LeadStatus.PROCESSING):
        if lead.deferrals < settings.LEAD_MAX_DEFERRALS:
            raise _Defer(f"its original {original.pk} is still being processed")
        return None
    current = Assignment.objects.filter(lead=original, active=True).select_related("rep").first()
    if current is None or not current.rep.active:
        return None
    key = lead.dedup_key.split(":", 1)[0] or "e-mail"
    sla = current.sla_minutes or settings.DEFAULT_SLA_MINUTES or None
    return assignment_create(
        lead=lead,
        rep_id=current.rep_id,
        rep_name=current.rep.name,
        team_id=current.team_id,
        team_name=current.team_name,
        kind=AssignmentKind.DUPLICATE,
        reason=(
            f"duplicate of lead {original.pk} (same {key}): sticky to its owner {current.rep.name}"
        ),
        sla_minutes=sla,
        now=now,
    )


def _crm_owner(lead: Lead, now: datetime) -> tuple[CrmOwnerFound | None, list[str]]:
    """The CRM owner (a rep who can take a lead now: active, not away) who already has this
    lead's person, and the trace lines of the lookup (why an owner found was not used, too)."""
    notes = crm_trace_notes(lead)
    found, owner_notes = crm_person_owner(lead, log=True)
    notes += owner_notes
    if found is None:
        return None, notes
    why = rep_unavailable_reason(rep_id=found.rep_id, now=now)
    if why is not None:
        notes.append(f"{found.reason}, who cannot take leads now ({why}): routed by the rules")
        return None, notes
    name = Rep.objects.filter(pk=found.rep_id).values_list("name", flat=True).first()
    return CrmOwnerFound(found.kind, found.rep_id, name or found.rep_name, found.person), notes


def _assign_crm_owner(
    lead: Lead, found: CrmOwnerFound, now: datetime, notes: list[str]
) -> Assignment:
    """Give the lead to the rep who owns its person in the CRM (caps ignored, no turn moves).

    The team is the rep's first team (so its manager sees the lead), its SLA the team's or the
    default.
    """
    membership = (
        TeamMembership.objects.filter(rep_id=found.rep_id)
        .select_related("team")
        .order_by("team_id")
        .first()
    )
    team = membership.team if membership is not None else None
    sla = (team.sla_minutes if team is not None else None) or settings.DEFAULT_SLA_MINUTES or None
    return assignment_create(
        lead=lead,
        rep_id=found.rep_id,
        rep_name=found.rep_name,
        team_id=team.pk if team is not None else None,
        team_name=team.name if team is not None else "",
        kind=AssignmentKind.CRM_OWNER,
        reason=found.reason,
        trace=[{"rule": None, "matched": False, "why": note} for note in notes],
        sla_minutes=sla,
        now=now,
    )


def unassigned_retry_delay(retries: int) -> timedelta:
    """How long an unassigned lead waits before its next automatic retry, after ``retries``.

    ``UNASSIGNED_RETRY_SECONDS``, doubling with each retry that left it unassigned, at most
    ``UNASSIGNED_RETRY_MAX_SECONDS``: a lead nobody can take for days is tried about once an
    hour, not 288 times a day.
    """
    base = settings.UNASSIGNED_RETRY_SECONDS
    cap = max(base, settings.UNASSIGNED_RETRY_MAX_SECONDS)
    return timedelta(seconds=min(cap, base * 2 ** min(retries, 32)))


def _end_unassigned_retries(lead: Lead) -> int | None:
    """The lead has an outcome other than unassigned: no more automatic retries.

    Returns how many retries it took when this was one (for the outcome's event), else None.
    The count stays on the lead; the caller saves it.
    """
    if lead.unassigned_retry_at is None:
        return None
    lead.unassigned_retry_at = None
    return lead.unassigned_retries


def decision_retry_fields(
    lead: Lead, result: RouteResult, now: datetime
) -> tuple[bool, int | None, list[str]]:
    """The automatic-retry fields a routing outcome changes on ``lead`` (in memory), as
    (whether the outcome is an event, the retries it took, the fields changed).

    An automatic retry that leaves an unassigned lead unassigned changes nothing on its
    timeline: it only schedules the next retry. Any other outcome is an event.
    """
    if result.status == LeadStatus.UNASSIGNED and result.assignment is None:
        if lead.unassigned_retry_at is not None:  # retried, and still nobody can take it
            lead.unassigned_retry_at = now + unassigned_retry_delay(lead.unassigned_retries)
            logger.info(
                "lead %s still unassigned after %d retries; next retry at %s",
                lead.pk,
                lead.unassigned_retries,
                lead.unassigned_retry_at.isoformat(),
                # Named here: a batch (routing.batch) routes it outside the lead's log context.
                extra={"lead_id": str(lead.pk), "source": lead.source.slug},
            )
            return False, None, ["unassigned_retry_at"]
        lead.unassigned_retries = 0  # became unassigned: the first retry after one interval
        lead.unassigned_retry_at = now + unassigned_retry_delay(0)
        return True, None, ["unassigned_retries", "unassigned_retry_at"]
    retries = _end_unassigned_retries(lead)
    return True, retries, ["unassigned_retry_at"] if retries is not None else []


def decision_event(
    lead: Lead, result: RouteResult, now: datetime, notes: list[str], retries: int | None
) -> dict[str, Any]:
    """``event_record``'s arguments for a routing outcome without an assignment."""
    decision = result.decision
    kind = EventType.EXCLUDED if result.status == LeadStatus.EXCLUDED else EventType.UNASSIGNED
    return {
        "type": kind,
        "lead": lead,
        "at": now,
        "rule_id": decision.rule_id,
        "rule_name": (decision.rule_name or "")[:200],
        "ruleset_version": decision.ruleset_version,
        "data": {
            "reason": decision.reason,
            "tags": list(decision.tags),
            "priority": decision.priority,
            **({"unassigned_retries": retries} if retries is not None else {}),
        },
        "trace": stored_trace(decision, notes),
    }


def assigned_event(
    assignment: Assignment,
    now: datetime,
    decision: Decision | None = None,
    *,
    retries: int | None = None,
) -> dict[str, Any]:
    """``event_record_for_assignment``'s ``data`` and ``trace`` of an `assigned` event (with
    the tags and priority that tag rules set); ``retries``: the automatic retries it took when
    the lead had been unassigned."""
    return {
        "data": {
            "reason": assignment.reason,
            "kind": assignment.kind,
            "sla_due_at": assignment.sla_due_at,
            "tags": list(decision.tags) if decision is not None else [],
            "priority": decision.priority if decision is not None else None,
            **({"unassigned_retries": retries} if retries is not None else {}),
        },
        "trace": assignment.trace,
    }


def _record_decision(lead: Lead, result: RouteResult, now: datetime, notes: list[str]) -> None:
    """The audit event of a routing outcome, in the routing transaction
    (``decision_retry_fields``: an automatic retry still unassigned is no event)."""
    recorded, retries, changed = decision_retry_fields(lead, result, now)
    if changed:
        lead.save(update_fields=changed)
    if not recorded:
        return
    if result.assignment is not None:
        _record_assigned(result.assignment, now, result.decision, retries=retries)
        return
    event_record(**decision_event(lead, result, now, notes, retries))


def _record_assigned(
    assignment: Assignment,
    now: datetime,
    decision: Decision | None = None,
    *,
    retries: int | None = None,
) -> None:
    """The `assigned` event (with the tags and priority that tag rules set) and deliveries.

    ``retries``: the automatic retries it took when the lead had been unassigned.
    """
    event_record_for_assignment(
        type=EventType.ASSIGNED,
        assignment=assignment,
        at=now,
        **assigned_event(assignment, now, decision, retries=retries),
    )
    # Every caller has just created the assignment, in this transaction.
    schedule_delivery(assignment=assignment, event=EventType.ASSIGNED, fresh=True)


def _lead_process_claimed(lead_uuid: uuid.UUID, lease: datetime) -> str | None:
    with transaction.atomic(durable=True):
        claim = (
            # The lead's row only (`of`), and NO KEY: the source row stays unlocked, so the
            # intake's foreign key checks on it (FOR KEY SHARE at COMMIT) never wait for routing.
            Lead.objects.select_for_update(of=("self",), no_key=True)
            .select_related("source")
            .filter(id=lead_uuid, status=LeadStatus.PROCESSING, claimed_until=lease)
        )
        # In the claim's own statement: every later statement of this lead sees one
        # configuration version (routing.decisions.DECIDE_LOCK).
        lead = decide_locked(claim).first()
        if lead is None:
            logger.warning("process_lead: lease on lead %s lost; writing nothing", lead_uuid)
            return None
        log_context_add(source=lead.source.slug)
        now = timezone.now()
        lead.claimed_until = None
        if lead.erased_at is not None:
            # Erased while it waited (queued, or parked for a fetch, the CRM or enrichment):
            # re-read under this lock, so nothing of the person is normalised or routed again.
            return lead_erased_close(lead=lead, now=now, stage="routing")
        if lead.attempts > settings.LEAD_MAX_ATTEMPTS:
            return _quarantine(lead, now)
        if lead_meta_fetch_wanted(lead):
            # A notification that only names its lead: fetched first; it comes back here.
            lead_meta_fetch_park(lead, now)
            return lead.status
        # Each stage runs once: a lead back from enrichment (or retried) skips what is done.
        if lead.normalized_at is None:
            lead_apply_normalization(lead=lead)
        if lead.deduped_at is None:
            match = lead_dedup(lead=lead, now=now)
            if match is not None:
                event_record(
                    type=EventType.DUPLICATE_DETECTED,
                    lead=lead,
                    at=now,
                    data={"original": str(match.original.pk), "matched_on": match.key},
                )
        if lead.duplicate_of_id is not None:
            # New, or re-routed: a duplicate goes to its original's owner when it has one.
            sticky = _assign_sticky(lead, now)
            if sticky is not None:
                lead.status = LeadStatus.DUPLICATE
                lead.processed_at = now
                retries = _end_unassigned_retries(lead)
                lead.save()
                _record_assigned(sticky, now, retries=retries)
                return lead.status
        if crm_lookup_wanted(lead):
            # Park it for the CRM queue (live dedup and ownership); it comes back here.
            crm_park(lead, now)
            return lead.status
        crm_owner, crm_notes = _crm_owner(lead, now)
        if lead.enrichment_status == EnrichmentStatus.NONE:
            if crm_owner is not None:
                # Already owned in the CRM by an active rep: theirs, like a sticky duplicate.
                owned = _assign_crm_owner(lead, crm_owner, now, crm_notes)
                duplicate = lead.duplicate_of_id is not None
                lead.status = LeadStatus.DUPLICATE if duplicate else LeadStatus.ASSIGNED
                lead.processed_at = now
                retries = _end_unassigned_retries(lead)
                lead.save()
                _record_assigned(owned, now, retries=retries)
                return lead.status
            results = enrichment_builtin(lead)
            # An event when a provider learnt something (fields filled, an account matched);
            # every provider's answer is kept on the lead (`enrichment`) either way.
            if any(r.filled or (r.name == "account" and r.status == "done") for r in results):
                event_record(
                    type=EventType.ENRICHED,
                    lead=lead,
                    at=now,
                    data=enrichment_event_data(results),
                )
            if enrichment_http_wanted(lead):
                # Park it for the enrichment queue; it comes back here when that is done.
                lead.enrichment_status = EnrichmentStatus.PENDING
                lead.enrichment_next_at = now
                lead.save()
                enrichment_enqueue_after_commit(lead.pk)
                return lead.status
            lead.enrichment_status = EnrichmentStatus.DONE  # built-ins only: done, once
        lead.save()
        notes = [*crm_notes, *(note for note in [enrichment_trace_note(lead)] if note)]
        # Still under the lead's row lock and lease: route_lead takes the team's, then the
        # rep's lock, writes the assignment and the final status in this same transaction.
        result = route_lead(lead=lead, now=now, notes=notes)
        if lead.duplicate_of_id is not None and result.status == LeadStatus.ASSIGNED:
            # A duplicate whose original had no active owner, routed normally.
            lead.status = LeadStatus.DUPLICATE
            lead.save(update_fields=["status"])
        _record_decision(lead, result, now, notes)
        return lead.status


# --- Actions on a lead: first touch, manual reassignment, re-routing ----------------------------


class LeadActionError(Exception):
    """A lead action refused: ``code`` and ``message`` for the API, ``status`` its HTTP code."""

    def __init__(self, code: str, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def _locked_lead(lead_id: uuid.UUID | str, *, decide: bool = False) -> Lead:
    """The lead's row, locked; with ``decide`` (a path that assigns it or sends it to be
    routed again), under the decide lock shared too (``routing.decisions.decide_locked``)."""
    query = Lead.objects.select_for_update(no_key=True).filter(pk=lead_id)
    lead = (decide_locked(query) if decide else query).first()
    if lead is None:
        raise LeadActionError("not_found", "No such lead.", 404)
    return lead


def _current_assignment(lead: Lead) -> Assignment | None:
    return Assignment.objects.filter(lead=lead, active=True).select_related("rep").first()


def _scope_check(assignment: Assignment | None, team_ids: Collection[int] | None) -> None:
    """Refuse a lead not currently owned within ``team_ids`` (None: every lead may be acted on).

    Called under the lead's lock, on the assignment read under it: the caller's own visibility
    check ran before the lock, and a reassignment committed in between may have moved the lead
    to another team. Out of scope reads as not found, like the pages and the API answer it.
    """
    if team_ids is None:
        return
    if assignment is None or assignment.team_id not in team_ids:
        raise LeadActionError("not_found", "No such lead.", 404)


@transaction.atomic
def assignment_touch(
    *,
    lead_id: uuid.UUID | str,
    actor: str,
    owner_user_id: int | None = None,
    scope_team_ids: Collection[int] | None = None,
    assignment_id: int | None = None,
    now: datetime | None = None,
) -> Assignment:
    """Record the owner's first touch of a lead; touching again changes nothing (idempotent).

    With ``owner_user_id`` (a user without the right to touch any lead), only when that user
    is the current owner's; with ``scope_team_ids`` (a manager scoped to their teams), only
    when the lead is owned within those teams; with ``assignment_id`` (a one-click link made
    for one assignment), only while that assignment is still the lead's current one. All are
    checked under the lead's lock, so a reassignment in between cannot let anyone touch an
    assignment that is no longer theirs.
    """
    lead = _locked_lead(lead_id)
    assignment = _current_assignment(lead)
    _scope_check(assignment, scope_team_ids)
    if assignment_id is not None and (assignment is None or assignment.pk != assignment_id):
        raise LeadActionError(
            "reassigned", "This lead is no longer yours: it was reassigned since.", 409
        )
    # The owner's check first: a rep must not tell a lead without an owner from another rep's
    # (or from no lead at all), so that ids cannot be enumerated through the touch.
    if owner_user_id is not None and (
        assignment is None or assignment.rep.user_id != owner_user_id
    ):
        raise LeadActionError(
            "forbidden", "Only the lead's owner or a manager may report its first touch.", 403
        )
    if assignment is None:
        raise LeadActionError("not_assigned", "This lead has no owner to touch it.")
    if assignment.touched_at is None:
        now = now or timezone.now()
        if not assignment_first_touch(assignment=assignment, at=now, source=TouchSource.LEADROUTER):
            assignment.refresh_from_db()  # touched from a CRM meanwhile
            return assignment
        late = assignment.sla_due_at is not None and now > assignment.sla_due_at
        event_record_for_assignment(
            type=EventType.TOUCHED,
            assignment=assignment,
            actor=actor,
            at=now,
            data={"sla_met": not late if assignment.sla_due_at is not None else None},
        )
    return assignment


_REASSIGNABLE = (
    LeadStatus.ASSIGNED,
    LeadStatus.DUPLICATE,
    LeadStatus.UNASSIGNED,
    LeadStatus.EXCLUDED,
    LeadStatus.FAILED,
)


def _reassign_team(
    rep: Rep, current: Assignment | None, scope_team_ids: Collection[int] | None
) -> tuple[int | None, str]:
    """The team a lead reassigned by hand to ``rep`` belongs to: the current one when the rep
    is in it; else the rep's first team (within a scoped manager's teams), so that the lead
    stays visible to that team's manager; else none."""
    memberships = TeamMembership.objects.filter(rep=rep).select_related("team")
    if scope_team_ids is not None:
        memberships = memberships.filter(team_id__in=scope_team_ids)
    teams = {m.team_id: m.team.name for m in memberships.order_by("team_id")}
    if current is not None and current.team_id in teams:
        return current.team_id, current.team_name
    if teams:
        first = next(iter(teams))
        return first, teams[first]
    if current is not None and scope_team_ids is None:
        return current.team_id, current.team_name
    return None, ""


@transaction.atomic
def lead_reassign(
    *,
    lead_id: uuid.UUID | str,
    rep_email: str,
    reason: str,
    actor: str,
    scope_team_ids: Collection[int] | None = None,
    now: datetime | None = None,
) -> Assignment:
    """Give a lead to ``rep_email`` by hand (caps are not checked: a manager's decision).

    The current assignment, if any, is superseded by a new one; a lead without an owner gets
    its first. Reassigning to the current owner changes nothing. Not while the worker has it.
    With ``scope_team_ids`` (a manager scoped to their teams), only a lead owned within those
    teams, and only to their members — checked under the lead's lock. The typed ``reason`` is
    kept with e-mails and phone numbers redacted: it enters the append-only audit log, where an
    erasure of the lead's person cannot reach it.
    """
    reason = reason_redact(reason.strip())
    lead = _locked_lead(lead_id, decide=True)
    current = _current_assignment(lead)
    _scope_check(current, scope_team_ids)
    if lead.status not in _REASSIGNABLE:
        raise LeadActionError(
            "lead_in_progress", f"This lead is still {lead.status}; try again once it is routed."
        )
    rep = Rep.objects.filter(email__iexact=rep_email.strip()).first()
    # A scoped manager learns nothing about reps outside their teams, not even that they exist.
    if scope_team_ids is not None and (
        rep is None
        or not TeamMembership.objects.filter(rep=rep, team_id__in=scope_team_ids).exists()
    ):
        raise LeadActionError(
            "forbidden", "You may reassign leads only to members of the teams you manage.", 403
        )
    if rep is None:
        raise LeadActionError("unknown_rep", f'No rep with the e-mail "{rep_email}".', 422)
    if not rep.active:
        raise LeadActionError("rep_inactive", f"{rep.name} is not active.", 422)
    if current is not None and current.rep_id == rep.pk:
        return current
    now = now or timezone.now()
    sla = (current.sla_minutes if current else None) or settings.DEFAULT_SLA_MINUTES or None
    team_id, team_name = _reassign_team(rep, current, scope_team_ids)
    assignment = assignment_create(
        lead=lead,
        rep_id=rep.pk,
        rep_name=rep.name,
        team_id=team_id,
        team_name=team_name,
        kind=AssignmentKind.REASSIGNMENT if current else AssignmentKind.INITIAL,
        supersede=current,
        reason=f"reassigned by hand ({actor}): {reason}",
        sla_minutes=sla,
        now=now,
    )
    if lead.status != LeadStatus.DUPLICATE:
        lead.status = LeadStatus.ASSIGNED
    lead.processed_at = lead.processed_at or now
    lead.save(update_fields=["status", "processed_at"])
    event_record_for_assignment(
        type=EventType.REASSIGNED,
        assignment=assignment,
        actor=actor,
        at=now,
        data={
            "manual": True,
            "reason": reason,
            "from": {"id": current.rep_id, "name": current.rep_name} if current else None,
        },
    )
    schedule_delivery(assignment=assignment, event=EventType.REASSIGNED)
    return assignment


_REROUTABLE = (LeadStatus.UNASSIGNED, LeadStatus.FAILED)


def lead_reroute(*, lead_id: uuid.UUID | str, actor: str) -> Lead:
    """Send an unassigned or failed lead through routing again (a fresh attempt budget)."""
    with transaction.atomic():
        lead = _locked_lead(lead_id, decide=True)
        if lead.status not in _REROUTABLE:
            raise LeadActionError(
                "not_reroutable",
                f"Only unassigned or failed leads are re-routed; this is {lead.status}.",
            )
        previous = lead.status
        lead.status = LeadStatus.RECEIVED
        # It enters the queue anew: its wait (backlog age, the stale sweeper) starts now, not
        # when it was first received, which may be hours ago for an unassigned lead retried.
        lead.queued_at = timezone.now()
        lead.attempts = 0
        lead.claimed_until = None
        lead.last_error = ""
        lead.requeued_at = None
        # Asked for by a person: its outcome is an event and, if unassigned again, the
        # automatic retries start over from the first interval.
        lead.unassigned_retries = 0
        lead.unassigned_retry_at = None
        lead.save(
            update_fields=[
                "status",
                "queued_at",
                "attempts",
                "claimed_until",
                "last_error",
                "requeued_at",
                "unassigned_retries",
                "unassigned_retry_at",
            ]
        )
        event_record(
            type=EventType.REROUTE_REQUESTED, lead=lead, actor=actor, data={"was": previous}
        )
        leads_enqueue_after_commit([lead.pk], lane=lead.lane)
    return lead


def lead_retry_unassigned(*, lead_id: uuid.UUID | str, now: datetime | None = None) -> Lead:
    """Send an unassigned lead through routing again, automatically and without an event.

    Like ``lead_reroute`` (a fresh attempt budget, queued anew), but it counts the retry on the
    lead and keeps ``unassigned_retry_at`` set, which tells the pipeline that this is a retry:
    still unassigned, it only schedules the next one; any other outcome is the lead's next
    event. Raises ``LeadActionError`` when the lead is no longer unassigned.
    """
    now = now or timezone.now()
    with transaction.atomic():
        lead = _locked_lead(lead_id, decide=True)
        if lead.status != LeadStatus.UNASSIGNED:
            raise LeadActionError(
                "not_unassigned", f"Only unassigned leads are retried; this is {lead.status}."
            )
        lead.status = LeadStatus.RECEIVED
        lead.queued_at = now
        lead.attempts = 0
        lead.claimed_until = None
        lead.last_error = ""
        lead.requeued_at = None
        lead.unassigned_retries += 1
        # Set for leads left unassigned by a version without retry times, too: a retry.
        lead.unassigned_retry_at = lead.unassigned_retry_at or now
        lead.save(
            update_fields=[
                "status",
                "queued_at",
                "attempts",
                "claimed_until",
                "last_error",
                "requeued_at",
                "unassigned_retries",
                "unassigned_retry_at",
            ]
        )
        leads_enqueue_after_commit([lead.pk], lane=lead.lane)
    return lead


@dataclass(frozen=True, slots=True)
class RerouteReport:
    """What re-routing a rep's open leads did."""

    moved: int
    kept: int


def rep_reroute_open_leads(
    *,
    rep_id: int,
    actor: str,
    reason: str,
    limit: int | None = 500,
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RerouteReport:
    """Route again the leads a rep holds untouched (deactivated, out of office).

    Each lead in its own transaction, under its lock: the rules decide again with today's
    state (the rep, now ineligible, is skipped like any other), and a new owner supersedes the
    rep with a `reassigned` event and the usual deliveries. A lead for which the rules find no
    other owner stays with the rep (``kept``). Leads of a team that keeps an away rep's leads
    (``Team.keep_leads_when_rep_away``) are not touched.
    """
    from routing.timeoff.services import untouched_leads_to_move

    moved = kept = 0
    found = untouched_leads_to_move(rep_id)
    lead_ids = list(found if limit is None else found[:limit])
    for done, lead_id in enumerate(lead_ids):
        if progress is not None and done % 20 == 0:
            progress(done, len(lead_ids))
        with transaction.atomic():
            lead = decide_locked(
                Lead.objects.select_for_update(of=("self",), no_key=True)
                .select_related("source")
                .filter(pk=lead_id)
            ).get()
            current = _current_assignment(lead)
            if current is None or current.rep_id != rep_id or current.touched_at is not None:
                continue  # moved or touched meanwhile
            at = now or timezone.now()
            result = route_lead(lead=lead, now=at, supersede=current)
            if result.assignment is None:
                kept += 1
                continue
            event_record_for_assignment(
                type=EventType.REASSIGNED,
                assignment=result.assignment,
                actor=actor,
                at=at,
                data={
                    "manual": False,
                    "reason": reason,
                    "from": {"id": current.rep_id, "name": current.rep_name},
                },
                trace=result.assignment.trace,
            )
            schedule_delivery(assignment=result.assignment, event=EventType.REASSIGNED)
            moved += 1
    return RerouteReport(moved=moved, kept=kept)
