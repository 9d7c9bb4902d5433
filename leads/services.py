"""Write services of the leads app: sources, the kickoff, enqueueing, the stale sweeper."""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import logging
import os
import queue
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from audit.models import Event, EventType
from audit.services import (
    event_record,
    events_record_received,
    received_event_hashes,
    received_events_build,
)
from config.broker_filesystem import queue_has_message
from config.celery import app as celery_app
from config.logging import log_context, log_context_add
from leads import lanes, privacy
from leads.batch_sql import batch_statement
from leads.breaker import CircuitBreaker
from leads.broker_publish import broker_priority_steps, raw_publish_possible, raw_publisher
from leads.kickoff_sql import kickoff_statement
from leads.models import (
    CANONICAL_COLUMNS,
    CrmLookupStatus,
    EnrichmentStatus,
    FetchStatus,
    Lead,
    LeadStatus,
    LeadTag,
    Source,
    token_digest,
)
from leads.normalize import is_a_lead, map_fields, normalize
from leads.parsing import IntakeError, Limits, check_value
from leads.priority import priority_clean, priority_is_high, tags_clean
from leads.sources import kind_get, kinds, source_flatten
from leads.sources.base import Record

logger = logging.getLogger(__name__)

PROCESS_LEAD_TASK = "routing.process_lead"
PROCESS_LEADS_TASK = "routing.process_leads"


# --- Sources ---------------------------------------------------------------------------------


def new_token() -> str:
    """A fresh 256-bit source token (or HMAC secret), URL-safe."""
    return secrets.token_urlsafe(32)


@transaction.atomic
def source_set_token(*, source: Source, overlap: timedelta | None = None) -> str:
    """Give ``source`` a new token and return it (shown once; only its hash is kept).

    With ``overlap``, the previous token keeps working that long, so senders can switch over.
    """
    token = new_token()
    now = timezone.now()
    if overlap and source.token_hash:
        source.previous_token_hash = source.token_hash
        source.previous_token_valid_until = now + overlap
    else:
        source.previous_token_hash = ""
        source.previous_token_valid_until = None
    source.token_hash = token_digest(token)
    source.token_hint = token[:6]
    source.save(
        update_fields=[
            "token_hash",
            "token_hint",
            "previous_token_hash",
            "previous_token_valid_until",
            "updated_at",
        ]
    )
    return token


@transaction.atomic
def source_set_hmac_secret(*, source: Source, overlap: timedelta | None = None) -> str:
    """Give ``source`` a new HMAC secret and return it; the old one works for ``overlap``."""
    secret = new_token()
    now = timezone.now()
    if overlap and source.hmac_secret:
        source.previous_hmac_secret = source.hmac_secret
        source.previous_hmac_valid_until = now + overlap
    else:
        source.previous_hmac_secret = ""
        source.previous_hmac_valid_until = None
    source.hmac_secret = secret
    source.save(
        update_fields=[
            "hmac_secret",
            "previous_hmac_secret",
            "previous_hmac_valid_until",
            "updated_at",
        ]
    )
    return secret


@transaction.atomic
def source_create(*, slug: str, name: str, **fields: Any) -> tuple[Source, str]:
    """Create a source with a fresh token; returns the source and the token (shown once)."""
    source = Source(slug=slug, name=name, **fields)
    source.full_clean(exclude=["token_hash"])
    source.save()
    token = source_set_token(source=source)
    return source, token


# --- Kickoff ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Accepted:
    """A record the kickoff accepted (or recognised as a replay of an earlier request)."""

    lead_id: uuid.UUID
    replayed: bool = False
    # When the lead was received (None: not known here); its status URL's lifetime counts from
    # it, so a replay is answered with the same status URL as the first request.
    received_at: datetime | None = None


@dataclass
class _Prepared:
    index: int
    record: dict[str, Any]
    key: str | None
    fingerprint: str
    lead_id: uuid.UUID = field(default_factory=uuid.uuid4)
    # The record's canonical JSON (what the fingerprint hashes): the stored payload's text.
    canonical_json: str = ""
    # The key is the tool's own id of the submission, read by the source's kind: the tool's
    # retry may differ in its envelope (a delivery attempt counter) and is still a replay.
    vendor_key: bool = False


def record_fingerprint(record: dict[str, Any]) -> str:
    """SHA-256 of the record's canonical JSON: the same body always gives the same print."""
    return _fingerprint(_canonical_json(record))


def _canonical_json(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _fingerprint(canonical_json: str) -> str:
    return hashlib.sha256(canonical_json.encode("utf-8")).hexdigest()


def _idempotency_key(canonical: dict[str, Any], header_key: str | None) -> str | None:
    if header_key:
        return header_key
    external = canonical.get("external_id")
    if external is None or isinstance(external, (dict, list, bool)):
        return None
    key = str(external).strip()
    if len(key) > 255:
        # Truncating would make two long ids with a common start collide.
        return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return key or None


def record_redact(source: Source, record: dict[str, Any]) -> dict[str, Any]:
    """The record without what any kind says must never be stored (a secret in the body), the
    source's own kind first: a Google Ads lead at a generic source keeps no ``google_key``."""
    for name, redact in _redactors(source.kind):
        try:
            cleaned = redact(dict(record))
        except Exception:  # a redactor that cannot read the record: store it, not lose it
            logger.exception("the %s kind could not redact a record", name)
            continue
        if isinstance(cleaned, dict):
            record = cleaned
    return record


@functools.cache
def _redactors(name: str | None) -> tuple[tuple[str, Callable[[Record], Record]], ...]:
    """The kinds' redactors (kind name, redact), the kind called ``name`` first."""
    own = kind_get(name)
    ordered = (own, *(other for other in kinds().values() if other is not own))
    return tuple((kind.name, kind.redact) for kind in ordered if kind.redact is not None)


def _fetch_notice(source: Source, record: dict[str, Any]) -> str | None:
    return fetch_notice(kind=source.kind, options=source.kind_options, record=record)


def fetch_notice(*, kind: str, options: Any, record: dict[str, Any]) -> str | None:
    """``kind``'s word on a record naming a lead its worker fetches ("" accepts it; see
    ``SourceKind.awaits_fetch``), None when the kind has no such notices or cannot tell."""
    awaits = kind_get(kind).awaits_fetch
    if awaits is None:
        return None
    options = options if isinstance(options, dict) else {}
    try:
        notice = awaits(record, options)
    except Exception:  # a kind that cannot read the record: judged as any record
        logger.exception("the %s kind could not tell whether a record awaits a fetch", kind)
        return None
    return notice if isinstance(notice, str) else None


NOT_A_LEAD_MESSAGE = "Not a lead: it needs an e-mail, a phone, or a company together with a name."


def _prepare(
    source: Source,
    record: dict[str, Any],
    header_key: str | None,
    index: int,
    limits: Limits | None = None,
    fallback_key: str | None = None,
) -> _Prepared:
    if not isinstance(record, dict):
        raise IntakeError(400, "invalid_body", "A lead must be a JSON object.")
    if limits is not None:
        check_value(record, limits, where="record")
    record = record_redact(source, record)
    flat = source_flatten(source, record)
    canonical = flat.canonical
    if canonical is None:
        canonical, _custom = map_fields(flat.record, source.field_map or None)
    if not (flat.lead or is_a_lead(canonical)):
        notice = _fetch_notice(source, record)
        if notice != "":  # not a notice of a lead the worker fetches (or one it cannot fetch)
            message = NOT_A_LEAD_MESSAGE + (notice or "")
            if flat.decoder_error:
                message += f" (The {source.kind} decoder failed: {flat.decoder_error})"
            raise IntakeError(422, "not_a_lead", message)
    record_key = _idempotency_key(canonical, None) if not header_key else None
    text = _canonical_json(record)
    return _Prepared(
        index=index,
        record=record,
        key=_idempotency_key(canonical, header_key) or fallback_key,
        fingerprint=_fingerprint(text),
        vendor_key=bool(record_key) and (source.kind or "generic") != "generic",
        canonical_json=text,
    )


def _same_person_and_values(source: Source, first: Any, second: Any) -> bool:
    """Whether two records of one source read as the same canonical lead (their envelopes, a
    delivery counter say, may differ)."""
    field_map = source.field_map or None
    return (
        normalize(source_flatten(source, first).record, field_map).fields
        == normalize(source_flatten(source, second).record, field_map).fields
    )


def _replay(
    item: _Prepared,
    existing_id: uuid.UUID,
    existing_print: str,
    existing_record: Any = None,
    *,
    source: Source | None = None,
    received_at: datetime | None = None,
) -> Accepted:
    """The first lead for a repeated key, or 422 when the key came with another body.

    A key the kind read from the tool's own id is a retry when the body reads as the same
    lead, even if its envelope changed; a person's id sent again with other values is not.
    """
    if existing_print != item.fingerprint and not (
        item.vendor_key
        and source is not None
        and existing_record is not None
        and _same_person_and_values(source, existing_record, item.record)
    ):
        raise IntakeError(
            422,
            "idempotency_key_reused",
            "This idempotency key was already used with a different body.",
        )
    return Accepted(lead_id=existing_id, replayed=True, received_at=received_at)


def _new_lead(source: Source, item: _Prepared, now: datetime, lane: str) -> Lead:
    return Lead(
        id=item.lead_id,
        source=source,
        lane=lane,
        raw_payload=item.record,
        idempotency_key=item.key,
        request_fingerprint=item.fingerprint,
        received_at=now,
        queued_at=now,
    )


def lead_ingest(
    *,
    source: Source,
    record: dict[str, Any],
    idempotency_key: str | None = None,
    fallback_key: str | None = None,
    actor: str | None = None,
    received_data: dict[str, Any] | None = None,
    path: str = lanes.SINGLE,
) -> Accepted:
    """The kickoff for one record: check it is a lead, store it, enqueue it after commit.

    A repeated idempotency key with the same body answers with the first lead (a replay); with
    another body it is refused. Two concurrent requests with one key store one lead: the second
    waits on the unique index and then replays the first. ``fallback_key`` is the key when the
    request and the record name none; ``actor`` and ``received_data`` describe a lead taken in
    by a person (a re-accepted refusal) in its ``received`` event. ``path`` (leads.lanes) is
    how it arrived, which picks its lane when the source names none.
    """
    lane = lanes.lane_for(source.lane, path)
    with log_context(source=source.slug):  # every line logged meanwhile names the source
        return _lead_ingest(
            source, record, idempotency_key, fallback_key, actor, received_data, lane
        )


def _lead_ingest(
    source: Source,
    record: dict[str, Any],
    idempotency_key: str | None,
    fallback_key: str | None,
    actor: str | None,
    received_data: dict[str, Any] | None,
    lane: str,
) -> Accepted:
    item = _prepare(source, record, idempotency_key, 0, fallback_key=fallback_key)
    if item.key is not None:
        existing = (
            Lead.objects.filter(source=source, idempotency_key=item.key)
            .values_list("id", "request_fingerprint", "raw_payload", "received_at")
            .first()
        )
        if existing is not None:
            return _replay(item, *existing[:3], source=source, received_at=existing[3])
    log_context_add(lead_id=item.lead_id)  # a new lead (a replay returned above)
    try:
        # The lead and its `received` audit event in one transaction; the enqueue runs once it
        # is committed (at the outer commit if a caller wraps this in a transaction).
        now = timezone.now()
        if actor is None and kickoff_statement.available():
            # One statement, one commit (PostgreSQL), and no model instance built.
            kickoff_statement.insert(
                lead_id=item.lead_id,
                source_id=source.pk,
                lane=lane,
                raw_payload=item.record,
                idempotency_key=item.key,
                request_fingerprint=item.fingerprint,
                received_at=now,
                actor=f"source:{source.slug}",
            )
        else:
            lead = _new_lead(source, item, now, lane)
            received = None
            if actor is None:
                [received] = received_events_build(leads=[lead], actor=f"source:{source.slug}")
            with transaction.atomic():
                lead.save(force_insert=True)
                if received is not None:
                    Event.objects.bulk_create([received])
                else:
                    event_record(
                        type=EventType.RECEIVED,
                        lead=lead,
                        actor=str(actor),
                        at=lead.received_at,
                        data=received_data or {},
                    )
        leads_enqueue_after_commit([item.lead_id], lane=lane, high=source_is_high(source))
    except IntegrityError:
        if item.key is None:
            raise
        winner = (
            Lead.objects.filter(source=source, idempotency_key=item.key)
            .values_list("id", "request_fingerprint", "raw_payload", "received_at")
            .first()
        )
        if winner is None:
            raise
        return _replay(item, *winner[:3], source=source, received_at=winner[3])
    return Accepted(lead_id=item.lead_id, received_at=now)


def lead_ingest_batch(
    *,
    source: Source,
    records: Sequence[Any],
    limits: Limits | None = None,
    path: str = lanes.BATCH,
) -> list[Accepted | IntakeError]:
    """The kickoff for a batch: each record judged on its own, accepted ones bulk-inserted.

    One SELECT finds earlier uses of the batch's idempotency keys, one bulk INSERT stores the new
    leads (conflicting keys are skipped by the database and then resolved as replays), and the
    new leads are enqueued together after commit, in the source's lane (else bulk: a batch
    request is bulk even with one record).
    """
    lane = lanes.lane_for(source.lane, path)
    with log_context(source=source.slug):  # every line logged meanwhile names the source
        return _lead_ingest_batch(source, records, limits, lane)


def _lead_ingest_batch(
    source: Source, records: Sequence[Any], limits: Limits | None, lane: str
) -> list[Accepted | IntakeError]:
    outcomes: list[Accepted | IntakeError | None] = [None] * len(records)
    prepared: list[_Prepared] = []
    for index, record in enumerate(records):
        try:
            prepared.append(_prepare(source, record, None, index, limits))
        except IntakeError as error:
            outcomes[index] = error

    keys = {item.key for item in prepared if item.key is not None}
    known: dict[str, tuple[uuid.UUID, str]] = {}
    if keys:
        for key, lead_id, fingerprint in Lead.objects.filter(
            source=source, idempotency_key__in=keys
        ).values_list("idempotency_key", "id", "request_fingerprint"):
            if key is not None:
                known[key] = (lead_id, fingerprint)

    to_insert: list[_Prepared] = []
    first_in_batch: dict[str, _Prepared] = {}
    repeats: list[tuple[_Prepared, _Prepared]] = []  # (later record, first with its key)
    for item in prepared:
        if item.key is not None and item.key in known:
            outcomes[item.index] = _replay_or_error(item, *known[item.key])
        elif item.key is not None and item.key in first_in_batch:
            repeats.append((item, first_in_batch[item.key]))
        else:
            if item.key is not None:
                first_in_batch[item.key] = item
            to_insert.append(item)

    inserted: set[uuid.UUID] = set()
    winners: dict[str, tuple[uuid.UUID, str]] = {}
    if to_insert:
        inserted, winners = _insert_batch(source, to_insert, lane)
        for item in to_insert:
            if item.lead_id in inserted:
                outcomes[item.index] = Accepted(lead_id=item.lead_id)
            else:  # only keyed rows can conflict
                outcomes[item.index] = _replay_or_error(item, *winners[str(item.key)])
        leads_enqueue_after_commit(
            [item.lead_id for item in to_insert if item.lead_id in inserted],
            lane=lane,
            high=source_is_high(source),
        )

    # A key repeated inside the batch replays whichever lead now holds that key.
    for item, first in repeats:
        holder = winners.get(str(first.key))
        if first.lead_id in inserted or holder is None:
            outcomes[item.index] = _replay_or_error(item, first.lead_id, first.fingerprint)
        else:
            outcomes[item.index] = _replay_or_error(item, *holder)
    return [outcome for outcome in outcomes if outcome is not None]


_RETRYABLE_SQLSTATES = {"40P01", "40001"}  # deadlock detected, serialization failure


def _is_retryable(exc: BaseException) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) in _RETRYABLE_SQLSTATES


def _insert_batch(
    source: Source, to_insert: list[_Prepared], lane: str
) -> tuple[set[uuid.UUID], dict[str, tuple[uuid.UUID, str]]]:
    """Bulk-insert; return the ids stored and, for keys a concurrent request took, the winners.

    Rows go in sorted by idempotency key, so concurrent batches sharing keys take their index
    locks in one order and cannot deadlock; a deadlock or serialization failure from anything
    else is retried.
    """
    rows = sorted(to_insert, key=lambda item: (item.key is None, item.key or ""))
    for attempt in range(3):
        try:
            return _insert_batch_once(source, rows, lane)
        except OperationalError as exc:
            if attempt == 2 or not _is_retryable(exc):
                raise
            logger.warning("batch insert for %s retried after %s", source.slug, exc)
    raise AssertionError("unreachable")


def _insert_batch_once(
    source: Source, rows: list[_Prepared], lane: str
) -> tuple[set[uuid.UUID], dict[str, tuple[uuid.UUID, str]]]:
    now = timezone.now()
    actor = f"source:{source.slug}"
    winners: dict[str, tuple[uuid.UUID, str]] = {}
    with transaction.atomic(durable=True):
        if batch_statement.usable():
            # One statement: the leads (a key a concurrent request took is skipped) and the
            # events of those stored, which it returns (leads.batch_sql).
            hashes = received_event_hashes(
                lead_ids=[item.lead_id for item in rows], at=now, actor=actor
            )
            inserted = batch_statement.execute(
                rows=[
                    (item.lead_id, item.key, item.fingerprint, item.canonical_json, hashed)
                    for item, hashed in zip(rows, hashes, strict=True)
                ],
                source_id=source.pk,
                lane=lane,
                now=now,
                actor=actor,
            )
        else:
            new_leads = [_new_lead(source, item, now, lane) for item in rows]
            Lead.objects.bulk_create(new_leads, batch_size=500, ignore_conflicts=True)
            # A concurrent request may have taken some keys between our SELECT and INSERT:
            # the database skipped those rows; find out which, and replay the winners.
            # Unkeyed rows cannot conflict (their ids are fresh UUIDs).
            keyed_ids = [item.lead_id for item in rows if item.key is not None]
            inserted = {item.lead_id for item in rows if item.key is None}
            if keyed_ids:
                inserted.update(Lead.objects.filter(id__in=keyed_ids).values_list("id", flat=True))
            events_record_received(
                leads=[lead for lead in new_leads if lead.pk in inserted], actor=actor
            )
        lost = [item.key for item in rows if item.lead_id not in inserted]
        if lost:
            winners = {
                key: (lead_id, fingerprint)
                for key, lead_id, fingerprint in Lead.objects.filter(
                    source=source, idempotency_key__in=lost
                ).values_list("idempotency_key", "id", "request_fingerprint")
                if key is not None
            }
    return inserted, winners


def _replay_or_error(
    item: _Prepared, lead_id: uuid.UUID, fingerprint: str
) -> Accepted | IntakeError:
    try:
        return _replay(item, lead_id, fingerprint)
    except IntakeError as error:
        return error


# Parked for enrichment or the CRM lookup (no lease) and that queue is done with it, either way:
# the routing worker may claim it again. (A lead back from its CRM lookup has not been parked
# for HTTP enrichment yet; one parked there waits for that, whatever its CRM lookup says.)
BACK_FROM_ENRICHMENT = Q(status=LeadStatus.PROCESSING, claimed_until__isnull=True) & (
    Q(enrichment_status__in=(EnrichmentStatus.DONE, EnrichmentStatus.FAILED))
    | Q(
        crm_status__in=(CrmLookupStatus.DONE, CrmLookupStatus.FAILED),
        enrichment_status=EnrichmentStatus.NONE,
    )
    # Fetched from the vendor's API (routing/fetch/), before any other stage parked it.
    | Q(
        fetch_status=FetchStatus.DONE,
        crm_status=CrmLookupStatus.NONE,
        enrichment_status=EnrichmentStatus.NONE,
    )
)


# --- Enqueueing ------------------------------------------------------------------------------


# After a failed publish, skip publishing for a while (the sweeper delivers those leads): the
# kickoff stays fast while the broker is down or hung.
broker_breaker = CircuitBreaker()


class BackgroundPublisher:
    """Publishes from a thread of the web process, so no request ever waits on the broker.

    The kickoff hands the committed lead ids over and answers at once; a bounded queue and
    one daemon thread per process do the publishing (with the breaker and timeouts of
    ``leads_enqueue``). If the queue is full or the process dies first, the ids are only
    delayed: the leads are committed and the stale sweeper re-enqueues them.
    """

    DRAIN_MAX = 200  # kickoffs' ids published together, at most

    def __init__(self, maxsize: int = 10_000) -> None:
        self._maxsize = maxsize
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[list[uuid.UUID], str | None, bool | None]] = queue.Queue(
            maxsize
        )
        self._thread: threading.Thread | None = None
        self._pid = 0

    def submit(
        self, lead_ids: Sequence[uuid.UUID], lane: str | None = None, high: bool | None = None
    ) -> bool:
        """Queue these ids (all in ``lane`` and of priority ``high``; None: look them up) for
        publishing; False (logged) when the queue is full."""
        if not lead_ids:
            return True
        self._ensure_thread()
        try:
            self._queue.put_nowait((list(lead_ids), lane, high))
        except queue.Full:
            logger.error("publish queue full; %d lead(s) left for the stale sweeper", len(lead_ids))
            return False
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far was handed to the broker (or gave up)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _ensure_thread(self) -> None:
        pid = os.getpid()
        if self._thread is not None and self._thread.is_alive() and self._pid == pid:
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive() and self._pid == pid:
                return
            if self._pid != pid:  # a forked child must not share its parent's queue
                self._queue = queue.Queue(self._maxsize)
            self._pid = pid
            self._thread = threading.Thread(
                target=self._run, name="leadrouter-publisher", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        work = self._queue
        while True:
            # What queued up meanwhile goes out with it: one round trip for all (on Redis).
            items = [work.get()]
            while len(items) < self.DRAIN_MAX:
                try:
                    items.append(work.get_nowait())
                except queue.Empty:
                    break
            try:
                leads_enqueue_groups(items)
            except Exception:  # leads_enqueue_groups does not raise; never let the thread die
                logger.exception("background publish failed")
            finally:
                for _item in items:
                    work.task_done()


publisher = BackgroundPublisher()
atexit.register(publisher.flush, 2.0)


def leads_enqueue_after_commit(
    lead_ids: Sequence[uuid.UUID], *, lane: str | None = None, high: bool | None = None
) -> None:
    """The kickoff's enqueue: in the background (default) or inline (ENQUEUE_IN_BACKGROUND).

    ``lane`` and ``high``: the lane of every one of these leads and whether they go at their
    lane's high priority, when the caller knows both (the kickoff: its source's); if either is
    None both are read from the rows when publishing (``lead_queue_facts``)."""
    ids = list(lead_ids)
    if settings.ENQUEUE_IN_BACKGROUND:
        transaction.on_commit(lambda: publisher.submit(ids, lane, high), robust=True)
    else:
        transaction.on_commit(lambda: leads_enqueue(ids, lane=lane, high=high), robust=True)


def source_is_high(source: Source) -> bool:
    """Whether a new lead of this source is published at its lane's high priority: the
    source's intake priority is one of ``HIGH_PRIORITIES`` (read from the cached source)."""
    return priority_is_high(source.intake_priority, settings.HIGH_PRIORITIES)


def lead_priority_known(priority: str | None, source_priority: str | None) -> str:
    """The priority a lead is queued by: its own (a tag rule's, once routed), else its
    source's intake priority."""
    return priority_clean(priority) or priority_clean(source_priority)


def lead_queue_facts(lead_ids: Sequence[uuid.UUID | str]) -> dict[str, tuple[str, bool]]:
    """Each id's lane and whether it goes at its lane's high priority (str(id) → (lane,
    high)), in one query: high when the lead's priority (else its source's intake priority) is
    one of ``HIGH_PRIORITIES``. An id with no row, or a database that does not answer, is
    normal lane, normal priority (the message is only a wake-up call)."""
    try:
        known = {
            str(lead_id): (lane, lead_priority_known(priority, source_priority))
            for lead_id, lane, priority, source_priority in Lead.objects.filter(
                id__in=list(lead_ids)
            ).values_list("id", "lane", "priority", "source__intake_priority")
        }
    except Exception as exc:
        logger.warning("could not read the lanes of %d lead(s) (%s)", len(lead_ids), exc)
        known = {}
    facts: dict[str, tuple[str, bool]] = {}
    for lead_id in lead_ids:
        lane, priority = known.get(str(lead_id), (None, ""))
        facts[str(lead_id)] = (
            lanes.lane_clean(lane),
            priority_is_high(priority, settings.HIGH_PRIORITIES),
        )
    return facts


def lead_lanes(lead_ids: Sequence[uuid.UUID | str]) -> dict[str, str]:
    """Each id's lane (str(id) → lane), in one query; an id with no row, or a database that
    does not answer, is normal: the message is only a wake-up call, and a normal-lane one
    still gets the lead's work done."""
    try:
        known = {
            str(lead_id): lane
            for lead_id, lane in Lead.objects.filter(id__in=list(lead_ids)).values_list(
                "id", "lane"
            )
        }
    except Exception as exc:
        logger.warning("could not read the lanes of %d lead(s) (%s)", len(lead_ids), exc)
        known = {}
    return {str(lead_id): lanes.lane_clean(known.get(str(lead_id))) for lead_id in lead_ids}


def leads_by_lane(lead_ids: Sequence[uuid.UUID | str]) -> dict[str, list[uuid.UUID | str]]:
    """These ids grouped by their leads' lanes (``lead_lanes``), in the order given."""
    known = lead_lanes(lead_ids)
    groups: dict[str, list[uuid.UUID | str]] = {}
    for lead_id in lead_ids:
        groups.setdefault(known[str(lead_id)], []).append(lead_id)
    return groups


class RealtimePeek:
    """Whether a realtime routing message is waiting in the broker, asked cheaply and often.

    A worker routing a bulk chunk asks between leads (at most every
    ``ROUTING_CHUNK_PEEK_SECONDS``) and hands the rest of its chunk back when a realtime lead
    waits, so a form lead waits for the lead in progress, not for the chunk's time slice. On
    Redis one ``LLEN`` per priority list of ``routing.realtime``, on a connection of its own
    kept by the process; on the filesystem broker a look at its queue folder for a
    ``routing.realtime`` message. If Redis does not answer, the answer is "no" and the time
    slice alone applies."""

    def __init__(self) -> None:
        self._client: Any = None
        self._keys: list[str] = []
        self._broken_until = 0.0

    def _connect(self) -> Any:
        if self._client is None:
            import redis
            from kombu.transport.redis import Channel

            self._client = redis.Redis.from_url(
                settings.CELERY_BROKER_URL,
                socket_connect_timeout=settings.CELERY_BROKER_CONNECTION_TIMEOUT,
                socket_timeout=0.5,
            )
            name = lanes.routing_queue(lanes.REALTIME)
            steps = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("priority_steps") or [0, 3, 6, 9]
            self._keys = [name if step == 0 else f"{name}{Channel.sep}{step}" for step in steps]
        return self._client

    def waiting(self) -> bool:
        if settings.BROKER_IS_FILESYSTEM:
            return queue_has_message(
                settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"],
                lanes.routing_queue(lanes.REALTIME),
            )
        if time.monotonic() < self._broken_until:
            return False
        try:
            client = self._connect()
            pipe = client.pipeline(transaction=False)
            for key in self._keys:
                pipe.llen(key)
            return any(int(length) for length in pipe.execute())
        except Exception as exc:  # a hint only: the chunk's time slice still applies
            self._broken_until = time.monotonic() + settings.BROKER_BREAKER_SECONDS
            logger.warning("could not see the realtime queue (%s): %s", type(exc).__name__, exc)
            return False


realtime_peek = RealtimePeek()


def leads_enqueue(
    lead_ids: Sequence[uuid.UUID | str], *, lane: str | None = None, high: bool | None = None
) -> int:
    """Publish processing tasks for these leads; never raises. Returns how many were published.

    Each lead's message goes to its lane's routing queue (``leads.lanes``): ``lane`` when the
    caller knows it for all of them, else read from their rows. A lead whose priority is
    known (``high``, else read with the lane: the lead's own from a tag rule, else its
    source's intake priority) goes at its lane's high broker priority when it is high
    (``lanes.routing_priority``): a worker takes it before the normal ones waiting in that lane.
    One message for a single lead,
    one per ``ENQUEUE_CHUNK_SIZE`` ids for a batch. Called after commit. A failure is logged
    and left to ``leads_requeue_stale``: the lead row is the outbox, the message only a wake-up
    call. Publishing is tried once, with the broker's short connect timeout: a kickoff must not
    wait on a broker that is down or hung. What was published is the first ones given, in
    order, unless the leads span lanes (the stale sweeper passes one lane at a time).
    """
    return leads_enqueue_groups([(lead_ids, lane, high)])


def _queue_groups(
    lead_ids: Sequence[uuid.UUID | str], lane: str | None, high: bool | None
) -> dict[tuple[str, bool], list[uuid.UUID | str]]:
    """These ids by (lane, high), as given or read from their rows, in the order given."""
    if lane and high is not None:
        return {(lanes.lane_clean(lane), high): list(lead_ids)}
    facts = lead_queue_facts(lead_ids)
    groups: dict[tuple[str, bool], list[uuid.UUID | str]] = {}
    for lead_id in lead_ids:
        row_lane, row_high = facts[str(lead_id)]
        groups.setdefault((lanes.lane_clean(lane) if lane else row_lane, row_high), []).append(
            lead_id
        )
    return groups


def leads_enqueue_groups(
    groups: Sequence[tuple[Sequence[uuid.UUID | str], str | None, bool | None]],
) -> int:
    """``leads_enqueue`` for several groups of ids at once, each its own messages (a group is
    one kickoff's ids, with their lane and priority when known): on Redis all of them in one
    round trip
    (``leads.broker_publish``), else through kombu one by one. Never raises; returns how many
    leads were published."""
    total = sum(len(ids) for ids, _lane, _high in groups)
    if not total:
        return 0
    if not broker_breaker.allows():
        logger.warning("broker marked down; %d lead(s) left for the stale sweeper", total)
        return 0
    size = max(1, settings.ENQUEUE_CHUNK_SIZE)
    steps = broker_priority_steps()
    messages: list[tuple[str, list[Any], str, int, int]] = []
    for lead_ids, lane, high in groups:
        if not lead_ids:
            continue
        # High first: what is published first is consumed first at a shared step, and a
        # partial publish (counted from the first) is then of the high ones.
        by_queue = sorted(_queue_groups(lead_ids, lane, high).items(), key=lambda kv: not kv[0][1])
        for (group_lane, group_high), ids in by_queue:
            queue_name = lanes.routing_queue(group_lane)
            priority = lanes.routing_priority(group_lane, group_high, steps)
            for i in range(0, len(ids), size):
                chunk = ids[i : i + size]
                if len(chunk) == 1:
                    messages.append((PROCESS_LEAD_TASK, [str(chunk[0])], queue_name, 1, priority))
                else:
                    args = [[str(lead_id) for lead_id in chunk]]
                    messages.append((PROCESS_LEADS_TASK, args, queue_name, len(chunk), priority))
    published = 0
    try:
        if raw_publish_possible():
            raw_publisher.publish(
                [(name, args, queue, pri) for name, args, queue, _n, pri in messages]
            )
            published = total
        else:
            with celery_app.producer_or_acquire() as producer:
                for name, args, queue_name, count, priority in messages:
                    celery_app.send_task(
                        name,
                        args=args,
                        producer=producer,
                        retry=False,
                        queue=queue_name,
                        priority=priority,
                    )
                    published += count
    except Exception as exc:  # any broker failure: the sweeper re-enqueues what was not published
        broker_breaker.trip(settings.BROKER_BREAKER_SECONDS)
        logger.error(
            "could not enqueue %d of %d lead(s) (%s: %s); publishing paused for %.0f s, "
            "the stale sweeper will retry them",
            total - published,
            total,
            type(exc).__name__,
            exc,
            settings.BROKER_BREAKER_SECONDS,
        )
    else:
        broker_breaker.reset()
    return published


def lead_enqueue_later(
    lead_id: uuid.UUID, *, delay: float, lane: str | None = None, high: bool | None = None
) -> bool:
    """Publish one lead's processing task to run after ``delay`` seconds, to its lane's queue
    at its priority (``lane`` and ``high``, else read from its row); never raises.

    For short delays only (well inside the broker's visibility timeout). A failed publish is
    logged and left to the stale sweeper.
    """
    if not broker_breaker.allows():
        return False
    ((lane, high),) = _queue_groups([lead_id], lane, high)
    try:
        celery_app.send_task(
            PROCESS_LEAD_TASK,
            args=[str(lead_id)],
            countdown=max(0.0, delay),
            retry=False,
            queue=lanes.routing_queue(lane),
            priority=lanes.routing_priority(lane, high, broker_priority_steps()),
        )
    except Exception as exc:
        broker_breaker.trip(settings.BROKER_BREAKER_SECONDS)
        logger.error(
            "could not re-enqueue lead %s (%s); left to the sweeper",
            lead_id,
            exc,
            extra={"lead_id": str(lead_id)},
        )
        return False
    return True


def leads_release_abandoned_enrichment(*, now: datetime, batch_size: int = 500) -> int:
    """Leads parked for enrichment that no enrichment worker touched for the provider's whole
    budget (``ENRICHMENT_HTTP_MAX_WAIT_SECONDS`` and a lease): nobody drains that queue. They
    are marked enrichment-failed, so routing takes them without it (the sweeper then sends
    them, like any lead handed back)."""
    wait = settings.ENRICHMENT_HTTP_MAX_WAIT_SECONDS + settings.ENRICHMENT_LEASE_SECONDS
    reason = f"no enrichment worker took it within {wait:.0f} s"
    released = 0
    with transaction.atomic():
        stuck = Lead.objects.filter(
            status=LeadStatus.PROCESSING,
            claimed_until__isnull=True,
            enrichment_status=EnrichmentStatus.PENDING,
            enrichment_next_at__lt=now - timedelta(seconds=wait),
        ).order_by("enrichment_next_at")
        if connection.features.has_select_for_update_skip_locked:
            stuck = stuck.select_for_update(skip_locked=True, no_key=True)
        for lead in stuck[:batch_size]:
            record = dict(lead.enrichment) if isinstance(lead.enrichment, dict) else {}
            record["http"] = {**record.get("http", {}), "status": "failed", "reason": reason}
            lead.enrichment = record
            lead.enrichment_status = EnrichmentStatus.FAILED
            lead.save(update_fields=["enrichment", "enrichment_status"])
            event_record(
                type=EventType.ENRICHMENT_FAILED,
                lead=lead,
                at=now,
                data={"provider": "http", "reason": reason},
            )
            released += 1
    if released:
        logger.error("%d lead(s) waited for enrichment with no worker; routed without it", released)
    return released


def leads_requeue_stale(
    *,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
    max_batches: int = 20,
    now: datetime | None = None,
) -> int:
    """Re-enqueue leads waiting in ``received`` too long (lost message, broker outage), and
    leads left in ``processing`` by a worker that died (lease expired).

    Works in bounded batches. Each batch is claimed with ``FOR UPDATE SKIP LOCKED`` on
    PostgreSQL (SQLite serialises writers), published, and only what was published is stamped
    ``requeued_at``, so several sweepers running at once never enqueue the same lead twice in
    one period, and a lead whose publish failed is tried again on the next run.
    """
    if older_than is None:
        older_than = timedelta(seconds=settings.REQUEUE_STALE_AFTER_SECONDS)
    batch_size = batch_size or settings.REQUEUE_STALE_BATCH_SIZE
    now = now or timezone.now()
    leads_release_abandoned_enrichment(now=now, batch_size=batch_size)
    cutoff = now - older_than
    high_priorities = settings.HIGH_PRIORITIES
    total = 0
    for _ in range(max_batches):
        with transaction.atomic(durable=True):
            # Measured from when it entered the queue: a lead just re-routed is not stale.
            waiting = Q(status=LeadStatus.RECEIVED, queued_at__lt=cutoff)
            # A worker died while holding the lead: its lease ran out.
            abandoned = Q(status=LeadStatus.PROCESSING, claimed_until__lt=now)
            # Back from enrichment, but the message handing it to routing was lost.
            handed_back = BACK_FROM_ENRICHMENT & Q(queued_at__lt=cutoff)
            stale = (
                Lead.objects.filter(waiting | abandoned | handed_back)
                .filter(Q(requeued_at__isnull=True) | Q(requeued_at__lt=cutoff))
                .order_by("queued_at")
            )
            if connection.features.has_select_for_update_skip_locked:
                # Only the lead rows (``OF self``): the join to the source for its intake
                # priority must not lock the source, or a concurrent sweeper (or an admin saving
                # the source) would see every lead of that source as locked and skip them all.
                stale = stale.select_for_update(skip_locked=True, no_key=True, of=("self",))
            rows = [
                (lead_id, lanes.lane_clean(lane), priority_is_high(known, high_priorities))
                for lead_id, lane, known in (
                    (lead_id, lane, lead_priority_known(priority, source_priority))
                    for lead_id, lane, priority, source_priority in stale.values_list(
                        "id", "lane", "priority", "source__intake_priority"
                    )[:batch_size]
                )
            ]
            ids = [lead_id for lead_id, _lane, _high in rows]
            # The rows are old and committed, so publishing inside this transaction is safe;
            # it lets the stamp cover exactly what reached the broker. Each lead to its own
            # lane's queue, a lane at a time (realtime first), its high-priority leads first
            # (``leads_enqueue``), so what was published is known.
            published = 0
            for lane, high in ((lane, high) for lane in lanes.LANES for high in (True, False)):
                lane_ids = [
                    lead_id
                    for lead_id, row_lane, row_high in rows
                    if (row_lane, row_high) == (lane, high)
                ]
                if not lane_ids:
                    continue
                sent = leads_enqueue(lane_ids, lane=lane, high=high)
                if sent:
                    Lead.objects.filter(id__in=lane_ids[:sent]).update(requeued_at=now)
                published += sent
                if sent < len(lane_ids):
                    break
        total += published
        if len(ids) < batch_size or published < len(ids):
            break
    if total:
        logger.warning("re-enqueued %d stale lead(s) waiting since before %s", total, cutoff)
    return total


# --- Normalisation (worker side) -------------------------------------------------------------


def lead_record(lead: Lead) -> Any:
    """The record the lead is read from: what the vendor's API returned for a lead its
    notification only named (routing/fetch/), else the payload as received."""
    fetched = lead.fetch.get("lead") if isinstance(lead.fetch, dict) else None
    if lead.fetch_status == FetchStatus.DONE and isinstance(fetched, dict):
        return fetched
    return lead.raw_payload


def lead_apply_normalization(*, lead: Lead) -> Lead:
    """Fill the lead's canonical fields, custom and flags from its raw payload (not saved)."""
    source_map = lead.source.field_map or None
    flat = source_flatten(lead.source, lead_record(lead))
    result = normalize(flat.record, source_map)
    for name in CANONICAL_COLUMNS:
        value = result.fields.get(name)
        model_field: Any = Lead._meta.get_field(name)
        if value is None:
            value = None if model_field.null else ""
        elif name == "annual_revenue":
            try:
                value = Decimal(str(value)).quantize(Decimal("0.01"))
                if value.copy_abs() >= Decimal(10) ** 18:
                    value = None
            except (InvalidOperation, ValueError):
                value = None
        elif name == "employees":
            value = value if isinstance(value, int) and 0 <= value <= 2_147_483_647 else None
        elif isinstance(value, str):
            value = value[: model_field.max_length or None]
        setattr(lead, name, value)
    lead.custom = result.custom
    lead.flags = sorted({*result.flags, *flat.flags})
    # The key its audit events' personal content is sealed with (leads/privacy.py).
    lead.person_key_id = privacy.person_key_for(email=lead.email, phone=lead.phone, lead_id=lead.pk)
    lead.normalized_at = timezone.now()
    return lead


def lead_tags_set(*, lead: Lead, priority: str | None, tags: Sequence[str]) -> bool:
    """Store what tag rules gave ``lead`` (its priority and tags); True when anything changed.

    Call it in the routing transaction. The columns and the ``LeadTag`` rows change together:
    the rows of tags no longer given are removed, new ones added. Unchanged (most leads: no
    tag rule matched), it runs no statement at all.
    """
    value = priority_clean(priority)
    kept = tags_clean(tags)
    if value == lead.priority and kept == list(lead.tags or []):
        return False
    with transaction.atomic():
        _lead_tags_write(lead, value, kept)
    return True


def _lead_tags_write(lead: Lead, value: str, kept: list[str]) -> None:
    had_tags = bool(lead.tags)
    lead.priority = value
    lead.tags = kept
    Lead.objects.filter(pk=lead.pk).update(priority=value, tags=kept)
    if had_tags:  # most leads have none: no statement for them
        LeadTag.objects.filter(lead_id=lead.pk).exclude(tag__in=kept).delete()
    if kept:
        LeadTag.objects.bulk_create(
            [LeadTag(lead_id=lead.pk, tag=tag) for tag in kept], ignore_conflicts=True
        )


def lead_erased_close(*, lead: Lead, now: datetime, stage: str) -> str:
    """End a lead whose person was erased before a worker finished with it (``erased_at`` set),
    under the lead's row lock, in the caller's transaction: nothing personal is written back.

    Whatever the worker holds in memory (the payload it read, a provider's, CRM's or vendor's
    answer) is dropped; the lead keeps its erased fields, leaves every queue (not parked, not
    leased, not retried) and ends ``excluded`` (there is no one left to route), with an
    ``excluded`` event that says why and at which ``stage``, and nothing of the person."""
    lead.status = LeadStatus.EXCLUDED
    lead.claimed_until = None
    lead.processed_at = now
    lead.unassigned_retry_at = None
    lead.enrichment, lead.crm, lead.fetch = {}, {}, {}
    if lead.enrichment_status == EnrichmentStatus.PENDING:
        lead.enrichment_status = EnrichmentStatus.NONE
    if lead.crm_status == CrmLookupStatus.PENDING:
        lead.crm_status = CrmLookupStatus.NONE
    if lead.fetch_status == FetchStatus.PENDING:
        lead.fetch_status = FetchStatus.NONE
    lead.enrichment_next_at = lead.crm_next_at = lead.fetch_next_at = None
    lead.save(
        update_fields=[
            "status",
            "claimed_until",
            "processed_at",
            "unassigned_retry_at",
            "enrichment",
            "crm",
            "fetch",
            "enrichment_status",
            "crm_status",
            "fetch_status",
            "enrichment_next_at",
            "crm_next_at",
            "fetch_next_at",
        ]
    )
    event_record(
        type=EventType.EXCLUDED,
        lead_id=lead.pk,
        at=now,
        data={"reason": "its person was erased before it was routed", "stage": stage},
    )
    logger.info("lead %s: its person was erased (%s); ended without routing", lead.pk, stage)
    return str(lead.status)
