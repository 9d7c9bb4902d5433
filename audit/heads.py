"""Chain heads kept outside the database: what ``audit_verify --heads`` checks the log against.

A hash chain alone cannot tell that its last rows were deleted, or that a row was rewritten and
every hash after it recomputed. The head of each chain (its last sequence number and hash),
exported regularly to a file kept away from the database and keyed with an HMAC the database
does not hold, can: a later log must still contain each exported head unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from audit.models import Event
from audit.verify import Finding


class HeadsFileError(ValueError):
    """The heads file is unreadable, malformed, or its signature does not match."""


def _key() -> bytes:
    configured = getattr(settings, "AUDIT_HEADS_KEY", "") or ""
    secret = configured or f"audit-heads:{settings.SECRET_KEY}"
    return secret.encode("utf-8")


def _sign(heads: dict[str, list[Any]]) -> str:
    body = json.dumps(heads, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hmac.new(_key(), body, hashlib.sha256).hexdigest()


def audit_heads_export() -> dict[str, Any]:
    """Every chain's head as ``{"heads": {chain: [seq, hash]}, "signature": hmac}``.

    One pass over the log in (chain, seq) order, by the unique index: the last row of each
    chain is its head.
    """
    heads: dict[str, list[Any]] = {}
    rows = Event.objects.order_by("chain", "seq").values_list("chain", "seq", "hash")
    for chain, seq, digest in rows.iterator(chunk_size=5000):
        heads[chain] = [seq, digest]
    return {"version": 1, "heads": heads, "signature": _sign(heads)}


@dataclass(frozen=True, slots=True)
class HeadsReport:
    checked: int
    findings: list[Finding]


def audit_heads_check(document: Any) -> HeadsReport:
    """Compare the log with exported heads: each must still be there, with the same hash."""
    if not isinstance(document, dict) or not isinstance(document.get("heads"), dict):
        raise HeadsFileError("not a heads file")
    heads = document["heads"]
    if not hmac.compare_digest(str(document.get("signature", "")), _sign(heads)):
        raise HeadsFileError("the heads file's signature does not match (edited, or another key)")
    findings: list[Finding] = []
    for chain, head in heads.items():
        seq, digest = head
        row = Event.objects.filter(chain=chain, seq=seq).values_list("id", "hash").first()
        if row is None:
            findings.append(
                Finding("truncated", chain, seq, None, "an exported head is gone from the log")
            )
        elif row[1] != digest:
            findings.append(
                Finding("rewritten", chain, seq, row[0], "differs from the exported head")
            )
    return HeadsReport(checked=len(heads), findings=findings)
