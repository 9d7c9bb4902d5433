"""The CRM lookup stage: live dedup and ownership, at the CRM's pace, on the ``crm`` queue.

The routing pipeline parks a new lead here (``processing``, no lease, ``crm_status`` pending,
``crm_next_at`` = when to try) when a connection has lookups on. ``lead_crm_lookup`` (the
``crm.lookup_lead`` task) claims it with one UPDATE and, for each active connection with
lookups on, asks the breaker, spends from the shared rate limit and looks the person up by
e-mail and the company by domain. The outcome per connection is kept on the lead (``lead.crm``,
by kind) with the owners mapped to reps; when every connection is done or has failed the lead
goes back to routing, which gives it to an owner who already has it in the CRM
(``crm_owner_assignment``) and feeds a CRM company's owner into account ownership
(``crm_account``). A CRM that is slow, rate limiting or down never holds a lead longer than
``CRM_LOOKUP_MAX_WAIT_SECONDS``: then it is routed without it and the trace says so. Nothing
waits in a worker: ``crm_sweep_due`` (beat) re-sends due tries, as for HTTP enrichment, but
only those whose last message ran (the lead was rescheduled after it was published,
``crm_dispatched_at``) or was lost (``CRM_REDISPATCH_SECONDS``), within what the rate limit can
serve; and it hands every lead past its wait back to routing in bulk, outside that budget.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
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
from config.logging import log_context
from leads.lanes import stage_queue
from leads.models import CrmLookupStatus, Lead, LeadStatus
from leads.normalize import FLAG_FREE_EMAIL, is_free_email_domain
from leads.services import broker_breaker, lead_erased_close, lead_lanes, leads_enqueue
from routing.crm.base import CrmError
from routing.crm.connections import crm_client
from routing.crm.facts import crm_label
from routing.crm.health import crm_record_error, crm_record_ok
from routing.crm.limits import (
    LOOKUP_REQUESTS,
    crm_breaker,
    crm_pause,
    crm_rate_limiter,
    spender,
)
from routing.crm.models import CrmConnection
from routing.crm.roster import owner_reps

logger = logging.getLogger(__name__)

LOOKUP_TASK = "crm.lookup_lead"
_PARKED = Q(status=LeadStatus.PROCESSING, claimed_until__isnull=True)
_FINAL = ("done", "failed")


# --- Which connections look leads up (cached for a few seconds per process) ------------------

_cache_lock = threading.Lock()
_cache: tuple[float, list[CrmConnection]] | None = None


def lookup_connections() -> list[CrmConnection]:
    """Active connections with lookups on, oldest first; cached ``CRM_CONFIG_CACHE_SECONDS``."""
    global _cache
    now = time.monotonic()
    cached = _cache
    if cached is not None and now - cached[0] < settings.CRM_CONFIG_CACHE_SECONDS:
        return cached[1]
    rows = list(CrmConnection.objects.filter(active=True, lookup_enabled=True).order_by("id"))
    with _cache_lock:
        _cache = (now, rows)
    return rows


def clear_connection_cache() -> None:
    """Forget the cached connections (tests, and the admin after a save)."""
    global _cache
    with _cache_lock:
        _cache = None


def crm_lookup_wanted(lead: Lead) -> bool:
    """Should the pipeline park this lead for a CRM lookup? (a connection, an e-mail or domain)"""
    if lead.crm_status != CrmLookupStatus.NONE:
        return False
    if not (lead.email or _company_domain(lead)):
        return False
    return bool(lookup_connections())


def _company_domain(lead: Lead) -> str:
    if lead.domain:
        return lead.domain
    domain = lead.email_domain or ""
    if not domain or FLAG_FREE_EMAIL in (lead.flags or []) or is_free_email_domain(domain):
        return ""
    return domain


def crm_park(lead: Lead, now: datetime) -> None:
    """Park ``lead`` (under its lock, in the routing transaction) and send it after commit."""
    lead.crm_status = CrmLookupStatus.PENDING
    lead.crm_next_at = now
    lead.crm_parked_at = now
    lead.crm_dispatched_at = None  # set once its message is published (crm_enqueue)
    lead.crm = {"_since": now.isoformat()}
    lead.save()
    lead_id = lead.pk
    transaction.on_commit(lambda: crm_enqueue([lead_id]), robust=True)


def crm_enqueue(
    lead_ids: Sequence[uuid.UUID | str],
    *,
    countdowns: Sequence[float] | None = None,
    expires_seconds: float | None = None,
) -> int:
    """Publish ``crm.lookup_lead`` for these leads; never raises; how many were sent.

    Those published are marked dispatched (``crm_dispatched_at``, the time before publishing):
    the sweeper sends a lead again only once that message has run (the lead was rescheduled
    after it) or looks lost (``CRM_REDISPATCH_SECONDS``).
    """
    if not lead_ids:
        return 0
    dispatched_at = timezone.now()
    if not broker_breaker.allows():
        logger.warning("broker marked down; %d CRM lookup(s) left for the sweeper", len(lead_ids))
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
                    LOOKUP_TASK,
                    args=[str(lead_id)],
                    producer=producer,
                    retry=False,
                    queue=stage_queue("crm", lead_lane[str(lead_id)]),
                    **options,
                )
                published += 1
    except Exception as exc:  # any broker failure: the sweeper re-sends what was not published
        broker_breaker.trip(settings.BROKER_BREAKER_SECONDS)
        logger.error(
            "could not enqueue %d of %d CRM lookup(s) (%s: %s); the sweeper will retry them",
            len(lead_ids) - published,
            len(lead_ids),
            type(exc).__name__,
            exc,
        )
    else:
        broker_breaker.reset()
    if published:
        try:
            Lead.objects.filter(id__in=list(lead_ids[:published])).update(
                crm_dispatched_at=dispatched_at
            )
        except Exception as exc:  # the sweeper then sends them again: a no-op each
            logger.error("could not mark %d CRM lookup(s) dispatched (%s)", published, exc)
    return published


# --- The lookup task's service ---------------------------------------------------------------


class _Claim:
    def __init__(self, lead_id: uuid.UUID, lease: datetime, attempt: int) -> None:
        self.lead_id = lead_id
        self.lease = lease
        self.attempt = attempt

    def locked_lead(self) -> Lead | None:
        lead = (
            Lead.objects.select_for_update(no_key=True)
            .filter(
                _PARKED,
                id=self.lead_id,
                crm_status=CrmLookupStatus.PENDING,
                crm_next_at=self.lease,
            )
            .first()
        )
        if lead is None:
            logger.warning(
                "crm lookup: claim on lead %s lost; writing nothing",
                self.lead_id,
                extra={"lead_id": str(self.lead_id)},
            )
        return lead


def _claim(lead_uuid: uuid.UUID, now: datetime) -> _Claim | None:
    lease = now + timedelta(seconds=settings.CRM_LEASE_SECONDS)
    claimed = Lead.objects.filter(
        _PARKED, id=lead_uuid, crm_status=CrmLookupStatus.PENDING, crm_next_at__lte=now
    ).update(crm_next_at=lease, crm_attempts=F("crm_attempts") + 1)
    if not claimed:
        return None
    attempt = Lead.objects.filter(id=lead_uuid).values_list("crm_attempts", flat=True).first()
    return _Claim(lead_uuid, lease, attempt or 1)


@dataclass
class _Step:
    """What one connection's try came to: final (done/failed, ``entry``) or wait ``seconds``."""

    entry: dict[str, Any] | None = None
    wait: float | None = None
    note: str = ""
    counts: bool = True  # a try at the CRM (False: waited for a token or the breaker's probe)
    partial: dict[str, Any] | None = None  # on a wait: the halves already found or refused


def _backoff(attempt: int) -> float:
    base = settings.CRM_LOOKUP_BACKOFF_SECONDS * 2 ** max(0, attempt - 1)
    base = min(base, 60.0)
    return base + random.uniform(0, base / 4)  # noqa: S311 - jitter


def _failed(connection: CrmConnection, reason: str, now: datetime) -> dict[str, Any]:
    return {
        "status": "failed",
        "connection": connection.pk,
        "name": connection.name,
        "reason": reason,
        "at": now.isoformat(),
    }


def _owner_summary(label: str, what: dict[str, Any] | None, owner: dict[str, Any] | None) -> str:
    if not what:
        return ""
    if not owner or not owner.get("owner_id"):
        return f"{label} has no owner"
    if owner.get("rep_id") is not None:
        return f"{label} owned by {owner.get('rep_name')}"
    return f"{label} owned by {owner.get('owner_email') or owner.get('owner_id')} (no rep)"


def _done_entry(
    connection: CrmConnection,
    person_json: dict[str, Any] | None,
    company_json: dict[str, Any] | None,
    now: datetime,
    *,
    missing: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A finished lookup: what was found of the person and the company, their owners mapped to
    reps, and (``missing``) a half that could not be looked up, with why."""
    missing = missing or {}
    ids = [str(x["owner_id"]) for x in (person_json, company_json) if x and x.get("owner_id")]
    reps = owner_reps(connection.kind, ids)
    person_owner = (
        reps[str(person_json["owner_id"])].to_json()
        if person_json and person_json.get("owner_id")
        else None
    )
    company_owner = (
        reps[str(company_json["owner_id"])].to_json()
        if company_json and company_json.get("owner_id")
        else None
    )
    parts = []
    if person_json:
        parts.append(
            f"{person_json['object']} {person_json['id']} found; "
            + _owner_summary("it is", person_json, person_owner).removeprefix("it is ")
        )
    elif "person" in missing:
        parts.append(f"person not looked up: {missing['person']}")
    else:
        parts.append("no person with this e-mail")
    if company_json:
        name = company_json.get("name") or company_json.get("domain")
        parts.append(
            f"company {name}: "
            + (_owner_summary("it is", company_json, company_owner).removeprefix("it is "))
        )
    elif "company" in missing:
        parts.append(f"company not looked up: {missing['company']}")
    return {
        "status": "done",
        "connection": connection.pk,
        "name": connection.name,
        "honour_owner": connection.honour_crm_owner,
        "person": person_json,
        "company": company_json,
        "person_owner": person_owner,
        "company_owner": company_owner,
        "missing": missing,
        "summary": "; ".join(parts),
        "at": now.isoformat(),
    }


def _half_only(error: CrmError) -> bool:
    """A failure of one half that says nothing of the other (a scope or object permission that
    call lacks, one request refused): the other half is still looked up. Anything else (a
    refused token, the CRM down, a rate limit) ends the try."""
    return error.kind == "rejected" or (error.kind == "auth" and error.permission)


def _lookup_one(
    connection: CrmConnection,
    lead: Lead,
    claim: _Claim,
    now: datetime,
    *,
    last_try: bool,
    previous: Any = None,
) -> _Step:
    breaker = crm_breaker(connection)
    try:
        check = breaker.before_call()
    except Exception as exc:  # the shared store is down: the rate limit will say wait
        logger.error("CRM breaker state unavailable (%s: %s)", type(exc).__name__, exc)
        check = None
    if check is not None and check.verdict == "open":
        return _Step(
            entry=_failed(
                connection,
                f"the CRM kept failing (breaker open for {math.ceil(check.open_for_seconds)} s)",
                now,
            )
        )
    if check is not None and check.verdict == "busy":
        return _Step(
            wait=random.uniform(1, 3),  # noqa: S311
            note="breaker half-open: waiting for its probe",
            counts=False,
        )
    probe = check is not None and check.verdict == "probe"
    # The person and the company are two halves: what an earlier try found (or was refused)
    # is kept, and only what is left is looked up, so a company that fails never throws away
    # the person found.
    earlier = previous if isinstance(previous, dict) else {}
    found: dict[str, Any] = dict(earlier.get("found") or {})
    missing: dict[str, str] = dict(earlier.get("missing") or {})
    wanted = {"person": lead.email or "", "company": _company_domain(lead)}
    todo = [half for half, value in wanted.items() if value and half not in found | missing]
    per_lookup = LOOKUP_REQUESTS.get(connection.kind, 2)
    reserve = sum(1 if half == "company" else per_lookup - 1 for half in todo)
    client = None
    for half in todo:
        try:
            if client is None:
                client = crm_client(
                    connection, spend=spender(connection, reserve=reserve, lane=lead.lane)
                )
            if half == "person":
                value: Any = client.find_person(wanted["person"])
            else:
                value = client.find_company(wanted["company"])
            found[half] = value.to_json() if value is not None else None
            continue
        except CrmError as exc:
            error = exc
            step = _lookup_error(
                connection, error, breaker, claim, now, last_try=last_try, probe=probe
            )
        except Exception as exc:  # a module's bug: this lead goes on without it, never fails
            logger.exception(
                "CRM %s lookup of lead %s raised",
                connection.name,
                lead.pk,
                extra={"lead_id": str(lead.pk)},
            )
            error = CrmError("malformed", f"{type(exc).__name__}: {str(exc)[:200]}")
            step = _lookup_error(connection, error, breaker, claim, now, last_try=True, probe=probe)
        probe = False  # the breaker's probe, if this was it, is settled by _lookup_error
        if step.entry is None:  # wait and try again: keep what was found
            step.partial = {"found": found, "missing": missing}
            return step
        missing[half] = str(step.entry.get("reason") or error)
        if not _half_only(error):
            break
    looked_up = [half for half in wanted if half in found]
    if not missing:
        try:
            breaker.record_success()
        except Exception as exc:
            logger.error("CRM breaker update failed (%s: %s)", type(exc).__name__, exc)
        crm_record_ok(connection, now=now)
    elif not looked_up:
        return _Step(entry=_failed(connection, "; ".join(missing.values()), now))
    return _Step(
        entry=_done_entry(
            connection, found.get("person"), found.get("company"), now, missing=missing
        )
    )


def _lookup_error(
    connection: CrmConnection,
    exc: CrmError,
    breaker: Any,
    claim: _Claim,
    now: datetime,
    *,
    last_try: bool,
    probe: bool,
) -> _Step:
    crm_record_error(connection, exc, lead_id=claim.lead_id)
    if exc.kind == "rate_limited":
        if probe:
            _quietly(breaker.release_probe)
        if exc.status is None:  # our own shared budget: wait for a token, not a try
            wait = (exc.retry_after or 1.0) + random.uniform(0, 1)  # noqa: S311
            return _Step(wait=wait, note="waiting for the rate limit", counts=False)
        delay = exc.retry_after if exc.retry_after is not None else _backoff(claim.attempt)
        crm_pause(connection, delay)
        if last_try:
            return _Step(entry=_failed(connection, f"rate limited by the CRM ({exc})", now))
        return _Step(wait=delay, note=f"rate limited by the CRM, retry after {delay:.0f} s")
    if exc.kind in ("auth", "config"):
        if probe:
            _quietly(breaker.release_probe)
        return _Step(entry=_failed(connection, f"credential problem: {exc}", now))
    if exc.kind == "rejected":
        _quietly(breaker.record_success)  # it answered; this request was the problem
        return _Step(entry=_failed(connection, f"the CRM refused the lookup: {exc}", now))
    state = _quietly(breaker.record_failure)
    if state == "opened":
        logger.error(
            "CRM %s breaker opened after %s; leads are routed without it for %g s",
            connection.name,
            exc,
            settings.CRM_BREAKER_COOLDOWN_SECONDS,
        )
    if exc.kind == "malformed":
        logger.warning(
            "CRM %s answered lead %s with something unusable: %s",
            connection.name,
            claim.lead_id,
            exc,
            extra={"lead_id": str(claim.lead_id)},
        )
        return _Step(entry=_failed(connection, f"unusable answer: {exc}", now))
    if last_try:
        return _Step(entry=_failed(connection, f"{exc} (attempt {claim.attempt})", now))
    return _Step(wait=_backoff(claim.attempt), note=str(exc))


def _quietly(action: Any) -> Any:
    try:
        return action()
    except Exception as exc:
        logger.error("CRM shared state update failed (%s: %s)", type(exc).__name__, exc)
        return None


def lead_crm_lookup(*, lead_id: uuid.UUID | str) -> str | None:
    """One try at the CRM lookups of a parked lead; a no-op unless this call claims it.

    Returns ``done`` / ``failed`` (finished and handed back to routing), ``retry`` (tried,
    next try scheduled), ``waiting`` (no token, or the breaker's probe is out), or None.
    """
    try:
        lead_uuid = uuid.UUID(str(lead_id))
    except ValueError:
        logger.error("crm lookup: %r is not a lead id", lead_id)
        return None
    with log_context(lead_id=lead_uuid):  # every line logged meanwhile names the lead
        return _lookup(lead_uuid)


def _refused_credentials(connections: Sequence[CrmConnection]) -> dict[int, str]:
    """The connections whose credential is refused now (their auth alert's cause), read fresh:
    a lookup does not ask them (every request would be refused) until a call, the health
    probe's, succeeds again or a new credential is saved."""
    if not connections:
        return {}
    fields = (
        "pk",
        "last_error_kind",
        "last_error_permission",
        "last_error_at",
        "last_ok_at",
        "secret_changed_at",
        "problem_since",
    )
    refused: dict[int, str] = {}
    for row in CrmConnection.objects.filter(pk__in=[c.pk for c in connections]).values(*fields):
        state = CrmConnection(**{key: value for key, value in row.items() if key != "pk"})
        started = state.problem_since or state.last_error_at
        if state.credential_refused() and started is not None:
            since = started.astimezone(UTC).strftime("%H:%M:%S")
            refused[row["pk"]] = (
                f"credential refused (since {since} UTC, the CRM alert is open): not asked "
                "until the health check sees it answer again"
            )
    return refused


def _lookup(lead_uuid: uuid.UUID) -> str | None:
    now = timezone.now()
    claim = _claim(lead_uuid, now)
    if claim is None:
        return None
    lead = Lead.objects.only(
        "id", "email", "email_domain", "domain", "flags", "crm", "erased_at"
    ).get(id=lead_uuid)
    if lead.erased_at is not None:  # erased while parked: the CRM is not asked about it
        return _write(claim, {}, now)
    record: dict[str, Any] = dict(lead.crm) if isinstance(lead.crm, dict) else {}
    since = parse_datetime(str(record.get("_since") or "")) or now
    waited = (now - since).total_seconds()
    connections = lookup_connections()
    refused = _refused_credentials(connections)
    steps: dict[str, _Step] = {}
    over_time = waited > settings.CRM_LOOKUP_MAX_WAIT_SECONDS
    max_attempts = settings.CRM_LOOKUP_MAX_ATTEMPTS
    last_try = claim.attempt >= max_attempts
    for connection in connections:
        existing = record.get(connection.kind)
        if isinstance(existing, dict) and existing.get("status") in _FINAL:
            continue
        if over_time:
            steps[connection.kind] = _Step(entry=_out_of_time(connection, existing, now))
            continue
        if connection.pk in refused:
            steps[connection.kind] = _Step(entry=_failed(connection, refused[connection.pk], now))
            continue
        if claim.attempt > max_attempts:
            last = existing.get("note") if isinstance(existing, dict) else ""
            why = f"gave up after {claim.attempt - 1} attempts"
            steps[connection.kind] = _Step(
                entry=_failed(connection, why + (f" ({last})" if last else ""), now)
            )
            continue
        steps[connection.kind] = _lookup_one(
            connection, lead, claim, now, last_try=last_try, previous=existing
        )
    # However long the CRM asks us to wait (a daily limit's hour), the lead's next try is no
    # later than its deadline, when it is routed without the CRM.
    deadline = since + timedelta(seconds=settings.CRM_LOOKUP_MAX_WAIT_SECONDS + 0.5)
    return _write(claim, steps, now, deadline=deadline)


def _write(
    claim: _Claim, steps: dict[str, _Step], now: datetime, *, deadline: datetime | None = None
) -> str | None:
    waits = [step for step in steps.values() if step.entry is None]
    with transaction.atomic(durable=True):
        lead = claim.locked_lead()
        if lead is None:
            return None
        if lead.erased_at is not None:
            # Erased while the CRM was asked: what it said about the person is dropped.
            return lead_erased_close(lead=lead, now=now, stage="crm lookup")
        record: dict[str, Any] = dict(lead.crm) if isinstance(lead.crm, dict) else {}
        for kind, step in steps.items():
            if step.entry is not None:
                record[kind] = step.entry
            else:
                previous = record.get(kind) if isinstance(record.get(kind), dict) else {}
                record[kind] = {
                    **(previous or {}),
                    **(step.partial or {}),
                    "status": "pending",
                    "note": step.note,
                }
        lead.crm = record
        if waits:
            wait = min(step.wait or 1.0 for step in waits)
            if not any(step.counts for step in waits):
                lead.crm_attempts = max(0, lead.crm_attempts - 1)
            next_at = now + timedelta(seconds=wait)
            lead.crm_next_at = min(next_at, deadline) if deadline is not None else next_at
            lead.save(update_fields=["crm", "crm_next_at", "crm_attempts"])
            return "retry" if any(step.counts for step in waits) else "waiting"
        _finish(lead, record, now)
        lead_id = lead.id
        transaction.on_commit(lambda: leads_enqueue([lead_id]), robust=True)
    return str(lead.crm_status)


def _finish(lead: Lead, record: dict[str, Any], now: datetime) -> None:
    """Mark the locked ``lead``'s lookup finished with ``record`` and write its audit event;
    the caller hands it back to routing after commit."""
    lead.crm = record
    entries = [e for k, e in record.items() if not k.startswith("_") and isinstance(e, dict)]
    done = any(entry.get("status") == "done" for entry in entries)
    lead.crm_status = CrmLookupStatus.DONE if done else CrmLookupStatus.FAILED
    # "Hand back no later than": the sweeper re-publishes routing after it if the message
    # that hands it back is lost.
    lead.crm_next_at = now + timedelta(seconds=settings.CRM_HANDBACK_RETRY_SECONDS)
    lead.save(update_fields=["crm", "crm_status", "crm_next_at", "crm_attempts"])
    summary = "; ".join(
        f"{crm_label(kind)}: "
        + (entry.get("summary") or "")
        + (f"unavailable ({entry.get('reason')})" if entry.get("status") == "failed" else "")
        for kind, entry in sorted(record.items())
        if not kind.startswith("_") and isinstance(entry, dict)
    )
    event_record(
        type=EventType.CRM_CHECKED,
        lead=lead,
        at=now,
        data={
            "status": lead.crm_status,
            "summary": summary,
            "crm": {
                kind: {
                    key: entry.get(key)
                    for key in ("status", "reason", "person", "company", "person_owner", "missing")
                }
                for kind, entry in record.items()
                if not kind.startswith("_") and isinstance(entry, dict)
            },
        },
    )


def _out_of_time(connection: CrmConnection, existing: Any, now: datetime) -> dict[str, Any]:
    """The entry of a connection that did not finish within the lead's bounded wait."""
    last = existing.get("note") if isinstance(existing, dict) else ""
    why = f"no answer within {settings.CRM_LOOKUP_MAX_WAIT_SECONDS:g} s"
    return _failed(connection, why + (f" ({last})" if last else ""), now)


# --- The sweeper -----------------------------------------------------------------------------


def _send_budget(batch_size: int) -> int:
    """How many due leads to send this sweep: what the slowest connection can serve."""
    connections = lookup_connections()
    if not connections:
        return batch_size
    interval = settings.CRM_SWEEP_INTERVAL_SECONDS
    budget = batch_size
    for connection in connections:
        try:
            free = crm_rate_limiter(connection).available()
        except Exception:
            free = 0
        # A lookup reserves the requests it may make (the person, the company).
        need = LOOKUP_REQUESTS.get(connection.kind, 2)
        refill = math.ceil(connection.effective_rate_per_minute * interval / 60)
        budget = min(budget, max(1, (free + refill) // need))
    return budget


def crm_sweep_due(*, now: datetime | None = None, batch_size: int | None = None) -> int:
    """Hand leads past their bounded wait back to routing (in bulk, spending nothing from the
    rate limit); re-send ``crm.lookup_lead`` for parked leads that are due and whose last
    message ran or was lost, in one batch the rate limit can serve; re-hand to routing leads
    finished but not picked up. Selected with SKIP LOCKED on PostgreSQL."""
    now = now or timezone.now()
    batch_size = batch_size or settings.CRM_SWEEP_BATCH_SIZE
    overdue = _hand_back_overdue(now=now, batch_size=batch_size)
    budget = _send_budget(batch_size)
    interval = settings.CRM_SWEEP_INTERVAL_SECONDS
    redispatch_before = now - timedelta(seconds=settings.CRM_REDISPATCH_SECONDS)
    sent = 0
    with transaction.atomic(durable=True):
        due = (
            Lead.objects.filter(_PARKED, crm_status=CrmLookupStatus.PENDING, crm_next_at__lte=now)
            .filter(
                Q(crm_dispatched_at__isnull=True)
                | Q(crm_dispatched_at__lt=F("crm_next_at"))
                | Q(crm_dispatched_at__lt=redispatch_before)
            )
            .order_by("crm_next_at")
        )
        if db_connection.features.has_select_for_update_skip_locked:
            due = due.select_for_update(skip_locked=True, no_key=True)
        ids = list(due.values_list("id", flat=True)[:budget])
        if ids:
            spacing = interval / max(1, len(ids))
            countdowns = [min(interval, i * spacing) for i in range(len(ids))]
            sent = crm_enqueue(ids, countdowns=countdowns, expires_seconds=2 * interval)
    handed_back = _hand_back_stragglers(now=now, batch_size=batch_size)
    if sent or handed_back or overdue:
        logger.info(
            "crm sweep: %d due lead(s) sent, %d past their wait and %d finished handed back",
            sent,
            overdue,
            handed_back,
        )
    return sent + handed_back + overdue


def _hand_back_overdue(*, now: datetime, batch_size: int, max_batches: int = 5) -> int:
    """Finish the lookups of leads parked longer than ``CRM_LOOKUP_MAX_WAIT_SECONDS`` (not under
    a worker's claim): each unfinished connection "no answer within N s", handed back."""
    cutoff = now - timedelta(seconds=settings.CRM_LOOKUP_MAX_WAIT_SECONDS)
    connections = {c.kind: c for c in lookup_connections()}
    total = 0
    for _ in range(max_batches):
        with transaction.atomic(durable=True):
            overdue = Lead.objects.filter(
                _PARKED,
                crm_status=CrmLookupStatus.PENDING,
                crm_next_at__lte=now,
                crm_parked_at__lte=cutoff,
            ).order_by("crm_parked_at")
            if db_connection.features.has_select_for_update_skip_locked:
                overdue = overdue.select_for_update(skip_locked=True, no_key=True)
            leads = list(overdue[:batch_size])
            for lead in leads:
                record: dict[str, Any] = dict(lead.crm) if isinstance(lead.crm, dict) else {}
                for kind, connection in connections.items():
                    existing = record.get(kind)
                    if not (isinstance(existing, dict) and existing.get("status") in _FINAL):
                        record[kind] = _out_of_time(connection, existing, now)
                _finish(lead, record, now)
            ids = [lead.id for lead in leads]
            if ids:
                transaction.on_commit(functools.partial(leads_enqueue, ids), robust=True)
        total += len(leads)
        if len(leads) < batch_size:
            break
    return total


def _hand_back_stragglers(*, now: datetime, batch_size: int) -> int:
    with transaction.atomic(durable=True):
        finished = Lead.objects.filter(
            _PARKED,
            crm_status__in=(CrmLookupStatus.DONE, CrmLookupStatus.FAILED),
            enrichment_status="",
            crm_next_at__lte=now,
        ).order_by("crm_next_at")
        if db_connection.features.has_select_for_update_skip_locked:
            finished = finished.select_for_update(skip_locked=True, no_key=True)
        ids = list(finished.values_list("id", flat=True)[:batch_size])
        published = leads_enqueue(ids) if ids else 0
        if published:
            Lead.objects.filter(id__in=ids[:published]).update(
                crm_next_at=now + timedelta(seconds=settings.CRM_HANDBACK_RETRY_SECONDS)
            )
    return published
