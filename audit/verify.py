"""Check the hash chains of the audit log: which rows were altered, which were removed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from audit.hashing import HASHED, SEALED, event_hash
from audit.models import Event, EventType
from leads import privacy


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


@dataclass(frozen=True, slots=True)
class KeyProblem:
    """A person key that cannot open its sealed events, without an erasure to explain it: not
    tampering of the chain (the hashes hold), but personal data lost. ``kind`` is ``missing``
    (no such key row), ``destroyed`` (destroyed without ``erased_at``: no erasure or retention
    recorded it), ``unrecorded`` (marked erased, but the event's chain holds no ``erased`` or
    ``pruned`` event: the key table alone was changed), ``lost`` (no key in ``PRIVACY_KEYS``
    unwraps it) or ``unopenable`` (it unwraps, but does not open what was sealed with it: the
    wrapped key was replaced)."""

    kind: str
    person_key_id: int
    events: int

    def __str__(self) -> str:
        why = {
            "missing": "no such person key",
            "destroyed": "destroyed without an erasure record",
            "unrecorded": "marked erased, but no erasure or pruning is in its lead's audit chain",
            "lost": "no key in PRIVACY_KEYS unwraps it (a master key removed or lost)",
            "unopenable": "it does not open what was sealed with it",
        }[self.kind]
        return (
            f"lost key: person key {self.person_key_id} ({why}): {self.events} sealed "
            "event(s) unreadable"
        )


@dataclass(slots=True)
class Report:
    chains: int = 0
    events: int = 0
    # Erasures are not tampering: `erased` events, and sealed events whose key an erasure (or
    # retention) destroyed, as its `erased_at` records.
    erasures: int = 0
    sealed_erased: int = 0
    findings: list[Finding] = field(default_factory=list)
    # Sealed events no key opens and no erasure explains: lost data, not tampering.
    key_problems: list[KeyProblem] = field(default_factory=list)

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


class _Keys:
    """The person keys of sealed events, read once each: erased (proven by ``erased_at``), or
    the unwrapped key, or why it cannot open anything."""

    def __init__(self) -> None:
        self._state: dict[int, tuple[str, Any]] = {}

    def state(self, key_id: int) -> tuple[str, Any]:
        if key_id not in self._state:
            self._state[key_id] = self._read(key_id)
        return self._state[key_id]

    def _read(self, key_id: int) -> tuple[str, Any]:
        from leads.models import PersonKey

        row = PersonKey.objects.filter(pk=key_id).values_list("wrapped", "erased_at").first()
        if row is None:
            return "missing", None
        wrapped, erased_at = row
        if wrapped is None:
            return ("erased", None) if erased_at is not None else ("destroyed", None)
        try:
            fernet = privacy.unwrap(wrapped)
        except privacy.PrivacyKeyError:
            return "lost", None
        return "live", fernet


# The events that destroy a person's key with a record in the hash chain (routing/erasure.py,
# routing/retention/): a key marked erased counts as erased only in a chain that holds one.
_ERASING = frozenset({EventType.ERASED, EventType.PRUNED})


class _Chain:
    """What one chain has shown so far: its sealed events whose key is marked erased (by key),
    and whether an erasure or pruning is recorded in it."""

    def __init__(self) -> None:
        self.sealed_erased: dict[int, int] = {}
        self.erasing = False

    def close(self, report: Report, problems: dict[tuple[str, int], int]) -> None:
        for key_id, n in self.sealed_erased.items():
            if self.erasing:
                report.sealed_erased += n
            else:
                problem = ("unrecorded", key_id)
                problems[problem] = problems.get(problem, 0) + n


def _key_check(keys: _Keys, row: dict[str, Any], problems: dict[tuple[str, int], int]) -> bool:
    """Whether the sealed ``row`` is under a key marked erased (else any problem is counted)."""
    state, fernet = keys.state(row["person_key_id"])
    if state == "erased":
        return True
    if state == "live":
        try:
            privacy.unseal(fernet, row["sealed"])
        except (privacy.PrivacyKeyError, ValueError, TypeError):
            state = "unopenable"
        else:
            return False
    problem = (state, row["person_key_id"])
    problems[problem] = problems.get(problem, 0) + 1
    return False


def audit_verify(*, chain: str | None = None, batch: int = 2000) -> Report:
    """Recompute every event's hash and follow each chain; report what does not hold."""
    report = Report()
    current = ""
    expected_seq = 1
    prev_hash = ""
    keys = _Keys()
    problems: dict[tuple[str, int], int] = {}
    seen = _Chain()
    for row in _rows(chain, batch):
        if report.events == 0 or row["chain"] != current:
            seen.close(report, problems)
            seen = _Chain()
            current = row["chain"]
            report.chains += 1
            expected_seq = 1
            prev_hash = ""
        if row["type"] == EventType.ERASED:
            report.erasures += 1
        if row["type"] in _ERASING:
            seen.erasing = True
        if row["sealed"]:
            if row["person_key_id"] is None:
                problems[("missing", 0)] = problems.get(("missing", 0), 0) + 1
            elif _key_check(keys, row, problems):
                key_id = row["person_key_id"]
                seen.sealed_erased[key_id] = seen.sealed_erased.get(key_id, 0) + 1
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
    seen.close(report, problems)
    report.key_problems = [
        KeyProblem(kind, key_id, n) for (kind, key_id), n in sorted(problems.items())
    ]
    return report
