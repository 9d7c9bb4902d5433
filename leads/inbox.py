"""The refused inbox: what an authenticated source sent that the kickoff refused, kept so that
no lead is lost. RevOps fixes the source's kind or field map and re-accepts (services here).

A refusal is stored after the source's credentials were checked (an unauthenticated sender
cannot fill the inbox), bounded per source (``REFUSED_INBOX_PER_SOURCE``, oldest dropped), with
its headers minus anything secret. The body is kept as sent; a token in the URL never is.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import WSGIRequest
from django.db import DatabaseError, transaction
from django.db.models import Count
from django.utils import timezone

from config.logging import redact
from leads import lanes
from leads.models import RefusedPayload, RefusedState, Source
from leads.parsing import IntakeError
from leads.sources import kind_get, kinds

logger = logging.getLogger(__name__)

# Statuses whose payload a person can fix by changing the source: a body we could not read,
# a media type we did not take, a record that was not a lead. (401, 404, 413 and 429 are not
# kept: an unauthenticated or too large body, or one the sender will retry.)
KEPT_STATUSES = frozenset({400, 415, 422})
# Except a batch refused for its row count alone (a webinar report of 3,000 attendees): its body
# is under the byte cap, the sender cannot split it, and re-accepting takes it in by chunks.
BATCH_TOO_LARGE = "batch_too_large"

_SECRET_HEADER_WORDS = (
    "authorization",
    "cookie",
    "token",
    "secret",
    "signature",
    "api-key",
    "apikey",
    "password",
    "session",
    "x-hub-signature",
)


def safe_headers(meta: Mapping[str, Any]) -> dict[str, str]:
    """The request's headers from a WSGI environ, minus every one that may carry a secret."""
    headers: dict[str, str] = {}
    for key, value in meta.items():
        if key.startswith("HTTP_"):
            name = key[5:].replace("_", "-").title()
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            name = key.replace("_", "-").title()
        else:
            continue
        lowered = name.lower()
        if any(word in lowered for word in _SECRET_HEADER_WORDS):
            continue
        # A proxy's original-URL header (X-Original-URI, Referer...) may carry ?token=.
        headers[name] = redact(str(value)[:1000])
    return headers


def refused_record(
    *,
    source: Source,
    meta: Mapping[str, Any],
    body: bytes,
    error: IntakeError,
    batch_index: int | None = None,
    content_type: str | None = None,
    batch: bool = False,
) -> RefusedPayload | None:
    """Keep one refused payload; never raises (the sender still gets its 4xx either way)."""
    too_many_rows = batch and error.status == 413 and error.code == BATCH_TOO_LARGE
    if error.status not in KEPT_STATUSES and not too_many_rows:
        return None
    body = _body_redacted(source, body)
    try:
        with transaction.atomic():
            refused = RefusedPayload.objects.create(
                source=source,
                content_type=(content_type or str(meta.get("CONTENT_TYPE", "")))[:255],
                headers=safe_headers(meta),
                body=body,
                batch_index=batch_index,
                batch=batch,
                status_code=error.status,
                reason=error.code[:64],
                message=error.message[:2000],
            )
        # Bounded per source on every refusal: one indexed look at the row past the bound.
        refused_prune(source=source)
    except DatabaseError:
        logger.exception("could not keep a refused payload of source %s", source.slug)
        return None
    return refused


def _body_redacted(source: Source, body: bytes) -> bytes:
    """The body without any kind's secret, the source's own kind first: a tool's payload sent
    to a source of another kind (a Salesforce Outbound Message at a generic source) keeps its
    secret out of the inbox too."""
    own = kind_get(source.kind)
    for kind in (own, *(other for other in kinds().values() if other is not own)):
        if kind.redact_body is None:
            continue
        try:
            body = bytes(kind.redact_body(body))
        except Exception:  # keep nothing rather than a secret: the reason still says what came
            logger.exception("the %s kind could not redact a refused body", kind.name)
            return b""
    return body


def refused_record_batch(
    *,
    source: Source,
    meta: Mapping[str, Any],
    refusals: Iterable[tuple[int, Any, IntakeError]],
) -> int:
    """Keep the refused records of a batch, each as a JSON record of its own: one INSERT and
    one prune for the batch (one by one, each on its own, if that INSERT fails)."""
    kept = [
        (index, _refused_record_body(source, record), error)
        for index, record, error in refusals
        if error.status in KEPT_STATUSES
    ]
    if not kept:
        return 0
    headers = safe_headers(meta)
    try:
        with transaction.atomic():
            RefusedPayload.objects.bulk_create(
                [
                    RefusedPayload(
                        source=source,
                        content_type="application/json",
                        headers=headers,
                        body=_body_redacted(source, body),
                        batch_index=index,
                        batch=False,
                        status_code=error.status,
                        reason=error.code[:64],
                        message=error.message[:2000],
                    )
                    for index, body, error in kept
                ]
            )
        refused_prune(source=source)
    except DatabaseError:
        logger.exception("could not keep a batch's refusals of source %s at once", source.slug)
        return sum(
            1
            for index, body, error in kept
            if refused_record(
                source=source,
                meta=meta,
                body=body,
                error=error,
                batch_index=index,
                content_type="application/json",
            )
        )
    return len(kept)


def _refused_record_body(source: Source, record: Any) -> bytes:
    from leads.services import record_redact

    if isinstance(record, dict):
        record = record_redact(source, record)
    try:
        return json.dumps(record, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError):
        return repr(record).encode("utf-8", "replace")


def refused_prune(*, source: Source, keep: int | None = None) -> int:
    """Drop the source's oldest refusals beyond ``keep`` (REFUSED_INBOX_PER_SOURCE)."""
    keep = settings.REFUSED_INBOX_PER_SOURCE if keep is None else keep
    newest = RefusedPayload.objects.filter(source=source).order_by("-received_at", "-id")
    if not newest.values_list("id", flat=True)[keep : keep + 1]:
        return 0
    stale = list(
        RefusedPayload.objects.filter(source=source)
        .order_by("-received_at", "-id")
        .values_list("id", flat=True)[keep : keep + 5000]
    )
    if not stale:
        return 0
    deleted, _ = RefusedPayload.objects.filter(id__in=stale).delete()
    return deleted


# --- re-acceptance ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reaccepted:
    """What re-accepting one refused payload did."""

    refused_id: int
    lead_ids: tuple[str, ...] = ()
    error: str = ""
    already: bool = False


def _stored_request(refused: RefusedPayload) -> WSGIRequest:
    """The refused request rebuilt from what was kept, for the intake's own body reading."""
    body = bytes(refused.body)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": f"/api/v1/intake/{refused.source.slug}/",
        "SERVER_NAME": "refused-inbox",
        "SERVER_PORT": "80",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "CONTENT_TYPE": refused.content_type,
        "CONTENT_LENGTH": str(len(body)),
    }
    return WSGIRequest(environ)


def refused_reaccept(*, refused_id: int, actor: str) -> Reaccepted:
    """Take one refused payload in again as a lead, read by its source as it is now.

    Idempotent: the lead's idempotency key is the record's own (an external id) or
    ``refused:<id>[:<row>]``, and a payload already re-accepted answers with its lead. A batch
    is taken in ``INTAKE_MAX_BATCH`` rows per transaction, so one kept for being over that limit
    is accepted whole, and a re-acceptance cut short is finished by the next one with no twin.
    Audited: each lead's ``received`` event names the person and the refusal.
    """
    from leads.intake import batch_records_read, records_read

    with transaction.atomic():
        refused = (
            RefusedPayload.objects.select_for_update(of=("self",))
            .select_related("source")
            .filter(pk=refused_id)
            .first()
        )
        if refused is None:
            return Reaccepted(refused_id, error="No such refused payload.")
        if refused.state == RefusedState.ACCEPTED and refused.lead_id is not None:
            return Reaccepted(refused_id, lead_ids=(str(refused.lead_id),), already=True)
        source = refused.source
        try:
            request = _stored_request(refused)
            if refused.batch:
                # The kept body is under the byte cap, so it holds no more rows than bytes.
                records = batch_records_read(
                    request, bytes(refused.body), max_records=settings.INTAKE_MAX_BODY_BYTES
                )
            else:
                records = records_read(source, request, bytes(refused.body))
        except IntakeError as error:
            return Reaccepted(refused_id, error=f"{error.code}: {error.message}")
    lead_ids: list[str] = []
    still_refused: list[tuple[int, Any, IntakeError]] = []
    chunk = max(1, settings.INTAKE_MAX_BATCH)
    for start in range(0, len(records), chunk):
        with transaction.atomic():
            for index in range(start, min(start + chunk, len(records))):
                refusal = _reaccept_one(refused, records, index, actor, lead_ids)
                if refusal is None:
                    continue
                if not refused.batch:
                    return Reaccepted(refused_id, error=f"{refusal.code}: {refusal.message}")
                still_refused.append((index, records[index], refusal))
    if not lead_ids:
        first_error = still_refused[0][2] if still_refused else None
        reason = f"{first_error.code}: {first_error.message}" if first_error else "empty"
        return Reaccepted(refused_id, error=f"no record of the batch is a lead ({reason})")
    with transaction.atomic():
        refused = RefusedPayload.objects.select_for_update().get(pk=refused.pk)
        if refused.state == RefusedState.ACCEPTED and refused.lead_id is not None:
            # Another re-acceptance finished first: the same leads, by the same keys.
            return Reaccepted(refused_id, lead_ids=(str(refused.lead_id),), already=True)
        # A batch's rows that are still no leads are kept one by one, as a batch's are.
        refused_record_batch(
            source=source, meta={"CONTENT_TYPE": "application/json"}, refusals=still_refused
        )
        refused.state = RefusedState.ACCEPTED
        refused.lead_id = lead_ids[0]
        refused.handled_at = timezone.now()
        refused.handled_by = actor[:200]
        refused.save(update_fields=["state", "lead", "handled_at", "handled_by"])
    return Reaccepted(refused_id, lead_ids=tuple(lead_ids))


def _reaccept_one(
    refused: RefusedPayload, records: list[Any], index: int, actor: str, lead_ids: list[str]
) -> IntakeError | None:
    """Ingest row ``index`` of a refused payload (its lead id appended), or why it is no lead."""
    from leads import services

    record = records[index]
    suffix = f":{index}" if len(records) > 1 or refused.batch else ""
    try:
        accepted = services.lead_ingest(
            source=refused.source,
            record=record if isinstance(record, dict) else {},
            fallback_key=f"refused:{refused.pk}{suffix}",
            actor=actor,
            path=lanes.OTHER,
            received_data={
                "reaccepted_from": refused.pk,
                "refused_at": refused.received_at.isoformat(),
                "refused_reason": refused.reason,
            },
        )
    except IntakeError as error:
        return error
    lead_ids.append(str(accepted.lead_id))
    return None


def refused_dismiss(*, refused_ids: Iterable[int], actor: str) -> int:
    """Mark refused payloads as looked at and not leads (they stay until pruned)."""
    return RefusedPayload.objects.filter(id__in=list(refused_ids), state=RefusedState.OPEN).update(
        state=RefusedState.DISMISSED, handled_at=timezone.now(), handled_by=actor[:200]
    )


# --- the alert -------------------------------------------------------------------------------


def refusals_by_source(*, since: datetime) -> dict[str, int]:
    """{source slug: open refusals received since ``since``}."""
    rows = (
        RefusedPayload.objects.filter(received_at__gte=since, state=RefusedState.OPEN)
        .values("source__slug")
        .annotate(n=Count("id"))
    )
    return {row["source__slug"]: row["n"] for row in rows}


def refusal_window() -> timedelta:
    return timedelta(minutes=settings.REFUSED_ALERT_WINDOW_MINUTES)
