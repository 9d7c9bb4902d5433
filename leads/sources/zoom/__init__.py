"""Zoom Webinars: the registration and attendee reports (CSV) and the registration webhook.

Shapes from Zoom's documentation:
- reports: support.zoom.com "Generating webinar reports" (Reports → Webinars → Registration
  report / Attendee report → CSV). The attendee report opens with title rows ("Attendee Report",
  "Report Generated:", the webinar's Topic / Webinar ID row) and has "Host Details", "Panelist
  Details" and "Attendee Details" sections; ``leads.parsing.parse_csv`` keeps the people's
  section, so a record here is one row of it, keyed by column name.
- webhook: developers.zoom.us/docs/api/webhooks/ (envelope, ``x-zm-signature``, the
  ``endpoint.url_validation`` challenge) and the Webinars events reference for
  ``webinar.registration_created`` (``payload.object.registrant``, the same registrant object
  as GET /webinars/{webinarId}/registrants).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from datetime import datetime
from typing import Any

from leads.normalize import canonical_key
from leads.sources.base import (
    Inbound,
    Options,
    Record,
    Reply,
    SourceKind,
    fold_key,
    get,
    pairs_to_record,
    scalar_or_joined,
)

SIGNATURE_HEADER = "x-zm-signature"
TIMESTAMP_HEADER = "x-zm-request-timestamp"
# Zoom signs the request time but documents no tolerance; five minutes is the usual window and
# long enough for Zoom's own delivery latency.
TOLERANCE_SECONDS = 300

# Zoom writes "--" in a report cell it has no value for (an attendee who never registered).
_NO_VALUE = frozenset({"", "--"})


# Report column (folded) → canonical field. Columns not listed keep their name (custom).
_COLUMNS = {
    fold_key(column): field
    for column, field in {
        "Email": "email",
        "First Name": "first_name",
        "Last Name": "last_name",
        "Phone": "phone",
        "Organization": "company",
        "Job Title": "title",
        "Country/Region Name": "country",
        "Country/Region": "country",
        "State/Province": "region",
        "City": "city",
        "Zip/Postal Code": "postal_code",
        "Industry": "industry",
        "No of Employees": "employees",
    }.items()
}

# Registrant object (webhook and API) key → canonical field.
_REGISTRANT = {
    "email": "email",
    "first_name": "first_name",
    "last_name": "last_name",
    "phone": "phone",
    "org": "company",
    "job_title": "title",
    "country": "country",
    "state": "region",
    "city": "city",
    "zip": "postal_code",
    "industry": "industry",
    "no_of_employees": "employees",
    "id": "external_id",
}


def _keep(rest: Record, key: str, value: Any) -> None:
    """A value that cannot be the canonical one (an object, a list of objects) stays in custom
    under a key the aliases do not map, so it is neither lost nor read as the field."""
    name = key if canonical_key(key) is None else f"{key} (as sent)"
    rest[name] = value


def _scalar(value: Any) -> Any:
    value = scalar_or_joined(value)
    return None if isinstance(value, dict | list) else value


def _report_row(record: Record) -> Record:
    out: Record = {}
    rest: Record = {}
    for key, value in record.items():
        field = _COLUMNS.get(fold_key(key)) if isinstance(key, str) else None
        if field is None:
            rest[str(key)] = value
            continue
        if _scalar(value) is None and isinstance(value, dict | list) and value:
            _keep(rest, str(key), value)
            continue
        value = _scalar(value)
        if value is None or str(value).strip() in _NO_VALUE:
            continue  # "no answer": nothing to keep
        if field in out:
            _keep(rest, str(key), value)  # a second column for the field: kept, not lost
        else:
            out[field] = value
    # The display name stands in for first/last name only when those are missing (a guest
    # who joined without registering); otherwise it stays a custom field as sent.
    name = rest.get("User Name (Original Name)")
    unnamed = "first_name" not in out and "last_name" not in out
    if unnamed and isinstance(name, str) and name.strip() not in _NO_VALUE:
        out["full_name"] = rest.pop("User Name (Original Name)")
    return {**out, **rest}


def _webhook(record: Record) -> Record:
    obj = get(record, "payload", "object")
    registrant = get(obj, "registrant")
    if not isinstance(registrant, dict):
        registrant = {}
    out: Record = {}
    rest: Record = {}
    for key, value in registrant.items():
        if key == "custom_questions":
            continue
        field = _REGISTRANT.get(key)
        if field is None:
            rest[key] = scalar_or_joined(value)
            continue
        if _scalar(value) is None and isinstance(value, dict | list) and value:
            _keep(rest, str(key), value)
            continue
        value = _scalar(value)
        if value not in (None, ""):
            out[field] = value if field != "external_id" else str(value)
    # Custom questions by their wording, so RevOps sees the question in the lead's custom.
    answers = pairs_to_record(
        get(registrant, "custom_questions") or [], name_keys=("title",), value_keys=("value",)
    )
    webinar: Record = {}
    if isinstance(obj, dict):
        for key in ("id", "uuid", "topic", "start_time", "timezone"):
            if obj.get(key) not in (None, ""):
                webinar[f"webinar_{key}"] = obj[key]
    envelope: Record = {k: record[k] for k in ("event", "event_ts") if k in record}
    account = get(record, "payload", "account_id")
    if account is not None:
        envelope["account_id"] = account
    return {**out, **rest, **answers, **webinar, **envelope}


def decode(record: Record, options: Options) -> Record:
    if isinstance(record.get("payload"), dict) and isinstance(record.get("event"), str):
        return _webhook(record)
    return _report_row(record)


def _sign(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify(inbound: Inbound, secret: str, now: datetime) -> bool:
    """``x-zm-signature: v0=HEX(HMAC-SHA256(secret, "v0:{timestamp}:{body}"))``."""
    signature = inbound.header(SIGNATURE_HEADER)
    timestamp = inbound.header(TIMESTAMP_HEADER).strip()
    if not secret or not signature or not timestamp.isdigit():
        return False
    if abs(now.timestamp() - int(timestamp)) > TOLERANCE_SECONDS:
        return False
    expected = "v0=" + _sign(secret, b"v0:" + timestamp.encode() + b":" + inbound.body)
    return hmac.compare_digest(expected, signature.strip())


_PLAIN_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{8,64}")


def handshake(inbound: Inbound, secret: str, options: Options) -> Reply | None:
    """Zoom's challenge-response check: ``endpoint.url_validation`` with a ``plainToken`` is
    answered with the token and its HMAC-SHA256 (hex) under the webhook's secret token."""
    if inbound.method.upper() != "POST" or b"endpoint.url_validation" not in inbound.body:
        return None
    try:
        body = json.loads(inbound.body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or body.get("event") != "endpoint.url_validation":
        return None
    token = get(body, "payload", "plainToken")
    if not isinstance(token, str) or not _PLAIN_TOKEN_RE.fullmatch(token) or not secret:
        # Without the secret no answer can validate; Zoom then reports a failure. Only a token
        # of Zoom's own shape is signed: the same HMAC key signs deliveries ("v0:<ts>:<body>"),
        # so signing any text a stranger sends would forge deliveries.
        return None
    answer = {"plainToken": token, "encryptedToken": _sign(secret, token.encode())}
    return Reply(200, json.dumps(answer).encode(), "application/json")


KIND = SourceKind(
    name="zoom",
    label="Zoom Webinars (registration / attendee report CSV, registration webhook)",
    docs="leads/sources/zoom/RECIPE.md",
    decode=decode,
    verify=verify,
    signature_header=SIGNATURE_HEADER,
    handshake=handshake,
    batch=True,
)
