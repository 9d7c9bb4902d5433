"""The Meta fetch stage: a lead a leadgen notification names, fetched from the Graph API at
Meta's pace on the ``enrichment`` queue, before the pipeline reads it.

The kickoff accepts a leadgen notification of a source with a page access token as a lead with
no person yet (``leads.sources.meta_lead_ads.awaits_fetch``). The routing pipeline parks it here
first (``processing``, no lease, ``fetch_status`` pending, ``fetch_next_at`` = when to try):
before dedup, the CRM and enrichment, since they all need the person. ``lead_meta_fetch`` (the
``enrichment.meta_fetch_lead`` task) claims it with one UPDATE, asks the shared breaker, takes
a token from the source's shared rate limit (``routing.enrichment.ratelimit``, keyed by source:
Meta counts Page tokens per Page) and fetches the lead (``graph.fetch_lead``). Then:

- fetched: kept on the lead (``lead.fetch["lead"]``, an ``enriched`` event) and handed back to
  routing, which normalises it from that record (``leads.services.lead_record``);
- rate limited by Meta (codes 4, 17, 32, 613, 80001-80014): every worker waits Meta's
  ``estimated_time_to_regain_access`` (else a backoff); our own budget empty: wait for a token.
  Neither counts as a try;
- the token refused (190, 102) or lacking a permission (10, 200-299), or none set: the source's
  ``enrichment`` alert (subject ``meta_lead_ads:<slug>``) opens and the lead waits, retried every
  ``META_FETCH_AUTH_RETRY_SECONDS``; once the source has another token, the sweep makes its
  waiting leads due at once, and the first fetch that works resolves the alert;
- timeouts, 5xx, ``is_transient``, garbage: the breaker counts it, retried with a growing
  backoff;
- a lead Meta says does not exist (100/33), or one still not fetched after
  ``META_FETCH_MAX_ATTEMPTS`` tries or ``META_FETCH_MAX_WAIT_SECONDS``: the lead is ``failed``
  with the reason as its last error (lead page, admin, a ``failed`` event); an operator retries
  it (``leads_meta_fetch_retry``: the admin's action, or a re-route).

Nothing waits in a worker: ``meta_fetch_sweep_due`` (beat) sends the tries that are due.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection as db_connection
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from audit.models import EventType
from audit.services import event_record
from config.celery import app as celery_app
from config.logging import log_context, log_context_add
from leads.lanes import stage_queue
from leads.models import FetchStatus, Lead, LeadStatus, Source
from leads.services import broker_breaker, lead_erased_close, lead_lanes, leads_enqueue
from leads.sources.meta_lead_ads import (
    BASE_URL_OPTION,
    DEFAULT_GRAPH_BASE_URL,
    DEFAULT_GRAPH_VERSION,
    KIND,
    VERSION_OPTION,
    leadgen_change,
    page_token,
)
from leads.sources.meta_lead_ads.graph import GraphError, fetch_lead
from routing.enrichment.breaker import Breaker, CacheBreaker, RedisBreaker
from routing.enrichment.ratelimit import (
    CacheWindowLimiter,
    RateLimiter,
    RedisTokenBucket,
    realtime_keep,
)
from routing.enrichment.store import redis_client

logger = logging.getLogger(__name__)

FETCH_TASK = "enrichment.meta_fetch_lead"
KEY_PREFIX = "leadrouter:meta"
ALERT_PREFIX = f"{KIND.name}:"
# The alert for leads waiting long for their fetch, whatever the source (an outage is Meta's).
WAITING_SUBJECT = f"{KIND.name}.waiting"
_PARKED = Q(status=LeadStatus.PROCESSING, claimed_until__isnull=True)


# --- The source's Graph settings, pace and health ---------------------------------------------


@dataclass(frozen=True)
class GraphSettings:
    """Where and with what a source's leads are fetched (the token is never logged)."""

    token: str
    base_url: str
    version: str

    @property
    def token_print(self) -> str:
        """A short hash that tells tokens apart (to notice a new one), never the token."""
        if not self.token:
            return ""
        return hashlib.sha256(self.token.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def graph_settings(source: Source) -> GraphSettings:
    options = source.kind_options if isinstance(source.kind_options, dict) else {}
    return GraphSettings(
        token=page_token(options),
        base_url=_text(options.get(BASE_URL_OPTION)) or DEFAULT_GRAPH_BASE_URL,
        version=_text(options.get(VERSION_OPTION)) or DEFAULT_GRAPH_VERSION,
    )


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def meta_rate_limiter(source: Source) -> RateLimiter:
    """The source's shared request budget (a Redis token bucket, else a cache window)."""
    client = redis_client()
    key = f"{KEY_PREFIX}:{source.pk}"
    rate = settings.META_GRAPH_RATE_PER_MINUTE
    if client is not None:
        return RedisTokenBucket(client, key, rate_per_minute=rate, burst=settings.META_GRAPH_BURST)
    return CacheWindowLimiter(key, rate_per_minute=rate)


def meta_breaker() -> Breaker:
    """The Graph API's breaker, shared by every worker and source (an outage is Meta's)."""
    prefix = f"{KEY_PREFIX}:breaker"
    threshold = settings.META_BREAKER_FAILURES
    cooldown = settings.META_BREAKER_COOLDOWN_SECONDS
    probe_ttl = settings.META_GRAPH_TIMEOUT_SECONDS * 3 + 5
    client = redis_client()
    if client is not None:
        return RedisBreaker(
            client, prefix, threshold=threshold, cooldown=cooldown, probe_ttl=probe_ttl
        )
    return CacheBreaker(prefix, threshold=threshold, cooldown=cooldown, probe_ttl=probe_ttl)


def alert_subject(source: Source) -> str:
    return f"{ALERT_PREFIX}{source.slug}"


# --- Parking a lead (the pipeline's hook) -----------------------------------------------------


def lead_meta_fetch_wanted(lead: Lead) -> bool:
    """Does this lead's person still have to be fetched? (a leadgen notification of a Meta
    source, not fetched yet, or whose fetch failed and is being routed again)"""
    if lead.fetch_status not in (FetchStatus.NONE, FetchStatus.FAILED):
        return False
    if lead.source.kind != KIND.name:
        return False
    return leadgen_change(lead.raw_payload) is not None


def lead_meta_fetch_park(lead: Lead, now: datetime, *, note: str = "") -> None:
    """Park ``lead`` for its fetch (under its lock, in the routing transaction); sent after
    commit."""
    change = leadgen_change(lead.raw_payload) or {}
    lead.status = LeadStatus.PROCESSING
    lead.claimed_until = None
    lead.fetch_status = FetchStatus.PENDING
    lead.fetch_attempts = 0
    lead.fetch_next_at = now
    lead.fetch = {
        "_since": now.isoformat(),
        "leadgen_id": str(change.get("leadgen_id") or ""),
        "status": "pending",
        "note": note or "waiting for its fetch from the Graph API",
    }
    lead.save()
    lead_id = lead.pk
    transaction.on_commit(lambda: meta_fetch_enqueue([lead_id]), robust=True)


def meta_fetch_enqueue(
    lead_ids: Sequence[uuid.UUID | str],
    *,
    countdowns: Sequence[float] | None = None,
    expires_seconds: float | None = None,
) -> int:
    """Publish ``enrichment.meta_fetch_lead`` for these leads; never raises; how many were sent."""
    if not lead_ids:
        return 0
    if not broker_breaker.allows():
        logger.warning("broker marked down; %d Meta fetch(es) left for the sweeper", len(lead_ids))
        return 0
    published = 0
    lead_lane = lead_lanes(lead_ids)  # realtime leads to the realtime queue (leads.lanes)
    try:
        with celery_app.producer_or_acquire() as producer:
            for i, lead_id in enumerate(lead_ids):
                options: dict[str, Any] = {}
                countdown = countdowns[i] if countdowns else 0.0
                if countdown > 0:
                    options["countdown"] = countdown
                if expires_seconds:
                    options["expires"] = countdown + expires_seconds
                celery_app.send_task(
                    FETCH_TASK,
                    args=[str(lead_id)],
                    producer=producer,
                    retry=False,
                    queue=stage_queue("enrichment", lead_lane[str(lead_id)]),
                    **options,
                )
                published += 1
    except Exception as exc:  # any broker failure: the sweeper re-sends what was not published
        broker_breaker.trip(settings.BROKER_BREAKER_SECONDS)
        logger.error(
            "could not enqueue %d of %d Meta fetch(es) (%s: %s); the sweeper will retry them",
            len(lead_ids) - published,
            len(lead_ids),
            type(exc).__name__,
            exc,
        )
    else:
        broker_breaker.reset()
    return published


# --- One try ----------------------------------------------------------------------------------


@dataclass
class _Step:
    """What a try came to: ``done`` (``lead``), ``failed`` (``reason``) or a wait of ``wait`` s."""

    outcome: str  # done | failed | wait | erased (the person was erased: nothing is asked)
    wait: float = 0.0
    note: str = ""
    reason: str = ""
    lead: dict[str, Any] = field(default_factory=dict)
    counts: bool = True  # a try at Meta (False: waited for a token, the breaker or Meta's limit)
    credential: bool = False  # waiting for a person to fix the page token
    answered: bool = False  # Meta answered with this token (the credential alert can resolve)


def _backoff(attempt: int) -> float:
    base = min(settings.META_FETCH_BACKOFF_SECONDS * 2 ** max(0, attempt - 1), 900.0)
    return base + random.uniform(0, base / 4)  # noqa: S311 - jitter


def _quietly(action: Any) -> Any:
    try:
        return action()
    except Exception as exc:
        logger.error("Meta fetch shared state update failed (%s: %s)", type(exc).__name__, exc)
        return None


def _claim(lead_uuid: uuid.UUID, now: datetime) -> tuple[datetime, int] | None:
    lease = now + timedelta(seconds=settings.META_FETCH_LEASE_SECONDS)
    claimed = Lead.objects.filter(
        _PARKED, id=lead_uuid, fetch_status=FetchStatus.PENDING, fetch_next_at__lte=now
    ).update(fetch_next_at=lease, fetch_attempts=F("fetch_attempts") + 1)
    if not claimed:
        return None
    attempt = Lead.objects.filter(id=lead_uuid).values_list("fetch_attempts", flat=True).first()
    return lease, attempt or 1


_WAITING = "waiting for a working page access token: "


def _credential_wait(message: str) -> _Step:
    return _Step(
        outcome="wait",
        wait=settings.META_FETCH_AUTH_RETRY_SECONDS,
        note=f"{_WAITING}{message}",
        counts=False,
        credential=True,
    )


def _try(lead: Lead, graph: GraphSettings, attempt: int, waited: float, last: str) -> _Step:
    change = leadgen_change(lead.raw_payload) or {}
    leadgen_id = str(change.get("leadgen_id") or "")
    max_attempts = settings.META_FETCH_MAX_ATTEMPTS
    if waited > settings.META_FETCH_MAX_WAIT_SECONDS or attempt > max_attempts:
        why = (
            f"not fetched from the Graph API within {settings.META_FETCH_MAX_WAIT_SECONDS:g} s"
            if waited > settings.META_FETCH_MAX_WAIT_SECONDS
            else f"not fetched from the Graph API after {attempt - 1} tries"
        )
        return _Step(outcome="failed", reason=why + (f" (last: {last})" if last else ""))
    if not graph.token:
        return _credential_wait("none is set on the source (kind option page_access_token)")
    breaker = meta_breaker()
    check = _quietly(breaker.before_call)
    if check is not None and check.verdict == "open":
        return _Step(
            outcome="wait",
            wait=max(1.0, check.open_for_seconds) + random.uniform(0, 2),  # noqa: S311
            note="the Graph API kept failing: waiting for its breaker",
            counts=False,
        )
    if check is not None and check.verdict == "busy":
        return _Step(
            outcome="wait",
            wait=random.uniform(1, 3),  # noqa: S311
            note="breaker half-open: waiting for its probe",
            counts=False,
        )
    probe = check is not None and check.verdict == "probe"
    limiter = meta_rate_limiter(lead.source)
    try:
        grant = limiter.take(1, keep=realtime_keep(limiter, lead.lane))
    except Exception as exc:
        logger.error("Meta rate limit unavailable (%s: %s)", type(exc).__name__, exc)
        if probe:
            _quietly(breaker.release_probe)
        return _Step(
            outcome="wait",
            wait=settings.ENRICHMENT_STORE_DOWN_RETRY_SECONDS,
            note="the shared rate limit's store is unavailable",
            counts=False,
        )
    if not grant.granted:
        if probe:
            _quietly(breaker.release_probe)
        return _Step(
            outcome="wait",
            wait=grant.wait_seconds + random.uniform(0, 1),  # noqa: S311
            note="waiting for the source's rate limit",
            counts=False,
        )
    try:
        fetched = fetch_lead(
            leadgen_id=leadgen_id,
            token=graph.token,
            base_url=graph.base_url,
            version=graph.version,
            timeout=settings.META_GRAPH_TIMEOUT_SECONDS,
            verify=settings.META_GRAPH_CA_BUNDLE or True,
        )
    except GraphError as exc:
        return _graph_error(exc, breaker, limiter, attempt, probe=probe, leadgen_id=leadgen_id)
    except Exception as exc:  # a bug of ours: counted and retried, never a crashed task
        logger.exception("Meta fetch of lead %s raised", lead.pk)
        if probe:
            _quietly(breaker.release_probe)
        return _Step(outcome="wait", wait=_backoff(attempt), note=f"{type(exc).__name__}")
    _quietly(breaker.record_success)
    record = dict(fetched.lead)
    # The notification's page id is not among the lead's fields: kept beside them.
    if change.get("page_id") is not None and "page_id" not in record:
        record["page_id"] = change["page_id"]
    return _Step(outcome="done", lead=record, answered=True)


def _graph_error(
    exc: GraphError,
    breaker: Breaker,
    limiter: RateLimiter,
    attempt: int,
    *,
    probe: bool,
    leadgen_id: str,
) -> _Step:
    last_try = attempt >= settings.META_FETCH_MAX_ATTEMPTS
    if exc.kind in ("rate_limited", "auth", "permission") and probe:
        _quietly(breaker.release_probe)
    if exc.kind == "rate_limited":
        delay = exc.retry_after if exc.retry_after else _backoff(attempt)
        delay = min(delay, settings.META_FETCH_MAX_WAIT_SECONDS)
        _quietly(lambda: limiter.pause(delay))
        logger.warning("Meta rate limited the source's fetches for %.0f s: %s", delay, exc)
        return _Step(
            outcome="wait",
            wait=delay,
            note=f"rate limited by Meta, retry after {delay:.0f} s ({exc})",
            counts=False,
        )
    if exc.kind in ("auth", "permission"):
        return _credential_wait(str(exc))
    if exc.kind == "not_found":
        _quietly(breaker.record_success)  # Meta answered; this lead is the problem
        return _Step(
            outcome="failed",
            reason=f"Meta says lead {leadgen_id} does not exist or this token cannot read it "
            f"({exc})",
            answered=True,
        )
    if exc.kind == "rejected":
        _quietly(breaker.record_success)
    else:
        state = _quietly(breaker.record_failure)
        if state == "opened":
            logger.error(
                "the Graph API breaker opened after %s; fetches wait %g s",
                exc,
                settings.META_BREAKER_COOLDOWN_SECONDS,
            )
    if last_try:
        return _Step(outcome="failed", reason=f"{exc} (try {attempt})")
    return _Step(outcome="wait", wait=_backoff(attempt), note=str(exc))


def lead_meta_fetch(*, lead_id: uuid.UUID | str) -> str | None:
    """One try at fetching a parked lead; a no-op unless this call claims it.

    Returns ``done`` (fetched and handed back to routing), ``failed``, ``retry`` (tried, next
    try scheduled), ``waiting`` (no token, a rate limit, the breaker), or None.
    """
    try:
        lead_uuid = uuid.UUID(str(lead_id))
    except ValueError:
        logger.error("meta fetch: %r is not a lead id", lead_id)
        return None
    with log_context(lead_id=lead_uuid):  # every line logged meanwhile names the lead
        return _fetch(lead_uuid)


def _fetch(lead_uuid: uuid.UUID) -> str | None:
    now = timezone.now()
    claimed = _claim(lead_uuid, now)
    if claimed is None:
        return None
    lease, attempt = claimed
    lead = Lead.objects.select_related("source").get(id=lead_uuid)
    log_context_add(source=lead.source.slug)
    if lead.erased_at is not None:  # erased while parked: Meta is not asked for the person
        return _write(lead_uuid, lease, _Step(outcome="erased"), graph_settings(lead.source), now)
    record: dict[str, Any] = dict(lead.fetch) if isinstance(lead.fetch, dict) else {}
    since = parse_datetime(str(record.get("_since") or "")) or now
    graph = graph_settings(lead.source)
    step = _try(lead, graph, attempt, (now - since).total_seconds(), str(record.get("note") or ""))
    outcome = _write(lead_uuid, lease, step, graph, timezone.now())
    if outcome is not None:
        _alert(lead.source, step, graph)
    return outcome


def _write(
    lead_uuid: uuid.UUID, lease: datetime, step: _Step, graph: GraphSettings, now: datetime
) -> str | None:
    with transaction.atomic(durable=True):
        lead = (
            Lead.objects.select_for_update(no_key=True)
            .filter(_PARKED, id=lead_uuid, fetch_status=FetchStatus.PENDING, fetch_next_at=lease)
            .first()
        )
        if lead is None:
            logger.warning("meta fetch: claim on lead %s lost; writing nothing", lead_uuid)
            return None
        if lead.erased_at is not None:
            # Erased while the Graph API was asked: the record it returned is dropped.
            lead_erased_close(lead=lead, now=now, stage="meta fetch")
            return "erased"
        record: dict[str, Any] = dict(lead.fetch) if isinstance(lead.fetch, dict) else {}
        record["at"] = now.isoformat()
        if step.outcome == "wait":
            record.update(status="pending", note=step.note[:500])
            if step.credential:
                # The bound is on Meta not answering, not on a person fixing the token.
                record.update(_since=now.isoformat(), token_print=graph.token_print)
            lead.fetch = record
            if not step.counts:
                lead.fetch_attempts = max(0, lead.fetch_attempts - 1)
            lead.fetch_next_at = now + timedelta(seconds=max(0.5, step.wait))
            lead.save(update_fields=["fetch", "fetch_next_at", "fetch_attempts"])
            return "retry" if step.counts else "waiting"
        record.pop("note", None)
        lead.fetch_next_at = None
        if step.outcome == "done":
            record.update(status="done", lead=step.lead)
            lead.fetch = record
            lead.fetch_status = FetchStatus.DONE
            lead.save(update_fields=["fetch", "fetch_status", "fetch_next_at"])
            event_record(
                type=EventType.ENRICHED,
                lead=lead,
                at=now,
                data={
                    "provider": "meta_lead_ads",
                    "summary": f"fetched lead {record.get('leadgen_id')} from the Graph API",
                    "form_id": step.lead.get("form_id"),
                    "ad_id": step.lead.get("ad_id"),
                },
            )
            lead_id = lead.id
            transaction.on_commit(lambda: leads_enqueue([lead_id]), robust=True)
            return "done"
        record.update(status="failed", reason=step.reason[:1000])
        lead.fetch = record
        lead.fetch_status = FetchStatus.FAILED
        lead.status = LeadStatus.FAILED
        lead.last_error = f"Meta Lead Ads: {step.reason}"[:2000]
        lead.processed_at = now
        lead.save(
            update_fields=[
                "fetch",
                "fetch_status",
                "fetch_next_at",
                "status",
                "last_error",
                "processed_at",
            ]
        )
        event_record(
            type=EventType.FAILED,
            lead=lead,
            at=now,
            data={"error": lead.last_error, "stage": "meta_fetch"},
        )
        logger.error("lead %s could not be fetched from Meta: %s", lead.id, step.reason)
        return "failed"


def _alert(source: Source, step: _Step, graph: GraphSettings) -> None:
    from routing.monitoring.alerts import alert_raise, alert_resolve
    from routing.monitoring.models import AlertKind

    try:
        if step.credential:
            alert_raise(
                kind=AlertKind.ENRICHMENT,
                subject=alert_subject(source),
                message=f"Meta Lead Ads source {source.slug}: the Graph API cannot be read "
                f"with its page access token ({step.note.removeprefix(_WAITING)}). Its leads "
                "wait to be fetched; set a new token (kind option page_access_token) and "
                "they are fetched within a minute.",
                data={"source": source.slug, "token_print": graph.token_print},
            )
        elif step.answered:
            alert_resolve(kind=AlertKind.ENRICHMENT, subject=alert_subject(source))
    except Exception as exc:  # the alert is a side show: never fail the lead over it
        logger.error("Meta fetch alert update failed (%s: %s)", type(exc).__name__, exc)


# --- The sweeper and the operator's retry ------------------------------------------------------


def _token_fixed(now: datetime) -> int:
    """Leads waiting on a refused token whose source has another token now: due at once."""
    from routing.monitoring.models import Alert, AlertKind, AlertStatus

    made_due = 0
    alerts = Alert.objects.filter(
        kind=AlertKind.ENRICHMENT, status=AlertStatus.OPEN, subject__startswith=ALERT_PREFIX
    )
    for alert in alerts:
        slug = alert.subject.removeprefix(ALERT_PREFIX)
        source = Source.objects.filter(slug=slug).first()
        if source is None:
            continue
        refused = (alert.data or {}).get("token_print", "")
        current = graph_settings(source).token_print
        if not current or current == refused:
            continue
        made_due += Lead.objects.filter(
            _PARKED, source=source, fetch_status=FetchStatus.PENDING, fetch_next_at__gt=now
        ).update(fetch_next_at=now)
        # The new token is tried now; until a fetch answers, the alert names it.
        alert.data = {**(alert.data or {}), "token_print": current}
        alert.save(update_fields=["data"])
    return made_due


def meta_fetch_sweep_due(*, now: datetime | None = None, batch_size: int | None = None) -> int:
    """Send ``enrichment.meta_fetch_lead`` for parked leads that are due, in one bounded batch
    spread over the sweep interval (after making due the leads of a source whose token changed).
    Selected with SKIP LOCKED on PostgreSQL."""
    now = now or timezone.now()
    batch_size = batch_size or settings.META_FETCH_SWEEP_BATCH_SIZE
    _token_fixed(now)
    interval = settings.META_FETCH_SWEEP_INTERVAL_SECONDS
    budget = min(batch_size, max(1, math.ceil(settings.META_GRAPH_RATE_PER_MINUTE * interval / 60)))
    with transaction.atomic(durable=True):
        due = Lead.objects.filter(
            _PARKED, fetch_status=FetchStatus.PENDING, fetch_next_at__lte=now
        ).order_by("fetch_next_at")
        if db_connection.features.has_select_for_update_skip_locked:
            due = due.select_for_update(skip_locked=True, no_key=True)
        ids = list(due.values_list("id", flat=True)[: budget + settings.META_GRAPH_BURST])
        sent = 0
        if ids:
            spacing = interval / max(1, len(ids))
            countdowns = [min(interval, i * spacing) for i in range(len(ids))]
            sent = meta_fetch_enqueue(ids, countdowns=countdowns, expires_seconds=2 * interval)
    if sent:
        logger.info("meta fetch sweep: %d due lead(s) sent", sent)
    return sent


def meta_fetch_waiting_check(*, now: datetime | None = None) -> int:
    """Open, refresh or resolve the ``enrichment`` alert ``meta_lead_ads.waiting``: leads
    received more than ``META_FETCH_ALERT_AFTER_SECONDS`` ago still waiting for their fetch (the
    Graph API down, slow, throttling, a certificate not trusted). Leads waiting for a new page
    token are not counted: their source's own alert says so. How many are waiting that long."""
    from routing.monitoring.alerts import alert_raise, alert_resolve
    from routing.monitoring.models import AlertKind

    now = now or timezone.now()
    threshold = settings.META_FETCH_ALERT_AFTER_SECONDS
    waiting = Lead.objects.filter(
        _PARKED,
        fetch_status=FetchStatus.PENDING,
        received_at__lt=now - timedelta(seconds=threshold),
    ).exclude(fetch__note__startswith=_WAITING)
    count = waiting.count()
    if not count:
        alert_resolve(
            kind=AlertKind.ENRICHMENT,
            subject=WAITING_SUBJECT,
            now=now,
            clear_for=settings.ALERT_RESOLVE_AFTER_SECONDS,
        )
        return 0
    oldest = waiting.order_by("received_at").values_list("received_at", "fetch").first()
    since, fetch = oldest if oldest is not None else (now, {})
    note = str((fetch or {}).get("note") or "not tried yet")[:300]
    alert_raise(
        kind=AlertKind.ENRICHMENT,
        subject=WAITING_SUBJECT,
        message=f"{count} Meta Lead Ads lead{'s have' if count > 1 else ' has'} waited more "
        f"than {threshold / 60:g} min to be fetched from the Graph API (the oldest received "
        f"{since:%Y-%m-%d %H:%M} UTC; its last try: {note}). They are retried by themselves "
        f"and fail after META_FETCH_MAX_WAIT_SECONDS; see docs/operations.md.",
        data={"waiting": count, "oldest_received_at": since.isoformat()},
        now=now,
    )
    return count


def leads_meta_fetch_retry(*, lead_ids: Iterable[uuid.UUID | str], actor: str) -> int:
    """Fetch again leads whose fetch failed (an operator's retry); how many were parked."""
    now = timezone.now()
    parked: list[uuid.UUID] = []
    with transaction.atomic(durable=True):
        leads = Lead.objects.select_for_update(of=("self",), no_key=True).select_related("source")
        for lead in leads.filter(
            id__in=list(lead_ids), fetch_status=FetchStatus.FAILED, status=LeadStatus.FAILED
        ):
            lead.last_error = ""
            lead.processed_at = None
            lead.normalized_at = None
            lead_meta_fetch_park(lead, now, note=f"fetch retried by {actor}")
            event_record(
                type=EventType.REROUTE_REQUESTED,
                lead=lead,
                actor=actor,
                at=now,
                data={"reason": "fetch the lead from Meta again"},
            )
            parked.append(lead.pk)
    return len(parked)
