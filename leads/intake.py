"""Reading an intake request as its source's kind reads it: the request as the kind's hooks see
it, the records in its body, and the vendor's signature. Used by the intake views and by the
refused inbox's re-acceptance, so a refused payload is read again exactly as it first was."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest

from leads.models import Source
from leads.parsing import (
    IntakeError,
    Limits,
    check_value,
    media_type,
    parse_csv,
    parse_form,
    parse_json,
)
from leads.sources import kind_get
from leads.sources.base import DecodeError, Inbound

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def intake_limits() -> Limits:
    return Limits(
        max_depth=settings.INTAKE_MAX_JSON_DEPTH,
        max_keys=settings.INTAKE_MAX_KEYS,
        max_string=settings.INTAKE_MAX_STRING_CHARS,
    )


def inbound_of(request: HttpRequest, body: bytes) -> Inbound:
    """The request as a kind's hooks see it (no Django objects; header names lower-cased)."""
    headers: dict[str, str] = {}
    for key, value in request.META.items():
        if key.startswith("HTTP_"):
            headers[key[5:].replace("_", "-").lower()] = str(value)
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            headers[key.replace("_", "-").lower()] = str(value)
    try:
        url = request.build_absolute_uri()
    except Exception:  # DisallowedHost and the like: the kind gets the path only
        url = request.get_full_path()
    return Inbound(
        method=request.method or "POST",
        body=body,
        content_type=request.META.get("CONTENT_TYPE", ""),
        headers=headers,
        query={key: request.GET.get(key, "") for key in request.GET},
        url=url,
    )


def vendor_signature_check(source: Source, inbound: Inbound, *, now: datetime) -> None:
    """Raise 401 unless the request carries the tool's own valid signature (auth mode vendor)."""
    if not source.requires_vendor_signature:
        return
    kind = kind_get(source.kind)
    if kind.verify is None:
        raise IntakeError(
            401, "unauthorized", f"The {kind.label} kind has no signature scheme to check."
        )
    if not source.vendor_secret:
        raise IntakeError(401, "unauthorized", "The source has no vendor secret to check with.")
    try:
        valid = bool(kind.verify(inbound, source.vendor_secret, now))
    except Exception:  # a verifier that cannot read the request: not verified
        valid = False
    if not valid:
        header = kind.signature_header or "signature"
        raise IntakeError(401, "unauthorized", f"Missing or invalid {header}.")


def read_by_kind(source: Source, request: HttpRequest) -> bool:
    """Whether the body is one the kind's own parser reads (not JSON, not a form)."""
    kind_type = media_type(request)
    return kind_get(source.kind).parse is not None and not (
        kind_type == "application/json" or kind_type.endswith("+json") or kind_type in FORM_TYPES
    )


def records_read(source: Source, request: HttpRequest, body: bytes) -> list[dict[str, Any]]:
    """The records of a single-lead request: one JSON object or form, or what the kind's own
    parser finds in a body of its own format (a SOAP message may carry several)."""
    kind = kind_get(source.kind)
    limits = intake_limits()
    kind_type = media_type(request)
    if kind.parse is not None and read_by_kind(source, request):
        try:
            records = kind.parse(inbound_of(request, body))
        except DecodeError as exc:
            raise IntakeError(400, "invalid_body", f"{kind.label}: {exc}") from None
        except Exception as exc:  # a parser bug must not be a 5xx: the body stays in the inbox
            raise IntakeError(
                400, "invalid_body", f"{kind.label} could not read the body: {type(exc).__name__}"
            ) from None
        if not isinstance(records, list) or not records:
            raise IntakeError(400, "invalid_body", f"{kind.label}: no record in the body.")
        if len(records) > settings.INTAKE_MAX_BATCH:
            raise IntakeError(413, "batch_too_large", "Too many records in one message.")
        for record in records:
            if not isinstance(record, dict):
                raise IntakeError(400, "invalid_body", f"{kind.label}: a record is not an object.")
            check_value(record, limits, where="record")
        return records
    if kind_type == "application/json" or kind_type.endswith("+json"):
        value = parse_json(body, limits)
        if not isinstance(value, dict):
            raise IntakeError(400, "invalid_body", "The body must be a JSON object.")
        return _split(source, value)
    if kind_type in FORM_TYPES:
        return [parse_form(request, limits)]
    raise IntakeError(
        415,
        "unsupported_media_type",
        "Send application/json, application/x-www-form-urlencoded or multipart/form-data.",
    )


def _split(source: Source, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The records one JSON body holds by its source's kind, else it."""
    return records_split(kind=source.kind, options=source.kind_options, record=record)


def records_split(*, kind: str, options: Any, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The records one JSON body holds by ``kind`` (Meta's batched leadgen changes), else it."""
    source_kind = kind_get(kind)
    if source_kind.split is None:
        return [record]
    options = options if isinstance(options, dict) else {}
    try:
        parts = source_kind.split(record, options)
    except Exception:  # a splitter that cannot read the body: the body is one record
        return [record]
    if not isinstance(parts, list) or not parts or len(parts) > settings.INTAKE_MAX_BATCH:
        return [record]
    return [part for part in parts if isinstance(part, dict)] or [record]


def batch_records_read(
    request: HttpRequest, body: bytes, *, max_records: int | None = None
) -> list[Any]:
    """The records of a batch request: a JSON array, a CSV body or a CSV upload in ``file``.

    At most ``max_records`` (the batch limit, ``INTAKE_MAX_BATCH``, unless the refused inbox
    re-reads a batch it kept for being over that limit)."""
    kind = media_type(request)
    limit = settings.INTAKE_MAX_BATCH if max_records is None else max_records
    limits = intake_limits()
    if kind == "application/json" or kind.endswith("+json"):
        value = parse_json(body, limits, check=False)
        if not isinstance(value, list):
            raise IntakeError(400, "invalid_body", "A batch must be a JSON array of objects.")
        if len(value) > limit:
            raise IntakeError(413, "batch_too_large", f"A batch holds at most {limit} records.")
        records = value
    elif kind in ("text/csv", "application/csv"):
        records = parse_csv(body, max_records=limit, limits=limits)
    elif kind == "multipart/form-data":
        try:
            upload = request.FILES.get("file")
        except Exception as exc:  # malformed multipart in any way is the client's error
            raise IntakeError(400, "invalid_body", f"Unreadable upload: {str(exc)[:200]}") from None
        if upload is None:
            raise IntakeError(400, "invalid_body", "Upload the CSV in the form field 'file'.")
        records = parse_csv(upload.read(), max_records=limit, limits=limits)
    else:
        raise IntakeError(
            415,
            "unsupported_media_type",
            "Send a JSON array, text/csv, or multipart/form-data with a CSV in 'file'.",
        )
    if len(records) > limit:
        raise IntakeError(413, "batch_too_large", f"A batch holds at most {limit} records.")
    if not records:
        raise IntakeError(400, "invalid_body", "The batch is empty.")
    return records
