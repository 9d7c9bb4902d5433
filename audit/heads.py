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
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.models import Event
from audit.verify import Finding, audit_verify

logger = logging.getLogger(__name__)

# The alert a failed scheduled export opens (kind "audit"), resolved by the next success.
EXPORT_ALERT_SUBJECT = "heads-export"
# The alert the nightly verification opens when the log does not hold (kind "audit").
VERIFY_ALERT_SUBJECT = "verify"
HEADS_FILE_PATTERN = "heads-*.json"


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
    # In a transaction, PostgreSQL's server-side cursor streams: outside one Django declares it
    # WITH HOLD, which computes the whole result in one statement (and a worker's
    # statement_timeout would cut that short on a big log).
    with transaction.atomic():
        for chain, seq, digest in rows.iterator(chunk_size=5000):
            heads[chain] = [seq, digest]
    return {"version": 1, "heads": heads, "signature": _sign(heads)}


def audit_heads_write(*, directory: Path, keep: int, now: datetime | None = None) -> Path:
    """Write the signed heads to a new ``heads-<UTC time>.json`` in ``directory`` and delete
    all but the newest ``keep`` heads files there (0 keeps them all).

    The file appears whole or not at all (written beside, synced, then renamed), so a crash
    cannot leave a truncated file that ``audit_verify --heads`` would refuse.
    """
    now = now or timezone.now()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"heads-{now.astimezone(UTC):%Y%m%dT%H%M%SZ}.json"
    partial = directory / f".{path.name}.partial"
    text = json.dumps(audit_heads_export(), indent=1, sort_keys=True) + "\n"
    with partial.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    if keep > 0:
        # The names sort by time: the oldest come first.
        for old in sorted(directory.glob(HEADS_FILE_PATTERN))[:-keep]:
            old.unlink(missing_ok=True)
    return path


def audit_heads_export_scheduled(*, now: datetime | None = None) -> Path | None:
    """The nightly export (beat): heads into ``AUDIT_HEADS_DIR``, the newest
    ``AUDIT_HEADS_KEEP`` kept. A failure is logged at ERROR and opens the ``audit`` alert
    (never raised: the alert is the record); the next success resolves it."""
    from routing.monitoring.alerts import alert_raise, alert_resolve
    from routing.monitoring.models import AlertKind

    directory = Path(settings.AUDIT_HEADS_DIR)
    try:
        path = audit_heads_write(directory=directory, keep=settings.AUDIT_HEADS_KEEP, now=now)
    except Exception as error:
        logger.exception("exporting the audit chain heads to %s failed", directory)
        alert_raise(
            kind=AlertKind.AUDIT,
            subject=EXPORT_ALERT_SUBJECT,
            message=f"The nightly export of the audit chain heads to {directory} failed: "
            f"{type(error).__name__}: {error}",
            now=now,
        )
        return None
    logger.info("audit chain heads exported to %s", path)
    alert_resolve(kind=AlertKind.AUDIT, subject=EXPORT_ALERT_SUBJECT, now=now)
    return path


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


def audit_verify_scheduled(*, now: datetime | None = None) -> list[Finding] | None:
    """The nightly verification (beat, before the export): every chain recomputed, and the
    newest heads file in ``AUDIT_HEADS_DIR`` (the previous night's) checked against the log.

    Findings open the ``audit`` alert (subject ``verify``) naming how many rows and the first
    few; a clean run resolves it. Returns the findings, or None when the check itself could not
    run (logged at ERROR, and alerted too: a verification that silently stops is no check).
    """
    from routing.monitoring.alerts import alert_raise, alert_resolve
    from routing.monitoring.models import AlertKind

    directory = Path(settings.AUDIT_HEADS_DIR)
    try:
        report = audit_verify()
        findings = list(report.findings)
        for problem in report.key_problems:  # lost data, not tampering: said, not alerted as such
            logger.error("audit verification: %s", problem)
        files = sorted(directory.glob(HEADS_FILE_PATTERN)) if directory.is_dir() else []
        checked = ""
        if files:
            heads = audit_heads_check(json.loads(files[-1].read_text(encoding="utf-8")))
            findings += heads.findings
            checked = f" and {heads.checked} heads of {files[-1].name}"
    except Exception as error:
        logger.exception("the nightly audit verification could not run")
        alert_raise(
            kind=AlertKind.AUDIT,
            subject=VERIFY_ALERT_SUBJECT,
            message=f"The nightly audit verification could not run: {type(error).__name__}: "
            f"{error}",
            now=now,
        )
        return None
    if findings:
        shown = "; ".join(
            f"{f.kind} {f.chain} #{f.seq}" + (f" (event {f.event_id})" if f.event_id else "")
            for f in findings[:5]
        )
        more = f" and {len(findings) - 5} more" if len(findings) > 5 else ""
        logger.error("audit verification: %d finding(s): %s%s", len(findings), shown, more)
        alert_raise(
            kind=AlertKind.AUDIT,
            subject=VERIFY_ALERT_SUBJECT,
            message=f"The audit log does not verify: {len(findings)} finding(s): {shown}{more}. "
            "Run manage.py audit_verify --heads <file> for the full list.",
            now=now,
        )
        return findings
    logger.info(
        "audit verification: %d events in %d chains%s intact", report.events, report.chains, checked
    )
    alert_resolve(kind=AlertKind.AUDIT, subject=VERIFY_ALERT_SUBJECT, now=now)
    return findings
