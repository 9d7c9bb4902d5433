"""Check the hash chains of the audit log: which rows were altered, which were removed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from audit.hashing import HASHED, SEALED, event_hash
from audit.models import Event, EventType


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem in one chain: ``altered`` (the row's hash does not match its contents),
    ``relinked`` (its prev_hash is not the hash of the row before it), or ``missing`` (a gap
    in the sequence: rows removed)."""

    kind: str
    chain: str
    seq: int
    event_id: int | None
    detail: str

    def __str__(self) -> str:
        row = f"event id {self.event_id}" if self.event_id is not None else "no row"
        return f"{self.kind}: chain {self.chain} seq {self.seq} ({row}): {self.detail}"


@dataclass(slots=True)
class Report:
    chains: int = 0
    events: int = 0
    # Erasures are not tampering: `erased` events, and sealed events whose key is destroyed.
    erasures: int = 0
    sealed_erased: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings


def _rows(chain: str | None, batch: int) -> Iterator[dict[str, Any]]:
    rows = Event.objects.order_by("chain", "seq")
    if chain is not None:
        rows = rows.filter(chain=chain)
    # Inside a transaction the server-side cursor is an ordinary one that PostgreSQL streams;
    # outside, Django declares it WITH HOLD, and PostgreSQL materialises the whole log first.
    with transaction.atomic():
        yield from rows.values("id", "hash", *HASHED, *SEALED).iterator(chunk_size=batch)


def _erased_key_ids() -> set[int]:
    from leads.models import PersonKey

    return set(PersonKey.objects.filter(wrapped__isnull=True).values_list("pk", flat=True))


def audit_verify(*, chain: str | None = None, batch: int = 2000) -> Report:
    """Recompute every event's hash and follow each chain; report what does not hold."""
    report = Report()
    current = ""
    expected_seq = 1
    prev_hash = ""
    erased_keys = _erased_key_ids()
    for row in _rows(chain, batch):
        if row["type"] == EventType.ERASED:
            report.erasures += 1
        if row["sealed"] and row["person_key_id"] in erased_keys:
            report.sealed_erased += 1
        if report.events == 0 or row["chain"] != current:
            current = row["chain"]
            report.chains += 1
            expected_seq = 1
            prev_hash = ""
        report.events += 1
        seq = row["seq"]
        if seq > expected_seq:
            for gone in range(expected_seq, seq):
                report.findings.append(
                    Finding("missing", current, gone, None, "row removed from the chain")
                )
        if event_hash(row) != row["hash"]:
            report.findings.append(
                Finding("altered", current, seq, row["id"], "contents do not match its hash")
            )
        if row["prev_hash"] != prev_hash and seq == expected_seq:
            report.findings.append(
                Finding(
                    "relinked",
                    current,
                    seq,
                    row["id"],
                    "its link does not match the hash of the row before it",
                )
            )
        prev_hash = row["hash"]
        expected_seq = seq + 1
    return report
