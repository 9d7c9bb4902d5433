"""Routing a batch of leads in one transaction (issue 18: route in batches).

``leads_process_batch(lead_ids)`` runs the pipeline for up to ``ROUTING_BATCH_SIZE`` leads with
a fixed number of statements for what the leads share, instead of one routing transaction each:

1. **Claim** the batch: one UPDATE of every claimable lead among the ids (the same test and
   lease as ``lead_process``), one SELECT of the ids it won.
2. **One routing transaction** for the claimed leads: their rows locked in one statement, in id
   order, which also takes the shared decide lock (``decide_lock_shared_sql``: the whole batch
   decides with one configuration version); each lead's own stages (normalisation, dedup, the
   built-in enrichment) as ``lead_process`` runs them; then for the leads left to route, one
   configuration check, one snapshot of the reps and turns, one account lookup for all their
   domains, and the decisions taken in memory, in lead id order. The teams they go to are
   locked once, in id order, then every member of those teams (and every rep a rule names) in
   id order, and each locked rep's counters read after the lock: under those locks nobody else
   can move a turn or fill a cap, so the decisions made on that state, one after the other,
   are exact (round robin, weighted shares, caps) without a lock or a savepoint per lead. The
   writes are bulk: the assignments in one INSERT, each turn once, each rep's counters and
   ``last_assigned_at`` once, the audit events with their hash chains in three statements
   (``events_record_many``), the outbox rows in one INSERT (``deliveries_schedule_fresh``).
3. **Anything unusual goes one by one** (``lead_process_leased``, after the batch commits):
   a lead erased while it waited, past its attempt bound, waiting for an ad platform's fetch,
   a CRM lookup or the HTTP enrichment, a duplicate (sticky to its original: after the batch,
   its original may be in it), or owned in a CRM. If the batch transaction raises anything
   (lock contention, a lead whose data breaks a stage, a lost key), it is rolled back whole and
   every lead of the batch goes one by one, each with its own failure handling (put off,
   retried, quarantined): one bad lead never fails the others.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Q, Subquery, TextField, Value, When, signals
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Lower, NullIf, Trim
from django.db.models.lookups import In
from django.utils import timezone

from audit.models import EventType
from audit.services import events_record_many
from config.logging import log_context
from leads import privacy
from leads.models import EnrichmentStatus, Lead, LeadStatus
from leads.priority import priority_clean, tags_clean
from leads.services import BACK_FROM_ENRICHMENT, lead_tags_set
from leads.status_wake import lead_status_announce
from routing import services as pipeline
from routing.crm.lookup import crm_lookup_wanted
from routing.decisions import (
    _MAX_ATTEMPTS,
    _REP_COLUMNS,
    _STATUS,
    LiveConfig,
    RouteResult,
    RoutingContention,
    RulesetNotFound,
    _decide,
    _decision_snapshot,
    _DecisionSnapshot,
    _default_sla,
    _domain_candidates,
    _rep_state,
    _sla_due,
    decide_lock_shared_sql,
    lead_facts,
    lead_unreachable_reason,
    live_config,
    stored_trace,
)
from routing.dedup import dedup_keys, dedup_lock_keys, dedup_lock_many
from routing.delivery.services import deliveries_schedule_fresh
from routing.engine import AccountFacts, Decision, LeadFacts, RotationState
from routing.enrichment import (
    enrichment_builtin,
    enrichment_event_data,
    enrichment_http_wanted,
    enrichment_trace_note,
)
from routing.enrichment.builtin import accounts_known
from routing.fetch.meta import lead_meta_fetch_wanted
from routing.loads import load_assigned_many, load_counts, load_from_row, local_midnight
from routing.models import Account, Assignment, AssignmentKind, Rep, RepLoad, Team
from routing.services import (
    _crm_owner,
    assigned_event,
    decision_event,
    decision_retry_fields,
    is_contention,
    lead_claimable,
    lead_process_leased,
)

logger = logging.getLogger(__name__)

_Claimed = TypeVar("_Claimed")


@dataclass(slots=True)
class _Routed:
    """One lead of the batch to route: its facts, trace notes and (once decided) outcome."""

    lead: Lead
    notes: list[str]
    decision: Decision | None = None
    at: datetime | None = None

    def outcome(self) -> tuple[Decision, datetime]:
        """The decision taken and when (set by ``_route`` for every lead it routes)."""
        if self.decision is None or self.at is None:
            raise RuntimeError(f"lead {self.lead.pk}: routed without a decision")
        return self.decision, self.at


@dataclass(slots=True)
class _Batch:
    """The batch transaction's state: what it routes, what it leaves, the events it writes."""

    now: datetime
    routed: list[_Routed] = field(default_factory=list)
    leftover: list[uuid.UUID] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    finished: list[uuid.UUID] = field(default_factory=list)
    staged: set[uuid.UUID] = field(default_factory=set)  # leads whose stages changed them
    loaded: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)  # values as read
    accounts: _Accounts = field(default_factory=lambda: _Accounts())


def leads_claim(lead_ids: Sequence[uuid.UUID]) -> tuple[list[uuid.UUID], datetime]:
    """Claim every claimable lead among ``lead_ids`` until a new lease: (the ids won, in id
    order; the lease). Two statements, whatever the number (``lead_process`` claims one), in
    one transaction: should the second fail, the leads are not left claimed by nobody."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.LEAD_LEASE_SECONDS)
    # Only leads never tried (or back from a stage that parked them): a lead tried before may
    # be one that kills its worker, and would take the whole batch's attempts with it.
    fresh = Q(attempts=0) | BACK_FROM_ENRICHMENT
    # No savepoint inside a caller's transaction (a test's): a worker has none; a failure
    # there rolls the caller's back.
    with transaction.atomic(savepoint=False):
        Lead.objects.filter(lead_claimable(), fresh, id__in=list(lead_ids)).update(
            status=LeadStatus.PROCESSING,
            claimed_until=lease,
            attempts=Case(
                When(BACK_FROM_ENRICHMENT, then=F("attempts")), default=F("attempts") + 1
            ),
        )
        won = Lead.objects.filter(
            id__in=list(lead_ids), status=LeadStatus.PROCESSING, claimed_until=lease
        ).order_by("id")
        return list(won.values_list("id", flat=True)), lease


CLAIM_TRIES = 3  # a batch's claim, tried again at once after lock contention


def _claim(lead_ids: Sequence[uuid.UUID]) -> tuple[list[uuid.UUID], datetime | None]:
    """``leads_claim``, tried again after lock contention; ([], None) if it cannot be had:
    the leads then go one by one, each claimed alone (``leads_process_batch``).

    The claim is one UPDATE of up to ``ROUTING_BATCH_SIZE`` rows, and every row's change of
    status fires the report rollup trigger (``audit.rollups``), which upserts the counters of
    its slot, status and shard in the order the rows happen to be updated: two claims, or a
    claim and a batch writing its outcomes, can take those counter rows in opposite orders and
    deadlock (PostgreSQL cuts one off), or wait past the worker's ``lock_timeout``. A claim
    that raised before this was not caught: it failed the whole chunk's task, and every lead of
    the chunk not yet routed waited for the stale sweeper."""
    claimed = _claim_tried(lambda: leads_claim(lead_ids), f"a batch of {len(lead_ids)} leads")
    return claimed if claimed is not None else ([], None)


def _claim_tried(claim: Callable[[], _Claimed], what: str) -> _Claimed | None:
    """``claim()``, tried again after lock contention (``_claim``); None if it cannot be had."""
    from celery.exceptions import SoftTimeLimitExceeded

    for attempt in range(1, CLAIM_TRIES + 1):
        try:
            return claim()
        except SoftTimeLimitExceeded:
            raise
        except Exception as exc:
            again = is_contention(exc) and attempt < CLAIM_TRIES
            logger.warning(
                "claiming %s failed (%s: %s); %s",
                what,
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
                "trying again" if again else "routing them one by one",
            )
            if not again:
                break
            time.sleep(0.05 * attempt * random.uniform(0.5, 1.5))  # noqa: S311 - jitter only
    return None


# --- One lead's message, routed with the leads waiting beside it ------------------------------


def _queue_order() -> list[Any]:
    """The order a lane's waiting leads are taken in: its high-priority leads first (the lead's
    own priority, else its source's intake priority, one of ``HIGH_PRIORITIES`` in any case:
    ``leads.services.lead_queue_facts``), then the oldest in the queue first."""
    high = sorted({name.strip().casefold() for name in settings.HIGH_PRIORITIES} - {""})
    if not high:
        return [F("queued_at").asc(), F("id").asc()]
    known = Lower(Coalesce(NullIf(Trim("priority"), Value("")), Trim("source__intake_priority")))
    later = Case(When(In(known, high), then=Value(0)), default=Value(1))
    return [later.asc(), F("queued_at").asc(), F("id").asc()]


def leads_claim_waiting(
    lead_id: uuid.UUID, lease: datetime, limit: int
) -> tuple[list[uuid.UUID], int | None]:
    """Beside ``lead_id``, which this worker has just claimed until ``lease``: claim until the
    same lease up to ``limit`` other leads waiting in its lane, in the lane's order
    (``_queue_order``). (The ids held until ``lease``, ``lead_id`` first then in that order;
    ``lead_id``'s attempts, None if it could not be read locked.) Two statements, in one
    transaction, whatever ``limit``: the rows locked and read, then the others claimed.

    Only leads a batch may claim (``leads_claim``: never tried, or back from a stage that
    parked them; a lead that was claimed before and whose lease expired has been tried), and
    none that was put off (``deferrals``: it waits for its own delayed message, not to be
    taken again at once). On PostgreSQL they are locked ``FOR NO KEY UPDATE SKIP LOCKED``: two
    workers claiming at once take different leads and neither waits for the other; a lead's
    own message that meets a lead claimed here finds it taken and returns."""
    fresh = Q(attempts=0) | BACK_FROM_ENRICHMENT
    waiting = (Q(status=LeadStatus.RECEIVED, attempts=0) | BACK_FROM_ENRICHMENT) & Q(deferrals=0)
    lane = Lead.objects.filter(id=lead_id).values("lane")[:1]
    rows = (
        Lead.objects.filter(
            Q(id=lead_id, status=LeadStatus.PROCESSING, claimed_until=lease)
            | (waiting & Q(lane=Subquery(lane)) & ~Q(id=lead_id))
        )
        .alias(_other=Case(When(id=lead_id, then=Value(0)), default=Value(1)))
        .order_by("_other", *_queue_order())
    )
    if connection.features.has_select_for_update_skip_locked:
        # Only the lead rows: the join to the source (its intake priority) must lock nothing.
        rows = rows.select_for_update(skip_locked=True, no_key=True, of=("self",))
    with transaction.atomic(savepoint=False):
        found = dict(rows.values_list("id", "attempts")[: limit + 1])
        own = found.pop(lead_id, None)
        others = list(found)
        if others:
            claimed = Lead.objects.filter(lead_claimable(), fresh, id__in=others).update(
                status=LeadStatus.PROCESSING,
                claimed_until=lease,
                attempts=Case(
                    When(BACK_FROM_ENRICHMENT, then=F("attempts")), default=F("attempts") + 1
                ),
            )
            if claimed != len(others):  # no row locks (SQLite): which ones this claim won
                won = set(
                    Lead.objects.filter(
                        id__in=others, status=LeadStatus.PROCESSING, claimed_until=lease
                    ).values_list("id", flat=True)
                )
                others = [other for other in others if other in won]
    return [lead_id, *others], own


def lead_process_batched(*, lead_id: uuid.UUID | str) -> int:
    """Run the pipeline for one lead's message (``routing.process_lead``), with up to
    ``ROUTING_BATCH_SIZE`` - 1 other leads waiting in its lane, as one batch
    (``leads_claim_waiting``, then as ``leads_process_batch``): at low traffic a batch of one,
    under a spike batches as large as the backlog allows. The other leads' own messages then
    find their lead taken or done and return after one statement (``lead_claim``).

    A no-op when the lead is not waiting (taken, done). The lead itself, when it was tried
    before, goes one by one after the batch, as ``lead_process`` would route it (its failure
    raised as there); so does everything when the others cannot be claimed (lock contention).
    ``ROUTING_BATCH_WAITING`` off, or ``ROUTING_BATCH_SIZE`` 1: ``lead_process``. Returns how
    many of the batch's other leads failed (each recorded on its lead)."""
    size = settings.ROUTING_BATCH_SIZE
    if not settings.ROUTING_BATCH_WAITING or size <= 1:
        pipeline.lead_process(lead_id=lead_id)
        return 0
    try:
        lead_uuid = uuid.UUID(str(lead_id))
    except ValueError:
        logger.error("process_lead: %r is not a lead id", lead_id)
        return 0
    with log_context(lead_id=lead_uuid):
        lease = pipeline.lead_claim(lead_uuid)
    if lease is None:
        return 0
    claimed = _claim_tried(
        lambda: leads_claim_waiting(lead_uuid, lease, size - 1), "the leads waiting beside one"
    )
    batch, own_attempts = claimed if claimed is not None else ([], None)
    # Tried before (a worker died on it, an attempt failed): alone, so that only the lead that
    # kills its worker reaches the attempt bound (``leads_claim``).
    alone = own_attempts is None or own_attempts > 1
    if alone:
        batch = batch[1:]
    failures = _batch_process(batch, lease) if batch else 0
    if alone:
        with log_context(lead_id=lead_uuid):
            status = lead_process_leased(lead_uuid, lease)
        if status is not None and status not in (LeadStatus.RECEIVED, LeadStatus.PROCESSING):
            lead_status_announce(lead_ids=[lead_uuid])
    return failures


def leads_process_batch(lead_ids: Sequence[uuid.UUID]) -> int:
    """Run the pipeline for these leads, as a batch where it can (module docstring); a no-op
    for a lead another worker holds or has finished. Returns how many leads failed.

    A lead tried before (a worker died or failed on it) goes one by one (``lead_process``):
    after a crash in a batch, its leads are retried one by one, so only the lead that kills
    its worker reaches the attempt bound."""
    from celery.exceptions import SoftTimeLimitExceeded

    claimed, lease = _claim(lead_ids)
    won = set(claimed)
    failures = 0
    if claimed and lease is not None:
        # Worked on in the order the chunk gave (the order they came in), locked in id order.
        position = {lead_id: index for index, lead_id in enumerate(lead_ids)}
        failures += _batch_process(sorted(claimed, key=position.__getitem__), lease)
    for lead_id in lead_ids:
        if lead_id in won:
            continue
        # Tried before (or taken, or done meanwhile): one by one, as lead_process decides.
        try:
            pipeline.lead_process(lead_id=lead_id)
        except SoftTimeLimitExceeded:
            raise
        except Exception:  # recorded on the lead by lead_process; the sweeper retries it
            failures += 1
    return failures


def _batch_process(claimed: list[uuid.UUID], lease: datetime) -> int:
    from celery.exceptions import SoftTimeLimitExceeded

    batch = _Batch(now=timezone.now())
    try:
        with transaction.atomic(durable=True):
            _batch_route(batch, claimed, lease)
    except SoftTimeLimitExceeded:
        raise
    except Exception as exc:
        logger.warning(
            "routing a batch of %d leads failed (%s: %s); routing them one by one",
            len(claimed),
            type(exc).__name__,
            exc,
        )
        batch = _Batch(now=batch.now, leftover=list(claimed))
    if batch.finished:
        lead_status_announce(lead_ids=batch.finished)
    failures = 0
    for lead_id in batch.leftover:
        try:
            status = lead_process_leased(lead_id, lease)
        except SoftTimeLimitExceeded:
            raise
        except Exception:  # recorded on the lead; the sweeper retries it
            failures += 1
            continue
        if status is not None and status not in (LeadStatus.RECEIVED, LeadStatus.PROCESSING):
            lead_status_announce(lead_ids=[lead_id])
    return failures


def _batch_route(batch: _Batch, claimed: list[uuid.UUID], lease: datetime) -> None:
    """The batch transaction (module docstring, step 2)."""
    locking = (
        Lead.objects.select_for_update(of=("self",), no_key=True)
        .select_related("source")
        .filter(id__in=claimed, status=LeadStatus.PROCESSING, claimed_until=lease)
        .order_by("id")
    )
    decide_lock = decide_lock_shared_sql()
    if decide_lock is not None:
        sql, params = decide_lock
        locking = locking.annotate(
            _decide_lock=RawSQL(sql, params, output_field=TextField())  # noqa: S611 - constant
        )
    order = {lead_id: index for index, lead_id in enumerate(claimed)}
    leads = sorted(locking, key=lambda lead: order[lead.pk])  # locked in id order
    batch.loaded = {lead.pk: dict(lead.__dict__) for lead in leads}  # what _leads_save compares
    for lost in set(claimed) - {lead.pk for lead in leads}:
        # Its lease expired meanwhile (a stall) and another worker claimed it: not ours.
        logger.warning("process_lead: lease on lead %s lost; writing nothing", lost)
    waiting = [lead for lead in leads if not _leftover_at_once(lead)]
    batch.leftover += [lead.pk for lead in leads if _leftover_at_once(lead)]
    # Normalised as one by one, but the people's keys found for all at once (3 statements).
    with privacy.person_keys_deferred() as people:
        for lead in waiting:
            if lead.normalized_at is None:
                pipeline.lead_apply_normalization(lead=lead)  # the stage one by one runs
                batch.staged.add(lead.pk)
    if people:
        by_id = {lead.pk: lead for lead in waiting}
        for lead_id, key_id in privacy.person_keys_for(people).items():
            by_id[lead_id].person_key_id = key_id
    _dedup(batch, [lead for lead in waiting if lead.deduped_at is None])
    batch.accounts = _accounts(waiting)
    known = accounts_known.set((batch.accounts.facts, batch.accounts.ids))
    try:
        for lead in waiting:
            _stages(batch, lead)
    finally:
        accounts_known.reset(known)
    if batch.routed:
        _route(batch)
    _leads_save([item.lead for item in batch.routed], batch.loaded)
    batch.finished += [item.lead.pk for item in batch.routed]
    # After the leads' statuses, as one by one records its event after the lead's status: a
    # transaction takes the report counters of leads before those of events (audit.rollups).
    events_record_many(batch.events)


def _lead_columns() -> list[Any]:
    """The lead's columns ``_leads_save`` may write (every concrete one but the key)."""
    return [
        each
        for each in Lead._meta.concrete_fields
        if not each.primary_key and each.db_type(connection) is not None
    ]


# Nothing changes a lead's payload after intake (retention prunes it outside the pipeline): it
# is written only when replaced, never for a change in place.
_WRITTEN_WHEN_REPLACED = frozenset({"raw_payload"})


def _changed(column: Any, leads: list[Lead], loaded: Mapping[uuid.UUID, dict[str, Any]]) -> bool:
    """Whether any of ``leads`` holds another value in ``column`` than when it was loaded. A
    dict or list (a JSON column) may have been changed in place: it counts as changed (but
    the payload, ``_WRITTEN_WHEN_REPLACED``), and so does a lead not loaded by the batch."""
    name = column.attname
    if getattr(column, "auto_now", False):
        return True
    for lead in leads:
        before = loaded.get(lead.pk)
        if before is None or name not in before:
            return True
        now, then = lead.__dict__.get(name), before[name]
        if now is then:
            if isinstance(now, dict | list) and name not in _WRITTEN_WHEN_REPLACED:
                return True
            continue
        if isinstance(now, dict | list) or now != then:
            return True
    return False


def _leads_save(leads: list[Lead], loaded: Mapping[uuid.UUID, dict[str, Any]]) -> None:
    """Save the routed leads, their leases ended. On PostgreSQL in one UPDATE of the columns
    that changed (their stages, statuses, tags; ``loaded``: each lead's values as the batch
    read them) from one array a column (``unnest``: the statement's text and its parameters
    do not grow with the batch, only the arrays): one statement also moves their report
    counters together (``audit.rollups``: the trigger takes a statement's counter rows in key
    order, the order every claim takes them in, so a claim and a batch cannot deadlock on
    them), and a lead costs no UPDATE of its own. (Django's ``bulk_update`` builds a CASE a
    column a lead: 70 ms of Python a lead, measured; a VALUES list of every column, the code
    before, 0.4 ms of Python a lead and PostgreSQL's plan of a 3,000-parameter statement.)
    SQLite, one writer at a time: a save a lead."""
    if not leads:
        return
    for lead in leads:
        lead.claimed_until = None
    if connection.vendor != "postgresql":
        for lead in leads:
            lead.save()
        return
    for lead in leads:  # as save() would (no receiver in the project; a test's fault hook)
        signals.pre_save.send(sender=Lead, instance=lead, raw=False, using=connection.alias)

    def quote(name: str | None) -> str:
        return connection.ops.quote_name(name or "")

    key = Lead._meta.pk
    fields = [each for each in _lead_columns() if _changed(each, leads, loaded)]
    columns = [key, *fields]
    params: list[list[Any]] = [[lead.pk for lead in leads]]
    for each in fields:
        params.append(
            [each.get_db_prep_save(each.pre_save(lead, False), connection) for lead in leads]
        )
    arrays = ", ".join(f"%s::{each.db_type(connection)}[]" for each in columns)
    names = ", ".join(quote(each.column) for each in columns)
    sets = ", ".join(f"{quote(each.column)} = v.{quote(each.column)}" for each in fields)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(Lead._meta.db_table)} AS l SET {sets} "  # noqa: S608 - the model's names
            f"FROM unnest({arrays}) AS v({names}) "
            f"WHERE l.{quote(key.column)} = v.{quote(key.column)}",
            params,
        )
    for lead in leads:
        signals.post_save.send(
            sender=Lead, instance=lead, created=False, raw=False, using=connection.alias
        )


def _stages(batch: _Batch, lead: Lead) -> None:
    """A lead's own stages before routing, as ``_lead_process_claimed`` runs them, or the lead
    left for one-by-one processing (its stages so far saved, its lease kept)."""
    now = batch.now
    changed = lead.pk in batch.staged
    unusual = (
        lead.duplicate_of_id is not None
        or crm_lookup_wanted(lead)
        or (lead.enrichment_status == EnrichmentStatus.NONE and enrichment_http_wanted(lead))
    )
    crm_notes: list[str] = []
    if not unusual:
        crm_owner, crm_notes = _crm_owner(lead, now)
        unusual = crm_owner is not None and lead.enrichment_status == EnrichmentStatus.NONE
    if unusual:
        if changed:
            lead.save()  # still leased (claimed_until kept): lead_process_leased goes on
        batch.leftover.append(lead.pk)
        return
    if lead.enrichment_status == EnrichmentStatus.NONE:
        results = enrichment_builtin(lead)
        if any(r.filled or (r.name == "account" and r.status == "done") for r in results):
            batch.events.append(
                {
                    "type": EventType.ENRICHED,
                    "lead": lead,
                    "at": now,
                    "data": enrichment_event_data(results),
                }
            )
        lead.enrichment_status = EnrichmentStatus.DONE
    notes = [*crm_notes, *(note for note in [enrichment_trace_note(lead)] if note)]
    batch.routed.append(_Routed(lead=lead, notes=notes))


def _leftover_at_once(lead: Lead) -> bool:
    """Erased while it waited, past its attempt bound, or waiting for an ad platform's fetch:
    one by one, before any stage (``_lead_process_claimed`` closes, quarantines or parks it)."""
    return (
        lead.erased_at is not None
        or lead.attempts > settings.LEAD_MAX_ATTEMPTS
        or lead_meta_fetch_wanted(lead)
    )


def _dedup(batch: _Batch, leads: list[Lead]) -> None:
    """``lead_dedup`` for the batch's leads, set-based: every key locked in one statement,
    the earlier leads that may be originals read in one query a key kind, then each lead
    matched in turn, against those and the batch's leads matched before it (as one by one:
    the first copy of a new person in the batch is the original of the next)."""
    if not leads:
        return
    now = batch.now
    since = now - timedelta(days=settings.DEDUP_WINDOW_DAYS)
    dedup_lock_many(key for lead in leads for key in dedup_lock_keys(lead))
    keys = {lead.pk: dedup_keys(lead) for lead in leads}
    wanted: dict[str, set[str]] = {"email": set(), "phone": set()}
    for lead_keys in keys.values():
        for key in lead_keys:
            kind, value = key.split(":", 1)
            wanted[kind].add(value)
    # key -> (received_at, id) of the earliest original seen so far
    originals: dict[str, tuple[datetime, uuid.UUID]] = {}
    for kind, values in wanted.items():
        if not values:
            continue
        rows = (
            Lead.objects.filter(
                **{f"{kind}__in": sorted(values)},
                duplicate_of__isnull=True,
                deduped_at__isnull=False,
                received_at__gte=since,
            )
            .order_by("received_at", "id")
            .values_list(kind, "received_at", "id")
        )
        for value, received_at, lead_id in rows:
            originals.setdefault(f"{kind}:{value}", (received_at, lead_id))
    for lead in leads:
        lead.deduped_at = now
        lead_keys = keys[lead.pk]
        lead.dedup_key = lead_keys[0] if lead_keys else ""
        batch.staged.add(lead.pk)
        for key in lead_keys:
            found = originals.get(key)
            if found is not None and found[1] != lead.pk:
                lead.duplicate_of_id = found[1]
                lead.dedup_key = key
                batch.events.append(
                    {
                        "type": EventType.DUPLICATE_DETECTED,
                        "lead": lead,
                        "at": now,
                        "data": {"original": str(found[1]), "matched_on": key},
                    }
                )
                break
        else:
            if lead.received_at < since:
                continue
            # An original now, for the leads after it (matched on its stored columns).
            for kind in ("email", "phone"):
                value = getattr(lead, kind)
                if value:
                    mine = (lead.received_at, lead.pk)
                    seen = originals.get(f"{kind}:{value}")
                    if seen is None or mine < seen:
                        originals[f"{kind}:{value}"] = mine


@dataclass(frozen=True, slots=True)
class _Accounts:
    """The accounts the batch's leads may match: facts and ids by domain, and the domains
    looked for (a domain outside them was not read)."""

    facts: dict[str, AccountFacts] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)
    domains: frozenset[str] = frozenset()


def _candidates(leads: Iterable[Lead]) -> frozenset[str]:
    found: set[str] = set()
    for lead in leads:
        for domain in (lead.domain, lead.email_domain):
            if domain:
                found.update(_domain_candidates(domain))
    return frozenset(found)


def _accounts(leads: Iterable[Lead]) -> _Accounts:
    """Every account a lead of the batch may match, by domain: one query for all of them
    (``account_for_domain`` and the account provider then look in it, with the same
    nearest-parent rule)."""
    domains = _candidates(leads)
    if not domains:
        return _Accounts()
    facts: dict[str, AccountFacts] = {}
    ids: dict[str, int] = {}
    for row in Account.objects.filter(domain__in=domains).values(
        "id", "domain", "name", "tier", "owner_id"
    ):
        ids[row["domain"]] = row["id"]
        facts[row["domain"]] = AccountFacts(
            name=row["name"] or None,
            tier=row["tier"] or None,
            domain=row["domain"],
            owner_rep_id=row["owner_id"],
        )
    return _Accounts(facts=facts, ids=ids, domains=domains)


def _advance(snap: _DecisionSnapshot, decision: Decision, at: datetime) -> None:
    """The state after ``decision`` was applied: its team's turn moved, its rep one lead more."""
    if decision.rotation_update is not None:
        snap.rotation[decision.rotation_update.team_id] = decision.rotation_update
    if decision.rep_id is not None and decision.rep_id in snap.reps:
        rep = snap.reps[decision.rep_id]
        snap.reps[decision.rep_id] = replace(
            rep,
            open_count=rep.open_count + 1,
            assigned_today=rep.assigned_today + 1,
            last_assigned_at=at,
        )


def _lock_teams(team_ids: Iterable[int]) -> dict[int, RotationState]:
    """Lock the teams (one statement, id order): their turns as read under the lock."""
    ids = sorted(set(team_ids))
    if not ids:
        return {}
    rows = (
        Team.objects.select_for_update(no_key=True)
        .filter(pk__in=ids)
        .order_by("id")
        .values_list("id", "rotation_state")
    )
    return {team_id: RotationState.from_json(team_id, state) for team_id, state in rows}


def _lock_reps(rep_ids: Iterable[int], snap: _DecisionSnapshot, now: datetime) -> dict[int, str]:
    """Lock the reps' rows (one statement, id order), then read their counters in a second
    statement (after the lock: see ``_lock_rep``); the snapshot takes both. Returns each
    locked rep's time zone."""
    ids = sorted(set(rep_ids))
    if not ids:
        return {}
    rows = list(
        Rep.objects.select_for_update(no_key=True)
        .filter(pk__in=ids)
        .order_by("id")
        .values(*_REP_COLUMNS)
    )
    loads = {
        row["rep_id"]: row
        for row in RepLoad.objects.filter(rep_id__in=ids).values(
            "rep_id", "open_count", "timezone", "day_start", "day_count", "prev_start", "prev_count"
        )
    }
    zones: dict[int, str] = {}
    midnights: dict[str, datetime] = {}
    time_off = snap.time_off
    for row in rows:
        zone_name = row["timezone"] or "UTC"
        load = load_from_row(loads.get(row["id"]) or {}, prefix="")
        open_count, today = load_counts(row["id"], zone_name, load, now, midnights)
        fresh = _rep_state(row, open_count, today)
        off = time_off.get(row["id"])
        if off is not None:  # time off is not locked: as the snapshot read it
            fresh = replace(fresh, absences=off.absences, holidays=off.holidays)
        snap.reps[row["id"]] = fresh
        zones[row["id"]] = zone_name
    return zones


def _route(batch: _Batch) -> None:
    """Decide every routable lead of the batch in memory under the teams' and reps' locks,
    then write the outcomes in bulk."""
    now = batch.now
    try:
        config: LiveConfig | None = live_config()
    except RulesetNotFound:
        config = None
    accounts = batch.accounts
    if not _candidates(item.lead for item in batch.routed) <= accounts.domains:
        accounts = _accounts(item.lead for item in batch.routed)  # a stage changed a domain
    to_decide: list[tuple[_Routed, LeadFacts]] = []
    for item in batch.routed:
        unreachable = lead_unreachable_reason(item.lead)
        if unreachable is not None or config is None:
            reason = unreachable or "no ruleset is published: the lead stays unassigned"
            item.decision = Decision(outcome="nothing", reason=reason, trace=())
            item.at = now
            continue
        to_decide.append((item, lead_facts(item.lead, accounts=accounts.facts)))
    if config is None or not to_decide:
        _write(batch, config, {}, {})
        return
    # Only the reps the decisions look at are read (``_decision_snapshot``), a page as many
    # reps longer as the batch has leads: a round robin's batch reads one page.
    extra = len(to_decide)
    plan = _decision_snapshot(config, now, extra=extra)
    read = _DecisionSnapshot(reps={}, rotation=dict(plan.rotation), time_off=plan.time_off)
    # A first pass, without locks: which teams and reps the batch goes to.
    teams: set[int] = set()
    reps: set[int] = set()
    for _item, facts in to_decide:
        decision = _decide(facts, config, plan, now)
        if decision.outcome == "owner":
            if decision.team_id is not None:
                teams.add(decision.team_id)
            if decision.rep_id is not None:
                reps.add(decision.rep_id)
            _advance(plan, decision, now)
    # Teams first, then the reps the first pass chose, each in id order (the order route_lead
    # takes them in too). The reps are read again once the teams are locked (as route_lead
    # reads them again under a team's lock): nobody else can move those teams' turns or give
    # their members a lead through them meanwhile. A rep the decisions under the locks choose
    # that the first pass did not (another worker changed a rep between) is locked then, and
    # the lead decided again.
    turns = _lock_teams(teams)
    snap = _decision_snapshot(config, now, extra=extra, again=read)  # the reps read anew
    snap.rotation.update(turns)
    zones = _lock_reps(reps, snap, now)
    locked_teams = set(teams)
    for item, facts in to_decide:
        for _attempt in range(_MAX_ATTEMPTS):
            at = timezone.now()
            decision = _decide(facts, config, snap, at)
            if decision.outcome != "owner":
                break
            if decision.team_id is not None and decision.team_id not in locked_teams:
                # Not foreseen by the first pass (another worker changed the state between):
                # lock it and its members now, then decide again.
                snap.rotation.update(_lock_teams([decision.team_id]))
                locked_teams.add(decision.team_id)
                continue
            if decision.rep_id is not None and decision.rep_id not in zones:
                zones.update(_lock_reps([decision.rep_id], snap, now))
                continue
            break
        else:
            raise RoutingContention(f"lead {item.lead.pk}: no stable decision in its batch")
        item.decision = decision
        item.at = at
        if decision.outcome == "owner":
            _advance(snap, decision, at)
    _write(batch, config, snap.reps, zones)


def _write(
    batch: _Batch,
    config: LiveConfig | None,
    reps: Mapping[int, Any],
    zones: dict[int, str],
) -> None:
    """The batch's outcomes in bulk: assignments, turns, reps, counters, statuses, events,
    outbox rows."""
    assignments: list[tuple[_Routed, Assignment]] = []
    turns: dict[int, RotationState] = {}
    for item in batch.routed:
        (decision, at), lead = item.outcome(), item.lead
        if decision.outcome != "owner":
            continue
        if config is None or decision.rep_id is None:
            raise RuntimeError(f"lead {lead.pk}: an owner decision without a rep")
        if decision.rotation_update is not None:
            turns[decision.rotation_update.team_id] = decision.rotation_update
        rep = reps[decision.rep_id]
        team = config.teams.get(decision.team_id) if decision.team_id is not None else None
        sla = decision.sla_minutes or _default_sla()
        assignments.append(
            (
                item,
                Assignment(
                    lead=lead,
                    rep_id=rep.id,
                    team_id=team.id if team is not None else None,
                    rule_id=decision.rule_id,
                    rule_name=(decision.rule_name or "")[:200],
                    rep_name=rep.name[:200],
                    team_name=(team.name if team is not None else "")[:200],
                    ruleset_version=decision.ruleset_version,
                    kind=AssignmentKind.INITIAL,
                    reason=decision.reason,
                    trace=stored_trace(decision, item.notes),
                    sla_minutes=sla,
                    sla_due_at=_sla_due(at, sla, rep, team),
                    assigned_at=at,
                    active=True,
                    priority=priority_clean(
                        lead.priority if decision.priority is None else decision.priority
                    ),
                    tags=tags_clean((lead.tags or []) if decision.tags is None else decision.tags),
                ),
            )
        )
    for team_id, turn in sorted(turns.items()):
        Team.objects.filter(pk=team_id).update(rotation_state=turn.to_json())
    if assignments:
        Assignment.objects.bulk_create([assignment for _item, assignment in assignments])
        _reps_assigned(assignments, zones)
    routed_assignments = {item.lead.pk: assignment for item, assignment in assignments}
    for item in batch.routed:
        (decision, at), lead = item.outcome(), item.lead
        assignment = routed_assignments.get(lead.pk)
        status = (
            LeadStatus.ASSIGNED
            if assignment is not None
            else _STATUS.get(decision.outcome, LeadStatus.UNASSIGNED)
        )
        lead_tags_set(lead=lead, priority=decision.priority, tags=decision.tags)
        lead.status = status
        lead.processed_at = at
        result = RouteResult(decision=decision, status=status, assignment=assignment)
        recorded, retries, _changed = decision_retry_fields(lead, result, at)
        if not recorded:
            continue
        if assignment is None:
            batch.events.append(decision_event(lead, result, at, item.notes, retries))
            continue
        batch.events.append(
            {
                "type": EventType.ASSIGNED,
                "lead": lead,
                "at": at,
                "rep_id": assignment.rep_id,
                "team_id": assignment.team_id,
                "rule_id": assignment.rule_id,
                "rep_name": assignment.rep_name,
                "team_name": assignment.team_name,
                "rule_name": assignment.rule_name,
                "ruleset_version": assignment.ruleset_version,
                **assigned_event(assignment, at, decision, retries=retries),
            }
        )
    if assignments:
        deliveries_schedule_fresh([assignment for _item, assignment in assignments])


def _reps_assigned(assignments: list[tuple[_Routed, Assignment]], zones: dict[int, str]) -> None:
    """Each rep's ``last_assigned_at`` and counters, once per rep (and local day), in rep id
    order: the rows are locked already (``_lock_reps``)."""
    last: dict[int, datetime] = {}
    days: dict[tuple[int, datetime], tuple[int, datetime]] = {}
    for _item, assignment in assignments:
        rep_id, at = assignment.rep_id, assignment.assigned_at
        last[rep_id] = max(last.get(rep_id, at), at)
        day = local_midnight(at, zones.get(rep_id, "UTC"))
        count, latest = days.get((rep_id, day), (0, at))
        days[(rep_id, day)] = (count + 1, max(latest, at))
    if connection.vendor == "postgresql":
        ids = sorted(last)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Rep._meta.db_table} AS r SET last_assigned_at = v.at FROM "  # noqa: S608
                "unnest(%s::bigint[], %s::timestamptz[]) AS v(id, at) WHERE r.id = v.id",
                [ids, [last[rep_id] for rep_id in ids]],
            )
    else:
        for rep_id in sorted(last):
            Rep.objects.filter(pk=rep_id).update(last_assigned_at=last[rep_id])
    load_assigned_many(
        counts=[
            (rep_id, zones.get(rep_id, "UTC"), latest, count)
            for (rep_id, _day), (count, latest) in sorted(days.items())
        ]
    )


__all__ = ["leads_claim", "leads_process_batch"]
