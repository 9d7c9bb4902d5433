"""Retention: prune what the law does not let us keep, in bounded, resumable batches.

Three policies, each a number of days from a lead's receipt (global settings, overridden per
source; 0 or empty: kept):

- ``raw_payload`` (``RETENTION_RAW_PAYLOAD_DAYS``): the payload as received and the record a
  vendor fetch returned are replaced by a marker; the source's refused inbox rows that old are
  deleted. The canonical fields and the decision stay.
- ``unrouted`` (``RETENTION_UNROUTED_DAYS``): the personal fields of leads that never got an
  owner (unassigned, excluded, failed) are pruned as an erasure prunes them.
- ``personal`` (``RETENTION_PERSONAL_DAYS``): the personal fields of every lead that old.

A lead is pruned only once it is finished (not waiting or being routed). Personal pruning
overwrites the lead's fields as erasure does (routing/erasure.py) and clears what is around it
(its assignments' traces, delivery bodies, refused rows, admin log lines), and appends a
``pruned`` event to its chain. The sealed personal content of its audit events goes with its
person's key: when the last lead held under a key is pruned, the key is *retired* (its lookup
hash removed, so the person's next lead gets a new key), and destroyed
``RETENTION_KEY_GRACE_SECONDS`` later unless a lead normalised at that very moment took it.
Until then, the sealed events of a person who still has leads within their period stay
readable: they are that person's data the policy still allows.

Each batch is one transaction over at most ``RETENTION_BATCH_SIZE`` leads locked with SKIP
LOCKED; its counts are added to the ``retention`` totals (``MetricsState``) in the same
transaction. A run stops after ``RETENTION_MAX_SECONDS``; whatever is left is due on the next
run. A crash loses at most the open batch, which rolls back whole: the next run picks the same
rows again, by the same rule, so nothing is pruned twice or skipped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit.models import EventType
from audit.services import event_record
from leads import privacy
from leads.models import Lead, LeadStatus, PersonKey, RefusedPayload, Source
from routing.erasure import LEAD_ERASED_VALUES, leads_around_clear
from routing.monitoring.models import MetricsState

logger = logging.getLogger(__name__)

__all__ = [
    "POLICIES",
    "RetentionResult",
    "retention_apply",
    "retention_periods",
    "retention_totals",
]

RAW_PAYLOAD = "raw_payload"
UNROUTED = "unrouted"
PERSONAL = "personal"
POLICIES = (RAW_PAYLOAD, UNROUTED, PERSONAL)

# The global setting and the source's own field, per policy.
_SETTING = {
    RAW_PAYLOAD: "RETENTION_RAW_PAYLOAD_DAYS",
    UNROUTED: "RETENTION_UNROUTED_DAYS",
    PERSONAL: "RETENTION_PERSONAL_DAYS",
}
_SOURCE_FIELD = {
    RAW_PAYLOAD: "retention_raw_payload_days",
    UNROUTED: "retention_unrouted_days",
    PERSONAL: "retention_personal_days",
}

# Finished leads: nothing will read their payload or fields to route them any more.
FINISHED = (
    LeadStatus.ASSIGNED,
    LeadStatus.DUPLICATE,
    LeadStatus.EXCLUDED,
    LeadStatus.UNASSIGNED,
    LeadStatus.FAILED,
)
UNROUTED_STATUSES = (LeadStatus.UNASSIGNED, LeadStatus.EXCLUDED, LeadStatus.FAILED)

PRUNED_PAYLOAD: dict[str, Any] = {"pruned": "retention"}
STATE_KEY = "retention"
# What the totals count (the /metrics label ``what``).
COUNTED = (
    "raw_payloads",
    "refused_payloads",
    "unrouted_leads",
    "personal_leads",
    "keys_retired",
    "keys_destroyed",
)


@dataclass(slots=True)
class RetentionResult:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTED, 0))
    # False when the run stopped at its time budget with more due (the next run goes on).
    complete: bool = True

    def add(self, other: dict[str, int]) -> None:
        for name, n in other.items():
            self.counts[name] = self.counts.get(name, 0) + n

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def sentence(self) -> str:
        done = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in self.counts.items() if n)
        return (done or "nothing due") + ("" if self.complete else " (more due: next run)")


def retention_periods(source: Source) -> dict[str, int]:
    """Days kept per policy for this source (its own setting, else the global); 0: kept."""
    periods = {}
    for policy in POLICIES:
        own = getattr(source, _SOURCE_FIELD[policy])
        days = own if own else int(getattr(settings, _SETTING[policy]))
        periods[policy] = max(0, days)
    return periods


def _candidates(policy: str, source: Source, cutoff: datetime) -> QuerySet[Lead]:
    # An erased lead holds nothing of its person any more: pruning it again would count it
    # again in the totals (/metrics).
    rows = Lead.objects.filter(
        source=source, received_at__lt=cutoff, status__in=FINISHED, erased_at__isnull=True
    )
    if policy == RAW_PAYLOAD:
        return rows.filter(raw_pruned_at__isnull=True)  # lead_raw_retained_idx
    rows = rows.filter(personal_pruned_at__isnull=True)  # lead_personal_retained_idx
    if policy == UNROUTED:
        rows = rows.filter(status__in=UNROUTED_STATUSES)
    return rows


def _locked(rows: QuerySet[Lead], batch: int) -> list[Lead]:
    rows = rows.order_by("received_at", "pk")
    if connection.features.has_select_for_update_skip_locked:
        rows = rows.select_for_update(skip_locked=True, of=("self",))
    return list(rows[:batch])


def _totals_add(counts: dict[str, int], *, now: datetime) -> None:
    """Add to the stored totals, in the caller's transaction (counted once, with the change)."""
    MetricsState.objects.get_or_create(key=STATE_KEY)
    state = MetricsState.objects.select_for_update().get(key=STATE_KEY)
    data = dict(state.data or {})
    pruned = dict(data.get("pruned") or {})
    for name, n in counts.items():
        if n:
            pruned[name] = int(pruned.get(name, 0)) + n
    data["pruned"] = pruned
    state.data = data
    state.refreshed_at = now
    state.save(update_fields=["data", "refreshed_at"])


def retention_totals() -> dict[str, Any]:
    """What retention pruned so far (by what), and when it last ran to the end (for /metrics)."""
    data = MetricsState.objects.filter(key=STATE_KEY).values_list("data", flat=True).first() or {}
    pruned = data.get("pruned") or {}
    return {
        "pruned": {name: int(pruned.get(name, 0)) for name in COUNTED},
        "last_success_at": data.get("last_success_at"),
    }


def _raw_batch(source: Source, cutoff: datetime, batch: int, now: datetime) -> int:
    with transaction.atomic(durable=True):
        leads = _locked(_candidates(RAW_PAYLOAD, source, cutoff), batch)
        if not leads:
            return 0
        Lead.objects.filter(pk__in=[lead.pk for lead in leads]).update(
            raw_payload=PRUNED_PAYLOAD, fetch={}, raw_pruned_at=now
        )
        _totals_add({"raw_payloads": len(leads)}, now=now)
        return len(leads)


def _refused_batch(source: Source, cutoff: datetime, batch: int, now: datetime) -> int:
    with transaction.atomic(durable=True):
        ids = list(
            RefusedPayload.objects.filter(source=source, received_at__lt=cutoff)
            .order_by("received_at", "pk")
            .values_list("pk", flat=True)[:batch]
        )
        if not ids:
            return 0
        deleted, _ = RefusedPayload.objects.filter(pk__in=ids).delete()
        _totals_add({"refused_payloads": deleted}, now=now)
        return deleted


def _key_still_needed(key_id: int, pruning: set[Any]) -> bool:
    """Whether a lead outside ``pruning`` still holds personal data under this key."""
    return (
        Lead.objects.filter(
            person_key_id=key_id, personal_pruned_at__isnull=True, erased_at__isnull=True
        )
        .exclude(pk__in=pruning)
        .exists()
    )


def _personal_batch(
    policy: str, source: Source, cutoff: datetime, days: int, batch: int, now: datetime
) -> dict[str, int]:
    with transaction.atomic(durable=True):
        leads = _locked(_candidates(policy, source, cutoff), batch)
        if not leads:
            return {}
        lead_ids = [lead.pk for lead in leads]
        key_ids = sorted({lead.person_key_id for lead in leads if lead.person_key_id})
        retired = 0
        if key_ids:
            # Locked in id order (no deadlock between two runs); a key another lead still
            # needs stays live: that lead's period has not run out.
            keys = PersonKey.objects.select_for_update().filter(
                pk__in=key_ids, wrapped__isnull=False, retired_at__isnull=True
            )
            pruning = set(lead_ids)
            for key in keys.order_by("pk"):
                if not _key_still_needed(key.pk, pruning):
                    PersonKey.objects.filter(pk=key.pk).update(lookup=None, retired_at=now)
                    retired += 1
        leads_around_clear(lead_ids=lead_ids)
        values = {
            **LEAD_ERASED_VALUES,
            "raw_payload": PRUNED_PAYLOAD,
            "unassigned_retry_at": None,
            "personal_pruned_at": now,
            "raw_pruned_at": now,
        }
        Lead.objects.filter(pk__in=lead_ids).update(**values)
        for lead in leads:
            event_record(
                type=EventType.PRUNED,
                lead_id=lead.pk,
                at=now,
                data={
                    "reason": f"retention: {policy} after {days} days",
                    "policy": policy,
                    "days": days,
                },
            )
        counts = {f"{policy}_leads": len(leads), "keys_retired": retired}
        _totals_add(counts, now=now)
        return counts


def _keys_destroy(*, now: datetime, batch: int) -> int:
    """Destroy the keys retired at least the grace period ago that no lead took meanwhile."""
    grace = timedelta(seconds=float(settings.RETENTION_KEY_GRACE_SECONDS))
    destroyed = 0
    with transaction.atomic(durable=True):
        keys = list(
            PersonKey.objects.select_for_update(skip_locked=True)
            .filter(retired_at__lte=now - grace, wrapped__isnull=False)
            .order_by("pk")[:batch]
        )
        for key in keys:
            if _key_still_needed(key.pk, set()):
                # A lead normalised while the key was being retired took it: it stays live
                # (without its lookup: that person's next lead gets a new key).
                PersonKey.objects.filter(pk=key.pk).update(retired_at=None)
                continue
            PersonKey.objects.filter(pk=key.pk).update(wrapped=None, erased_at=now)
            destroyed += 1
        if destroyed:
            _totals_add({"keys_destroyed": destroyed}, now=now)
    return destroyed


def retention_apply(
    *,
    now: datetime | None = None,
    batch_size: int | None = None,
    max_seconds: float | None = None,
) -> RetentionResult:
    """Apply every source's retention periods, batch after batch, until nothing is due or the
    time budget is spent (``complete`` False: the next run carries on)."""
    now = now or timezone.now()
    batch = batch_size or int(settings.RETENTION_BATCH_SIZE)
    budget = float(settings.RETENTION_MAX_SECONDS if max_seconds is None else max_seconds)
    deadline = time.monotonic() + budget
    result = RetentionResult()

    def out_of_time() -> bool:
        if time.monotonic() >= deadline:
            result.complete = False
            return True
        return False

    for source in Source.objects.order_by("pk"):
        periods = retention_periods(source)
        for policy in (PERSONAL, UNROUTED, RAW_PAYLOAD):
            days = periods[policy]
            if not days:
                continue
            cutoff = now - timedelta(days=days)
            while not out_of_time():
                if policy == RAW_PAYLOAD:
                    n = _raw_batch(source, cutoff, batch, now)
                    result.add({"raw_payloads": n})
                    if n < batch:
                        while not out_of_time():
                            gone = _refused_batch(source, cutoff, batch, now)
                            result.add({"refused_payloads": gone})
                            if gone < batch:
                                break
                        break
                else:
                    counts = _personal_batch(policy, source, cutoff, days, batch, now)
                    result.add(counts)
                    if counts.get(f"{policy}_leads", 0) < batch:
                        break
            if not result.complete:
                break
        if not result.complete:
            break
    while result.complete and not out_of_time():
        n = _keys_destroy(now=now, batch=batch)
        result.add({"keys_destroyed": n})
        if n < batch:
            break
    if result.total:
        privacy.cache_clear()
    return result


def retention_scheduled(*, now: datetime | None = None) -> RetentionResult | None:
    """The beat job: ``retention_apply``; a failure is logged at ERROR and opens the
    ``retention`` alert (the batches committed before it stay done); the next run that gets
    through resolves it."""
    from routing.monitoring.alerts import alert_raise, alert_resolve
    from routing.monitoring.models import AlertKind

    now = now or timezone.now()
    try:
        result = retention_apply(now=now)
    except Exception as error:
        logger.exception("the retention job failed")
        alert_raise(
            kind=AlertKind.RETENTION,
            message=f"The retention job failed: {type(error).__name__}: {error}. What it "
            "pruned before stays pruned; the next run starts again where it stopped.",
            now=now,
        )
        return None
    if result.complete:
        with transaction.atomic():
            MetricsState.objects.get_or_create(key=STATE_KEY)
            state = MetricsState.objects.select_for_update().get(key=STATE_KEY)
            state.data = {**(state.data or {}), "last_success_at": now.isoformat()}
            state.save(update_fields=["data"])
    if result.total:
        logger.info("retention: %s", result.sentence())
    alert_resolve(kind=AlertKind.RETENTION, now=now)
    return result


def retention_due_count(*, now: datetime | None = None) -> dict[str, int]:
    """How many leads each policy would prune now, over every source (``--dry-run``)."""
    now = now or timezone.now()
    due = dict.fromkeys(POLICIES, 0)
    for source in Source.objects.order_by("pk"):
        for policy, days in retention_periods(source).items():
            if days:
                due[policy] += _candidates(policy, source, now - timedelta(days=days)).count()
    return due
