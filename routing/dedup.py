"""Dedup in the worker, against live state (rules-format.md "Dedup").

A lead is matched by its normalised e-mail, else (no valid e-mail) its E.164 phone, against
leads of the last ``DEDUP_WINDOW_DAYS`` that were deduped before it and are not duplicates
themselves; the earliest such lead is the original. Matching and marking happen under
transaction-scoped advisory locks on the lead's keys (PostgreSQL; SQLite serialises writers),
held until the worker's transaction commits, so two copies of one new person processed at the
same moment give exactly one original: the second waits, then sees the first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection

from leads.models import Lead
from leads.normalize import FLAG_INVALID_EMAIL, FLAG_INVALID_PHONE


@dataclass(frozen=True, slots=True)
class DedupMatch:
    """The earlier lead this one duplicates, and on which key."""

    original: Lead
    key: str  # "email:…" or "phone:…"


def dedup_keys(lead: Lead) -> list[str]:
    """The key a lead is matched on: its e-mail, else (no valid e-mail) its phone.

    Two people with their own e-mails who share a switchboard number are not one person.
    """
    flags = set(lead.flags or [])
    if lead.email and FLAG_INVALID_EMAIL not in flags:
        return [f"email:{lead.email}"]
    if lead.phone and FLAG_INVALID_PHONE not in flags:
        return [f"phone:{lead.phone}"]
    return []


def dedup_lock_keys(lead: Lead) -> list[str]:
    """The keys locked while a lead is matched: both of them (matching uses one), so a lead
    with an e-mail and one with only the same phone, processed together, are still taken one
    after the other."""
    flags = set(lead.flags or [])
    lockable = [f"email:{lead.email}"] if lead.email and FLAG_INVALID_EMAIL not in flags else []
    if lead.phone and FLAG_INVALID_PHONE not in flags:
        lockable.append(f"phone:{lead.phone}")
    return lockable


def dedup_lock_many(keys: Iterable[str]) -> None:
    """Lock many leads' keys in one statement, in the same (sorted) order as ``_lock``."""
    ordered = sorted(set(keys))
    if connection.vendor != "postgresql" or not ordered:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0))) FROM "
            "(SELECT k FROM unnest(%s::text[]) AS k ORDER BY k) AS sorted",
            [["dedup:" + key for key in ordered]],
        )


def _lock(keys: list[str]) -> None:
    if connection.vendor != "postgresql" or not keys:
        return
    with connection.cursor() as cursor:
        # Sorted, so two workers locking overlapping keys cannot deadlock.
        for key in sorted(keys):
            cursor.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ["dedup:" + key]
            )


def lead_dedup(*, lead: Lead, now: datetime) -> DedupMatch | None:
    """Match ``lead`` against earlier leads and mark it deduped (in memory; the caller saves).

    Must run inside the worker's transaction: the locks are held until it commits, which is
    also when this lead becomes visible to later matches (``deduped_at`` set).
    """
    keys = dedup_keys(lead)
    lead.deduped_at = now
    lead.dedup_key = keys[0] if keys else ""
    if not keys:
        return None
    _lock(dedup_lock_keys(lead))
    since = now - timedelta(days=settings.DEDUP_WINDOW_DAYS)
    for key in keys:
        field, value = key.split(":", 1)
        original = (
            Lead.objects.filter(
                **{field: value},
                duplicate_of__isnull=True,
                deduped_at__isnull=False,
                received_at__gte=since,
            )
            .exclude(pk=lead.pk)
            .order_by("received_at", "id")
            .first()
        )
        if original is not None:
            lead.duplicate_of = original
            lead.dedup_key = key
            return DedupMatch(original=original, key=key)
    return None
