"""A lead's status URL: a capability the page that submitted the lead may hold (issue 20).

The URL names the lead and carries a token signed with Django's signing (HMAC-SHA256 keyed by
``SECRET_KEY``, honouring ``SECRET_KEY_FALLBACKS``); the lead's id is part of the salt, so a
token made for one lead is no token for another. The token holds only its expiry time, set by
the source (``Source.status_minutes``). Checking it needs no database: a forged, expired or
another lead's token costs the server one HMAC, and all of them get the same 404.

What the URL answers is the lead's progress and, once it has an owner, only what the source
reveals (``Source.status_reveal``) of the rep's public face.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core import signing
from django.db import close_old_connections
from django.db.models import FilteredRelation, Q

from leads.models import STATUS_MINUTES_MAX, Lead, LeadStatus, Source, origins_parse

_SALT = "leads.status:"
PENDING = (LeadStatus.RECEIVED, LeadStatus.PROCESSING)
_REP_FIELDS = ("name", "display_name", "photo_url", "booking_url")


@dataclass(frozen=True)
class StatusLink:
    """The status URL handed back with an accepted lead, and when it stops working."""

    url: str
    expires_at: int  # Unix seconds


def _signer(lead_id: uuid.UUID) -> signing.Signer:
    return signing.Signer(salt=_SALT + lead_id.hex)


def status_link_make(*, lead_id: uuid.UUID | str, source: Source, now: datetime) -> StatusLink:
    """The signed status URL of ``lead_id``, valid for the source's ``status_minutes``."""
    lead_uuid = uuid.UUID(str(lead_id))
    minutes = min(max(int(source.status_minutes or 10), 1), STATUS_MINUTES_MAX)
    expires_at = int(now.timestamp()) + minutes * 60
    token = _signer(lead_uuid).sign(format(expires_at, "x"))
    path = f"/api/v1/status/{lead_uuid}/{token}/"
    return StatusLink(url=f"{settings.STATUS_BASE_URL}{path}", expires_at=expires_at)


def status_token_valid(*, lead_id: str, token: str, now: datetime) -> uuid.UUID | None:
    """The lead's id when ``token`` was signed for it and has not expired, else None."""
    try:
        lead_uuid = uuid.UUID(lead_id)
        value = _signer(lead_uuid).unsign(token)
        expires_at = int(value, 16)
    except (ValueError, signing.BadSignature):
        return None
    current = now.timestamp()
    if not current < expires_at <= current + STATUS_MINUTES_MAX * 60:
        return None
    return lead_uuid


def status_wait_seconds(raw: str | None) -> float:
    """``?wait=`` as seconds, clamped to [0, STATUS_WAIT_MAX_SECONDS]; ValueError when no number."""
    if raw is None or raw == "":
        return 0.0
    seconds = float(raw)
    if math.isnan(seconds):
        raise ValueError("not a number")
    return min(max(seconds, 0.0), settings.STATUS_WAIT_MAX_SECONDS)


@dataclass(frozen=True)
class LeadStatusView:
    """What a status URL answers, and the origins that may read it."""

    document: dict[str, Any]
    final: bool
    cors_origins: tuple[str, ...]


def public_status(status: str, has_owner: bool) -> str:
    """The lead's status as the page sees it: waiting, assigned, or finished without an owner.

    Excluded, unassigned and failed all read ``not_assigned``: the page learns nothing about the
    rules (that a competitor's domain is excluded) or about the pipeline.
    """
    if status in PENDING:
        return str(status)
    return "assigned" if has_owner else "not_assigned"


def owner_revealed(rep: dict[str, Any], team: str, reveal: list[str]) -> dict[str, str]:
    """The rep's public face, limited to what the source reveals; empty values left out."""
    name = rep.get("display_name") or rep.get("name") or ""
    values = {
        "name": name,
        "first_name": name.split()[0] if name.split() else "",
        "photo_url": rep.get("photo_url") or "",
        "booking_url": rep.get("booking_url") or "",
        "team": team or "",
    }
    return {key: values[key] for key in reveal if values.get(key)}


def lead_status_read(*, lead_id: uuid.UUID) -> LeadStatusView | None:
    """The status document of a lead (None when it no longer exists), in one query: the lead
    and its source's settings LEFT JOINed to its current (active) assignment and that rep
    (at most one active assignment per lead, a constraint of routing's).

    Under ASGI the status view calls it in a read thread (``lead_status_read_pooled``).
    """
    row = (
        Lead.objects.filter(pk=lead_id)
        .annotate(current=FilteredRelation("assignments", condition=Q(assignments__active=True)))
        .values(
            "status",
            "source__status_reveal",
            "source__cors_origins",
            "current__id",
            "current__team_name",
            *(f"current__rep__{field}" for field in _REP_FIELDS),
        )
        .first()
    )
    if row is None:
        return None
    owner: dict[str, Any] | None = None
    status = row["status"]
    if status not in PENDING and row["current__id"] is not None:
        rep = {field: row[f"current__rep__{field}"] for field in _REP_FIELDS}
        reveal = row["source__status_reveal"]
        reveal = reveal if isinstance(reveal, list) else []
        owner = owner_revealed(rep, row["current__team_name"], reveal)
    shown = public_status(status, owner is not None)
    origins = tuple(origins_parse(row["source__cors_origins"] or ""))
    document = {"id": str(lead_id), "status": shown, "owner": owner}
    return LeadStatusView(document=document, final=status not in PENDING, cors_origins=origins)


def lead_status_read_pooled(lead_id: uuid.UUID) -> LeadStatusView | None:
    """``lead_status_read`` in one of the status process's few read threads (leads.status_api).

    Each thread keeps its own connection between reads (dropped when unusable or older than
    CONN_MAX_AGE, as a request would), so the status process holds at most
    ``STATUS_READ_THREADS`` connections however many requests wait, and a read costs no connect.
    """
    close_old_connections()
    return lead_status_read(lead_id=lead_id)
