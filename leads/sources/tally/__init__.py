"""Tally: the ``FORM_RESPONSE`` webhook.

Shapes from Tally's help centre, "Webhooks" (https://tally.so/help/webhooks): the event
envelope (``eventId``, ``eventType``, ``createdAt``, ``data``) and ``data.fields[]``, one per
question, each with ``key``, ``label``, ``type`` and ``value``; the choice questions
(``MULTIPLE_CHOICE``, ``DROPDOWN``, ``CHECKBOXES``, ``MULTI_SELECT``, ``RANKING``) send option
ids in ``value`` and the options as ``options[{id, text}]``; a Checkboxes question also sends one
boolean entry per option (``key`` = the question's key + ``_`` + the option id). ``data`` also
holds ``responseId`` / ``submissionId``, ``respondentId``, ``formId``, ``formName``. "Add a
signing secret": the ``Tally-Signature`` header is the base64 HMAC-SHA256 of the payload keyed
by the webhook's signing secret.

An answer becomes a canonical field by its question type (e-mail, phone) or its label;
everything else is kept under its label. The submission id is the idempotency key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import datetime
from typing import Any

from leads.sources.base import (
    Inbound,
    Options,
    Record,
    SourceKind,
    as_text,
    get,
    put,
    scalar_or_joined,
)
from leads.sources.labels import (
    CHOICE_TARGETS,
    NUMBER_TARGETS,
    TEXT_TARGETS,
    question_target,
)

SIGNATURE_HEADER = "Tally-Signature"

_TYPE_TARGETS = {"INPUT_EMAIL": "email", "INPUT_PHONE_NUMBER": "phone"}
_TEXT_TYPES = frozenset({"INPUT_TEXT", "TEXTAREA", "INPUT_LINK", "HIDDEN_FIELDS"})
_CHOICE_TYPES = frozenset({"MULTIPLE_CHOICE", "DROPDOWN", "CHECKBOXES", "MULTI_SELECT", "RANKING"})
_NUMBER_TYPES = frozenset({"INPUT_NUMBER", "CALCULATED_FIELDS", "LINEAR_SCALE", "RATING"})
_NOT_WEBSITE = ("linkedin", "twitter", "calendar", "github", "portfolio", "profile")


def _options_text(value: Any, options: Any) -> Any:
    """Option ids → their texts, joined "a; b" (ids with no option are kept as sent)."""
    texts: dict[str, str] = {}
    for option in options if isinstance(options, list) else ():
        if isinstance(option, dict) and isinstance(option.get("id"), str):
            texts[option["id"]] = as_text(option.get("text"))
    picked = value if isinstance(value, list) else [value]
    words = [texts.get(as_text(item)) or as_text(item) for item in picked]
    words = [word for word in words if word.strip()]
    return "; ".join(words) or None


def _value(field: dict[str, Any]) -> Any:
    kind = as_text(field.get("type"))
    value = field.get("value")
    if kind in _CHOICE_TYPES and field.get("options") is not None:
        return _options_text(value, field.get("options"))
    if kind == "FILE_UPLOAD" or kind == "SIGNATURE":
        # [{id, name, url, mimeType, size}]: the links are the answer.
        files = value if isinstance(value, list) else [value]
        urls = [as_text(get(item, "url")) for item in files if isinstance(item, dict)]
        return "; ".join(url for url in urls if url) or None
    if isinstance(value, dict):
        # A matrix or payment answer: "row: column; ..." reads better than JSON.
        parts = [(k, as_text(scalar_or_joined(v))) for k, v in value.items()]
        return "; ".join(f"{k}: {text}" for k, text in parts if text.strip()) or None
    return scalar_or_joined(value)


def _target(kind: str, label: str) -> str | None:
    if kind in _TYPE_TARGETS:
        return _TYPE_TARGETS[kind]
    if kind in _TEXT_TYPES or not kind:
        target = question_target(label, TEXT_TARGETS)
        other_link = any(word in label.casefold() for word in _NOT_WEBSITE)
        if target is None and kind == "INPUT_LINK" and not other_link:
            target = "website"
        return target
    if kind in _CHOICE_TYPES:
        return question_target(label, CHOICE_TARGETS)
    if kind in _NUMBER_TYPES:
        return question_target(label, NUMBER_TARGETS)
    return None


def decode(record: Record, options: Options) -> Record:
    data = get(record, "data")
    if not isinstance(data, dict):
        data = record  # the ``data`` object posted on its own (a relay that unwraps it)
    fields = get(data, "fields")
    fields = [f for f in fields if isinstance(f, dict)] if isinstance(fields, list) else []
    keys = {as_text(f.get("key")) for f in fields if f.get("options") is not None}

    out: Record = {}
    custom: list[tuple[str, Any]] = []
    for field in fields:
        key = as_text(field.get("key"))
        kind = as_text(field.get("type"))
        # A Checkboxes question's per-option true/false entries repeat its answer.
        if isinstance(field.get("value"), bool) and kind == "CHECKBOXES":
            parent, _, _option = key.rpartition("_")
            if parent in keys:
                continue
        label = as_text(field.get("label")).strip()
        value = _value(field)
        if value is None or as_text(value).strip() == "":
            continue
        target = _target(kind, label)
        if target is not None and target not in out:
            out[target] = value
        else:
            custom.append((label or key, value))
    for name, value in custom:
        put(out, name, value)

    put(out, "external_id", get(data, "submissionId") or get(data, "responseId"))
    put(out, "tally_event_id", get(record, "eventId"))
    put(out, "tally_respondent_id", get(data, "respondentId"))
    put(out, "tally_form_id", get(data, "formId"))
    put(out, "tally_form_name", get(data, "formName"))
    put(out, "submitted_at", get(data, "createdAt") or get(record, "createdAt"))
    return out


def verify(inbound: Inbound, secret: str, now: datetime) -> bool:
    """``Tally-Signature: <base64 HMAC-SHA256 of the body, keyed by the signing secret>``
    (no timestamp is signed)."""
    sent = inbound.header(SIGNATURE_HEADER).strip()
    if not secret or not sent:
        return False
    digest = hmac.new(secret.encode("utf-8"), inbound.body, hashlib.sha256).digest()
    return hmac.compare_digest(sent, base64.b64encode(digest).decode("ascii"))


KIND = SourceKind(
    name="tally",
    label="Tally (FORM_RESPONSE webhook)",
    docs="https://tally.so/help/webhooks",
    decode=decode,
    verify=verify,
    signature_header=SIGNATURE_HEADER,
)
