"""The HTTP enrichment stage: parking, the enrichment task's service, the sweeper, hand-back.

A lead the routing pipeline parks for the HTTP provider stays ``processing`` without a lease
(``claimed_until`` NULL) with ``enrichment_status`` pending and ``enrichment_next_at`` = when to
try next. ``lead_enrich`` (the ``enrichment.enrich_lead`` task, on its own queue) claims it with
one UPDATE, takes a token from the global rate limit, asks the shared breaker, calls the provider
once and either finishes the lead (done / failed, with its audit event, then hands it back to
routing) or sets ``enrichment_next_at`` for the next try. Waiting is never done in a worker:
``enrichment_sweep_due`` (beat, every few seconds) re-sends due leads.
"""

from __future__ import annotations

import contextvars
import logging
import math
import random
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from audit.models import EventType
from audit.services import event_record
from config.celery import app as celery_app
from config.logging import log_context
from leads.lanes import REALTIME, stage_queue
from leads.models import EnrichmentStatus, Lead, LeadStatus
from leads.services import broker_breaker, lead_erased_close, lead_lanes, leads_enqueue
from routing.enrichment.breaker import Breaker, BreakerCheck, http_breaker
from routing.enrichment.builtin import HTTP_PROVIDER
from routing.enrichment.merge import fill_empty, provider_values
from routing.enrichment.provider_http import CallOutcome, http_call
from routing.enrichment.ratelimit import BatchGrant, RateLimiter, http_rate_limiter, realtime_keep

logger = logging.getLogger(__name__)

ENRICH_LEAD_TASK = "enrichment.enrich_lead"
# What a lead may be parked in and handed back from: processing, and no routing lease.
_PARKED = Q(status=LeadStatus.PROCESSING, claimed_until__isnull=True)


# --- What the routing pipeline calls ---------------------------------------------------------


def enrichment_http_enabled() -> bool:
    """The HTTP provider is named in ENRICHMENT_PROVIDERS and has a URL."""
    return HTTP_PROVIDER in settings.ENRICHMENT_PROVIDERS and bool(settings.ENRICHMENT_HTTP_URL)


def enrichment_http_wanted(lead: Lead) -> bool:
    """Should the pipeline park this lead for the HTTP provider? (enabled, and not been yet)"""
    return enrichment_http_enabled() and lead.enrichment_status == EnrichmentStatus.NONE


def enrichment_trace_note(lead: Lead) -> str | None:
    """A line for the routing trace when the lead is routed without its HTTP enrichment."""
    if lead.enrichment_status != EnrichmentStatus.FAILED:
        return None
    record = lead.enrichment.get(HTTP_PROVIDER) if isinstance(lead.enrichment, dict) else None
    reason = record.get("reason") if isinstance(record, dict) else None
    return f"enrichment by http failed: {reason or 'unknown reason'}; routed without it"


def enrichment_enqueue(
    lead_ids: Sequence[uuid.UUID | str],
    *,
    countdowns: Sequence[float] | None = None,
    expires_seconds: float | None = None,
    gather: bool = False,
) -> int:
    """Publish ``enrichment.enrich_lead`` for these leads; never raises; how many were sent.

    Tried once with the broker's short timeouts (the sweeper repairs any failure: the lead row
    is the outbox). ``countdowns`` spread the sends (a few seconds at most); ``expires_seconds``
    lets a worker drop a copy that waited in the queue so long that the sweeper has re-sent it.
    ``gather``: a lead not in the realtime lane is sent ``ENRICHMENT_GATHER_SECONDS`` late, so
    that the leads parked one at a time meanwhile (single posts, routed one by one) are due
    together when the first task claims its batch: many calls in flight instead of one a task.
    """
    if not lead_ids:
        return 0
    if not broker_breaker.allows():
        logger.warning("broker marked down; %d enrichment(s) left for the sweeper", len(lead_ids))
        return 0
    published = 0
    lead_lane = lead_lanes(lead_ids)  # realtime leads to the realtime queue (leads.lanes)
    try:
        with celery_app.producer_or_acquire() as producer:
            for i, lead_id in enumerate(lead_ids):
                options: dict[str, Any] = {}
                countdown = countdowns[i] if countdowns else 0.0
                lane = lead_lane[str(lead_id)]
                if gather and lane != REALTIME:
                    countdown = max(countdown, settings.ENRICHMENT_GATHER_SECONDS)
                if countdown > 0:
                    options["countdown"] = countdown
                if expires_seconds:
                    options["expires"] = countdown + expires_seconds
                celery_app.send_task(
                    ENRICH_LEAD_TASK,
                    args=[str(lead_id)],
                    producer=producer,
                    retry=False,
                    queue=stage_queue("enrichment", lane),
                    **options,
                )
                published += 1
    except Exception as exc:  # any broker failure: the sweeper re-sends what was not published
        broker_breaker.trip(settings.BROKER_BREAKER_SECONDS)
        logger.error(
            "could not enqueue %d of %d enrichment(s) (%s: %s); the sweeper will retry them",
            len(lead_ids) - published,
            len(lead_ids),
            type(exc).__name__,
            exc,
        )
    else:
        broker_breaker.reset()
    return published


def enrichment_enqueue_after_commit(lead_id: uuid.UUID | str) -> None:
    """After the parking transaction commits, send the lead to the enrichment queue (a
    non-realtime one after the gathering time: ``enrichment_enqueue``'s ``gather``)."""
    transaction.on_commit(lambda: enrichment_enqueue([lead_id], gather=True), robust=True)


# --- The enrichment task's service -----------------------------------------------------------


def _http_record(lead: Lead) -> dict[str, Any]:
    record = lead.enrichment.get(HTTP_PROVIDER) if isinstance(lead.enrichment, dict) else None
    return dict(record) if isinstance(record, dict) else {}


def _backoff_seconds(attempt: int) -> float:
    """Exponential in the attempt number with up to 25 % jitter, so it grows every time."""
    base = settings.ENRICHMENT_HTTP_BACKOFF_SECONDS * 2 ** max(0, attempt - 1)
    base = min(base, settings.ENRICHMENT_HTTP_BACKOFF_MAX_SECONDS)
    return base + random.uniform(0, base / 4)  # noqa: S311 - jitter, not a secret


class _Claim:
    """One claimed try: the lead id, the lease that proves the claim, and its attempt number."""

    def __init__(
        self, lead_id: uuid.UUID, lease: datetime, attempt: int, lane: str | None = None
    ) -> None:
        self.lead_id = lead_id
        self.lease = lease
        self.attempt = attempt
        self.lane = lane

    def locked_lead(self) -> Lead | None:
        """The lead under a row lock, if this claim still holds it (else None: writes nothing)."""
        lead = (
            Lead.objects.select_for_update(no_key=True)
            .filter(
                _PARKED,
                id=self.lead_id,
                enrichment_status=EnrichmentStatus.PENDING,
                enrichment_next_at=self.lease,
            )
            .first()
        )
        if lead is None:
            logger.warning("enrich_lead: claim on lead %s lost; writing nothing", self.lead_id)
        return lead


def _reschedule(
    claim: _Claim, *, at: datetime, note: str, counts_as_attempt: bool, now: datetime
) -> str | None:
    with transaction.atomic(durable=True):
        lead = claim.locked_lead()
        if lead is None:
            return None
        if lead.erased_at is not None:
            return lead_erased_close(lead=lead, now=now, stage="enrichment")
        record = _http_record(lead)
        record.setdefault("since", now.isoformat())
        record.update(status="pending", next_at=at.isoformat(), note=note)
        if counts_as_attempt:
            record.update(attempts=claim.attempt, error=note)
        else:
            # Waiting for a token or for the breaker's probe is not a try at the provider.
            lead.enrichment_attempts = max(0, lead.enrichment_attempts - 1)
        lead.enrichment = {**(lead.enrichment or {}), HTTP_PROVIDER: record}
        lead.enrichment_next_at = at
        lead.save(update_fields=["enrichment", "enrichment_next_at", "enrichment_attempts"])
    return "retry" if counts_as_attempt else "waiting"


def _erased_end(claim: _Claim, now: datetime) -> str | None:
    with transaction.atomic(durable=True):
        lead = claim.locked_lead()
        if lead is None:
            return None
        return lead_erased_close(lead=lead, now=now, stage="enrichment")


def _json_value(value: Any) -> Any:
    return str(value) if isinstance(value, Decimal) else value


def _finish(
    claim: _Claim,
    *,
    now: datetime,
    reason: str = "",
    values: dict[str, Any] | None = None,
    ignored: Sequence[str] = (),
    http_status: str = "done",
    batch: _Batch,
) -> str | None:
    """Write the outcome (done when ``values`` is given, else failed) and its event; once
    committed, the lead joins the batch's hand-back to routing."""
    done = values is not None
    with transaction.atomic(durable=True):
        lead = claim.locked_lead()
        if lead is None:
            return None
        if lead.erased_at is not None:
            # Erased while the provider was asked: its answer (about the person) is dropped.
            return lead_erased_close(lead=lead, now=now, stage="enrichment")
        record = _http_record(lead)
        record.setdefault("since", now.isoformat())
        record.pop("next_at", None)
        record.pop("note", None)
        record.update(attempts=claim.attempt, finished_at=now.isoformat())
        fields: list[str] = []
        if values is not None:
            fields = fill_empty(lead, values)
            record.update(
                status=http_status,
                filled=fields,
                data={name: _json_value(value) for name, value in values.items()},
                ignored=list(ignored),
            )
            record.pop("reason", None)
            lead.enrichment_status = EnrichmentStatus.DONE
        else:
            record.update(status="failed", reason=reason, filled=[])
            lead.enrichment_status = EnrichmentStatus.FAILED
        lead.enrichment = {**(lead.enrichment or {}), HTTP_PROVIDER: record}
        # Kept as "hand back no later than": the sweeper re-publishes routing after it, in case
        # the message below is lost (the routing stale sweeper skips leads without a lease).
        lead.enrichment_next_at = now + timedelta(
            seconds=settings.ENRICHMENT_HANDBACK_RETRY_SECONDS
        )
        lead.save(
            update_fields=[
                *fields,
                "enrichment",
                "enrichment_status",
                "enrichment_next_at",
                "enrichment_attempts",
            ]
        )
        if done:
            summary = f"http: {http_status}" + (f"; filled {', '.join(fields)}" if fields else "")
            event_record(
                type=EventType.ENRICHED,
                lead=lead,
                data={
                    "provider": HTTP_PROVIDER,
                    "status": http_status,
                    "filled": fields,
                    "summary": summary,
                },
            )
        else:
            event_record(
                type=EventType.ENRICHMENT_FAILED,
                lead=lead,
                data={"provider": HTTP_PROVIDER, "reason": reason, "attempts": claim.attempt},
            )
    batch.handback.append(lead.id)
    if not done:
        logger.warning(
            "enrichment of lead %s failed: %s; routing without it", claim.lead_id, reason
        )
    return lead.enrichment_status


def _claim(lead_uuid: uuid.UUID, now: datetime) -> _Claim | None:
    lease = now + timedelta(seconds=settings.ENRICHMENT_LEASE_SECONDS)
    claimed = Lead.objects.filter(
        _PARKED,
        id=lead_uuid,
        enrichment_status=EnrichmentStatus.PENDING,
        enrichment_next_at__lte=now,
    ).update(enrichment_next_at=lease, enrichment_attempts=F("enrichment_attempts") + 1)
    if not claimed:
        return None
    row = Lead.objects.filter(id=lead_uuid).values_list("enrichment_attempts", "lane").first()
    attempt, lane = row if row is not None else (1, None)
    return _Claim(lead_uuid, lease, attempt or 1, lane)


def _batch_size() -> int:
    """How many leads one task takes: ``ENRICHMENT_BATCH_SIZE``, but no more than its calls
    can finish within the lease (``ENRICHMENT_HTTP_CONCURRENCY`` at a time, each bounded by
    the timeout): an answer that came after the lease would be dropped."""
    concurrency = max(1, settings.ENRICHMENT_HTTP_CONCURRENCY)
    timeout = max(0.001, settings.ENRICHMENT_HTTP_TIMEOUT_SECONDS)
    waves = max(1, math.floor((settings.ENRICHMENT_LEASE_SECONDS - 5) / timeout))
    return max(1, min(settings.ENRICHMENT_BATCH_SIZE, concurrency * waves))


def _claim_others(own: _Claim, now: datetime, limit: int) -> list[_Claim]:
    """Claim up to ``limit`` other parked leads that are due, realtime first, with the same
    lease as ``own`` (the same test as ``_claim``; rows another worker holds are skipped)."""
    due = Lead.objects.filter(
        _PARKED, enrichment_status=EnrichmentStatus.PENDING, enrichment_next_at__lte=now
    ).exclude(id=own.lead_id)
    realtime_first = Case(When(lane=REALTIME, then=Value(0)), default=Value(1))
    with transaction.atomic():
        pick = due.order_by(realtime_first, "enrichment_next_at")
        if connection.features.has_select_for_update_skip_locked:
            pick = pick.select_for_update(skip_locked=True, no_key=True)
        ids = list(pick.values_list("id", flat=True)[:limit])
        if not ids:
            return []
        due.filter(id__in=ids).update(
            enrichment_next_at=own.lease, enrichment_attempts=F("enrichment_attempts") + 1
        )
        # Read back by the lease: on a database without SKIP LOCKED, a lead another worker
        # claimed between the SELECT and the UPDATE is not due any more and is not ours.
        rows = Lead.objects.filter(
            _PARKED,
            id__in=ids,
            enrichment_status=EnrichmentStatus.PENDING,
            enrichment_next_at=own.lease,
        ).values_list("id", "enrichment_attempts", "lane")
        claims = [_Claim(lead_id, own.lease, attempt or 1, lane) for lead_id, attempt, lane in rows]
    claims.sort(key=lambda claim: claim.lane != REALTIME)
    return claims


def _breaker_check(breaker: Breaker) -> BreakerCheck:
    try:
        return breaker.before_call()
    except Exception as exc:  # the shared store is down; the rate limit then says wait
        logger.error("enrichment breaker state unavailable (%s: %s)", type(exc).__name__, exc)
        return BreakerCheck("closed")


def _take_tokens(limiter: RateLimiter, *, realtime: int, other: int) -> BatchGrant:
    """Tokens for a batch's calls in one round trip: realtime leads' first (they may take the
    realtime share), then the others', leaving that share (leads.lanes)."""
    try:
        return limiter.take_batch(realtime=realtime, other=other, keep=realtime_keep(limiter, None))
    except Exception as exc:  # no shared budget, no call: the vendor's quota is not ours to risk
        logger.error("enrichment rate limit unavailable (%s: %s)", type(exc).__name__, exc)
        return BatchGrant(0, 0, wait_seconds=settings.ENRICHMENT_STORE_DOWN_RETRY_SECONDS)


def _quietly(action: Any, what: str) -> Any:
    try:
        return action()
    except Exception as exc:
        logger.error("enrichment %s failed (%s: %s)", what, type(exc).__name__, exc)
        return None


def lead_enrich(*, lead_id: uuid.UUID | str) -> str | None:
    """A try at the HTTP provider for a parked lead and, in the same task, for up to
    ``ENRICHMENT_BATCH_SIZE`` - 1 other due ones (their calls in flight together); a no-op
    unless this call claims its own lead (so the other leads' own messages find nothing).

    Returns what became of its own lead: ``done`` / ``failed`` (finished and handed back to
    routing), ``retry`` (a try failed and the next is scheduled), ``waiting`` (no token, or the
    breaker's probe is out: tried again without counting an attempt), or None (not due, not
    parked, or the claim was lost).
    """
    try:
        lead_uuid = uuid.UUID(str(lead_id))
    except ValueError:
        logger.error("enrich_lead: %r is not a lead id", lead_id)
        return None
    with log_context(lead_id=lead_uuid):  # every line logged meanwhile names the lead
        return _lead_enrich(lead_uuid)


_CALL = "call"  # a claimed lead that passed its own checks and waits for the breaker and a token


class _Batch:
    """The leads one task claimed, what became of each, and the finished ones to hand back."""

    def __init__(self, claims: list[_Claim]) -> None:
        self.claims = claims
        self.results: dict[uuid.UUID, str | None] = {}
        self.handback: list[uuid.UUID] = []
        self.error: Exception | None = None  # what writing the task's own lead raised


def _lead_enrich(lead_uuid: uuid.UUID) -> str | None:
    now = timezone.now()
    own = _claim(lead_uuid, now)
    if own is None:
        return None
    size = _batch_size()
    batch = _Batch([own, *(_claim_others(own, now, size - 1) if size > 1 else [])])
    try:
        _enrich_batch(batch, now)
    finally:
        handback = list(batch.handback)
        if handback:  # one publish for the group: routing's batch path takes them together
            transaction.on_commit(lambda: leads_enqueue(handback), robust=True)
    if batch.error is not None:
        raise batch.error
    return batch.results.get(lead_uuid)


def _enrich_batch(batch: _Batch, now: datetime) -> None:
    leads = {
        lead.id: lead
        for lead in Lead.objects.select_related("source")
        .only(
            "id", "email", "domain", "company", "country", "enrichment", "erased_at", "source__slug"
        )
        .filter(id__in=[claim.lead_id for claim in batch.claims])
    }
    max_attempts = settings.ENRICHMENT_HTTP_MAX_ATTEMPTS
    enabled = enrichment_http_enabled()
    to_call: list[tuple[_Claim, Lead]] = []
    for claim in batch.claims:
        lead = leads.get(claim.lead_id)
        if lead is None:  # deleted meanwhile: nothing to write
            continue
        with log_context(lead_id=claim.lead_id, source=lead.source.slug):
            verdict = _before_call(claim, lead, now, batch, enabled, max_attempts)
        if verdict == _CALL:
            to_call.append((claim, lead))
        else:
            batch.results[claim.lead_id] = verdict
    if not to_call:
        return

    breaker = http_breaker()
    check = _breaker_check(breaker)
    if check.verdict == "open":
        reason = (
            f"breaker open (the provider kept failing; retried in "
            f"{math.ceil(check.open_for_seconds)} s)"
        )
        for claim, lead in to_call:
            _each(batch, claim, lead, _finish, now=now, reason=reason, batch=batch)
        return
    if check.verdict in ("busy", "probe"):
        # Half-open: one call is the probe (realtime first), the others wait for its answer.
        waiting = to_call if check.verdict == "busy" else to_call[1:]
        to_call = [] if check.verdict == "busy" else to_call[:1]
        for claim, lead in waiting:
            _each(
                batch,
                claim,
                lead,
                _reschedule,
                at=now + timedelta(seconds=random.uniform(1, 3)),  # noqa: S311
                note="breaker half-open: waiting for its probe",
                counts_as_attempt=False,
                now=now,
            )
        if not to_call:
            return

    realtime = [pair for pair in to_call if pair[0].lane == REALTIME]
    other = [pair for pair in to_call if pair[0].lane != REALTIME]
    grant = _take_tokens(http_rate_limiter(), realtime=len(realtime), other=len(other))
    granted = realtime[: grant.realtime] + other[: grant.other]
    refused = realtime[grant.realtime :] + other[grant.other :]
    if check.verdict == "probe" and not granted:
        _quietly(breaker.release_probe, "probe release")
    for claim, lead in refused:
        wait = grant.wait_seconds + random.uniform(0, 1)  # noqa: S311
        _each(
            batch,
            claim,
            lead,
            _reschedule,
            at=now + timedelta(seconds=wait),
            note="waiting for the rate limit",
            counts_as_attempt=False,
            now=now,
        )
    if not granted:
        return

    outcomes = _call_all([lead for _, lead in granted])
    for (claim, lead), outcome in zip(granted, outcomes, strict=True):
        _each(
            batch,
            claim,
            lead,
            _apply_outcome,
            outcome,
            breaker=breaker,
            lead=lead,
            max_attempts=max_attempts,
            batch=batch,
        )


def _each(
    batch: _Batch,
    claim: _Claim,
    lead: Lead,
    write: Callable[..., str | None],
    /,
    *args: Any,
    **kw: Any,
) -> None:
    """One lead's write, logged under its id. A failure there fails no other lead of the batch
    (that lead's claim runs out and the sweeper sends it again); one on the task's own lead is
    raised once the others are written, so the task fails as it did before batches."""
    with log_context(lead_id=claim.lead_id, source=lead.source.slug):
        try:
            batch.results[claim.lead_id] = write(claim, *args, **kw)
        except Exception as exc:
            batch.results[claim.lead_id] = None
            if claim is batch.claims[0]:
                batch.error = exc
            else:
                logger.exception("enrichment of lead %s could not be written", claim.lead_id)


def _before_call(
    claim: _Claim, lead: Lead, now: datetime, batch: _Batch, enabled: bool, max_attempts: int
) -> str | None:
    """The checks of one claimed lead before any call: ``_CALL``, or what was written."""
    if lead.erased_at is not None:  # erased while parked: the provider is not asked about it
        return _erased_end(claim, now)
    record = _http_record(lead)
    last_error = record.get("error") or "none finished (worker crash or time limit)"
    if not enabled:
        return _finish(
            claim, now=now, reason="the HTTP provider is not configured any more", batch=batch
        )
    if claim.attempt > max_attempts:
        return _finish(
            claim,
            now=now,
            reason=f"gave up after {claim.attempt - 1} attempts; last error: {last_error}",
            batch=batch,
        )
    since = parse_datetime(str(record.get("since") or "")) or now
    waited = (now - since).total_seconds()
    if waited > settings.ENRICHMENT_HTTP_MAX_WAIT_SECONDS:
        return _finish(
            claim,
            now=now,
            reason=f"no answer within {settings.ENRICHMENT_HTTP_MAX_WAIT_SECONDS:g} s "
            f"(rate limit or outage); last error: {record.get('error') or 'none'}",
            batch=batch,
        )
    return _CALL


def _call_one(lead: Lead) -> CallOutcome:
    return http_call(
        url=settings.ENRICHMENT_HTTP_URL,
        headers=dict(settings.ENRICHMENT_HTTP_HEADERS),
        payload={"email": lead.email, "domain": lead.domain, "company": lead.company},
        timeout=settings.ENRICHMENT_HTTP_TIMEOUT_SECONDS,
        max_body_bytes=settings.ENRICHMENT_HTTP_MAX_BODY_BYTES,
    )


def _call_all(leads: list[Lead]) -> list[CallOutcome]:
    """Every lead's call, up to ``ENRICHMENT_HTTP_CONCURRENCY`` in flight at once on a thread
    pool of this task (``http_call`` never raises and touches no database); in order."""
    workers = min(max(1, settings.ENRICHMENT_HTTP_CONCURRENCY), len(leads))
    if workers == 1:
        return [_call_one(lead) for lead in leads]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="enrich")
    try:
        futures = []
        for lead in leads:
            with log_context(lead_id=lead.id, source=lead.source.slug):
                # The thread logs (httpx's request line) under this lead's context.
                futures.append(pool.submit(contextvars.copy_context().run, _call_one, lead))
        return [future.result() for future in futures]
    except BaseException:
        # The soft time limit (or anything else) stops the task: the calls not started are
        # not made (their answers would be thrown away, the tokens spent); the leads are tried
        # again once their claim lapses.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)


def _apply_outcome(
    claim: _Claim,
    outcome: CallOutcome,
    *,
    breaker: Breaker,
    lead: Lead,
    max_attempts: int,
    batch: _Batch,
) -> str | None:
    now = timezone.now()
    last_try = claim.attempt >= max_attempts
    if outcome.kind == "ok":
        if _quietly(breaker.record_success, "breaker success"):
            logger.warning("enrichment breaker closed: the provider answered again")
        values, ignored = provider_values(outcome.body, country=lead.country)
        return _finish(claim, now=now, values=values, ignored=ignored, batch=batch)
    if outcome.kind == "rejected":
        # The provider is up (breaker closed), it just refuses this request. 404 is the usual
        # way for an enrichment API to say "we know nothing about this one".
        _quietly(breaker.record_success, "breaker success")
        if outcome.status_code == 404:
            return _finish(claim, now=now, values={}, http_status="no_match", batch=batch)
        return _finish(
            claim, now=now, reason=f"provider refused the request ({outcome.error})", batch=batch
        )
    if outcome.kind == "rate_limited":
        _quietly(breaker.release_probe, "probe release")
        pause = outcome.retry_after if outcome.retry_after is not None else None
        delay = pause if pause is not None else _backoff_seconds(claim.attempt)
        _quietly(lambda: http_rate_limiter().pause(delay), "rate limit pause")
        if last_try:
            return _finish(
                claim,
                now=now,
                reason=f"rate limited (HTTP 429) on all {claim.attempt} attempts",
                batch=batch,
            )
        return _reschedule(
            claim,
            at=now + timedelta(seconds=delay),
            note=f"HTTP 429, retry after {delay:.0f} s",
            counts_as_attempt=True,
            now=now,
        )
    state = _quietly(breaker.record_failure, "breaker failure")
    if state == "opened":
        logger.error(
            "enrichment breaker opened after %s (%d failures in a row); leads are routed "
            "without the provider for %g s",
            outcome.error,
            settings.ENRICHMENT_BREAKER_FAILURES,
            settings.ENRICHMENT_BREAKER_COOLDOWN_SECONDS,
        )
    if outcome.kind == "malformed":
        return _finish(claim, now=now, reason=f"unusable response: {outcome.error}", batch=batch)
    if last_try:
        return _finish(
            claim,
            now=now,
            reason=f"{outcome.error} (attempt {claim.attempt} of {max_attempts})",
            batch=batch,
        )
    return _reschedule(
        claim,
        at=now + timedelta(seconds=_backoff_seconds(claim.attempt)),
        note=outcome.error,
        counts_as_attempt=True,
        now=now,
    )


# --- The sweeper -----------------------------------------------------------------------------


def _send_budget(batch_size: int) -> tuple[int, float]:
    """(how many due leads to send this sweep, seconds between sends beyond the free tokens).

    Sending more than the rate limit can serve before the next sweep only makes tries that wait
    again; when the provider is off, every due lead is sent (each fails at once).
    """
    if not enrichment_http_enabled():
        return batch_size, 0.0
    rate = max(1, settings.ENRICHMENT_HTTP_RATE_PER_MINUTE)
    interval = settings.ENRICHMENT_SWEEP_INTERVAL_SECONDS
    try:
        free = http_rate_limiter().available()
    except Exception:  # the store is down: send a few; they wait and fail after the max wait
        free = 0
    refill = math.ceil(rate * interval / 60)
    return min(batch_size, free + refill), 60.0 / rate


def enrichment_sweep_due(*, now: datetime | None = None, batch_size: int | None = None) -> int:
    """Re-send ``enrich_lead`` for parked leads that are due (retries, lost messages, expired
    claims), in one bounded batch; re-hand to routing leads finished but not picked up.

    The batch is selected with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so two sweepers never
    send the same lead; duplicates that still happen are no-ops (the claim). Copies sent here
    expire after two sweep intervals, so a backed-up queue does not keep growing.
    """
    now = now or timezone.now()
    batch_size = batch_size or settings.ENRICHMENT_SWEEP_BATCH_SIZE
    budget, spacing = _send_budget(batch_size)
    interval = settings.ENRICHMENT_SWEEP_INTERVAL_SECONDS
    sent = 0
    with transaction.atomic(durable=True):
        due = Lead.objects.filter(
            _PARKED, enrichment_status=EnrichmentStatus.PENDING, enrichment_next_at__lte=now
        ).order_by("enrichment_next_at")
        if connection.features.has_select_for_update_skip_locked:
            due = due.select_for_update(skip_locked=True, no_key=True)
        ids = list(due.values_list("id", flat=True)[:budget])
        if ids:
            free = max(
                0, budget - math.ceil(settings.ENRICHMENT_HTTP_RATE_PER_MINUTE * interval / 60)
            )
            countdowns = [
                0.0 if i < free else min(interval, (i - free + 1) * spacing)
                for i in range(len(ids))
            ]
            sent = enrichment_enqueue(ids, countdowns=countdowns, expires_seconds=2 * interval)
    handed_back = _hand_back_stragglers(now=now, batch_size=batch_size)
    if sent or handed_back:
        logger.info("enrichment sweep: %d due lead(s) sent, %d handed back", sent, handed_back)
    return sent + handed_back


def _hand_back_stragglers(*, now: datetime, batch_size: int) -> int:
    """Re-publish routing for leads whose enrichment finished but that routing never took."""
    with transaction.atomic(durable=True):
        finished = Lead.objects.filter(
            _PARKED,
            enrichment_status__in=(EnrichmentStatus.DONE, EnrichmentStatus.FAILED),
            enrichment_next_at__lte=now,
        ).order_by("enrichment_next_at")
        if connection.features.has_select_for_update_skip_locked:
            finished = finished.select_for_update(skip_locked=True, no_key=True)
        ids = list(finished.values_list("id", flat=True)[:batch_size])
        published = leads_enqueue(ids) if ids else 0
        if published:
            Lead.objects.filter(id__in=ids[:published]).update(
                enrichment_next_at=now
                + timedelta(seconds=settings.ENRICHMENT_HANDBACK_RETRY_SECONDS)
            )
    return published
