"""Webflow: the ``form_submission`` webhook, v2 and v1.

Shapes from Webflow's developer docs: "Form Submission" event, Data API v2
(https://developers.webflow.com/data/reference/webhooks/events/form-submission):
``{"triggerType": "form_submission", "payload": {"name", "siteId", "data": {<field name>:
value}, "schema": [{fieldName, fieldType, fieldElementId}], "submittedAt", "id", "formId",
"formElementId"}}``; and the v1 event (https://developers.webflow.com/data/v1.0.0/reference/
form_submission): ``{"name", "site", "data", "d", "_id"}``. "Working with webhooks",
validating request signatures (https://developers.webflow.com/data/docs/working-with-webhooks):
``x-webflow-signature`` is the hex HMAC-SHA256 of ``<x-webflow-timestamp>:<raw body>`` keyed by
the OAuth app's client secret (or the webhook's own secret), the timestamp in milliseconds;
a request older than 5 minutes is to be refused as a possible replay.

The form's field names are its labels ("First Name", "Phone Number", "What's your company?"),
read by the aliases and the question keywords; the rest are kept under their names. The
submission id is the idempotency key.
"""

from __future__ import annotations

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
from leads.sources.labels import TEXT_TARGETS, question_target

SIGNATURE_HEADER = "x-webflow-signature"
TIMESTAMP_HEADER = "x-webflow-timestamp"
TOLERANCE_MS = 5 * 60 * 1000

# Webflow's input types that say what the field holds whatever its label.
_FIELD_TYPE_TARGETS = {"formemail": "email", "formphone": "phone", "formtel": "phone"}


def _keep(out: Record, key: str, value: Any) -> None:
    put(out, key, value, twin=False)


def decode(record: Record, options: Options) -> Record:
    payload = get(record, "payload")
    v2 = isinstance(payload, dict)
    submission: dict[str, Any] = payload if isinstance(payload, dict) else record
    data = get(submission, "data")
    data = data if isinstance(data, dict) else {}
    types: dict[str, str] = {}
    schema = get(submission, "schema")
    for item in schema if isinstance(schema, list) else ():
        name = get(item, "fieldName")
        if isinstance(name, str):
            types[name] = "".join(
                ch for ch in as_text(get(item, "fieldType")).lower() if ch.isalpha()
            )

    out: Record = {}
    custom: list[tuple[str, Any]] = []
    for key, value in data.items():
        if not isinstance(key, str):
            continue
        value = scalar_or_joined(value)
        if value is None or isinstance(value, dict | list) or as_text(value).strip() == "":
            continue
        target = _FIELD_TYPE_TARGETS.get(types.get(key, "")) or question_target(key, TEXT_TARGETS)
        if target is not None and target not in out:
            out[target] = value
        else:
            custom.append((key, value))
    for key, value in custom:
        _keep(out, key if key not in out else f"{key} (form)", value)

    _keep(out, "external_id", get(submission, "id") if v2 else get(submission, "_id"))
    _keep(out, "webflow_form_name", get(submission, "name"))
    _keep(out, "webflow_site_id", get(submission, "siteId") if v2 else get(submission, "site"))
    _keep(out, "webflow_form_id", get(submission, "formId"))
    _keep(out, "webflow_page_id", get(submission, "pageId"))
    _keep(out, "submitted_at", get(submission, "submittedAt") if v2 else get(submission, "d"))
    return out


def verify(inbound: Inbound, secret: str, now: datetime) -> bool:
    """``x-webflow-signature: <hex HMAC-SHA256 of "<timestamp>:<body>">``, with the
    ``x-webflow-timestamp`` (ms) no more than 5 minutes from ``now``."""
    sent = inbound.header(SIGNATURE_HEADER).strip().lower()
    stamp = inbound.header(TIMESTAMP_HEADER).strip()
    if not secret or not sent or not (stamp.isascii() and stamp.isdigit()) or len(stamp) > 16:
        return False
    if abs(now.timestamp() * 1000 - int(stamp)) > TOLERANCE_MS:
        return False
    message = stamp.encode("ascii") + b":" + inbound.body
    expected = hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()
    return hmac.compare_digest(sent, expected)


KIND = SourceKind(
    name="webflow",
    label="Webflow (form_submission webhook)",
    docs="https://developers.webflow.com/data/reference/webhooks/events/form-submission",
    decode=decode,
    verify=verify,
    signature_header=SIGNATURE_HEADER,
)
