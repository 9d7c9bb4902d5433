"""Google Ads lead form extensions / lead form assets: the lead form webhook.

Shape from Google's "Implementation" page for the lead form webhook
(https://developers.google.com/google-ads/webhook/docs/implementation): a JSON POST of
``lead_id``, ``api_version``, ``form_id``, ``campaign_id``, ``google_key``, ``is_test``,
``gcl_id``, ``adgroup_id``, ``creative_id`` (and, later, ``asset_group_id``, ``lead_stage``,
``lead_submit_time``) with the answers as ``user_column_data: [{column_name, string_value,
column_id}]``. ``column_id`` names the predefined fields (FULL_NAME, EMAIL, PHONE_NUMBER,
WORK_EMAIL, COMPANY_NAME, JOB_TITLE, POSTAL_CODE...); ``column_name`` is the human-readable text
("might not always be populated"), and the first schema sent ``column_name`` only.

Google authenticates the request with the key the advertiser typed into the form: it comes
back in the body as ``google_key`` (no header). ``lead_id`` is unique across all forms, and
Google's handling recommendation is to de-duplicate on it: it is the idempotency key.
"""

from __future__ import annotations

import hmac
import json
from datetime import datetime
from typing import Any

from leads.normalize import CANONICAL_FIELDS, FULL_NAME, canonical_key
from leads.sources.base import Inbound, Options, Record, SourceKind, as_text, get, put

# Google's column ids → canonical fields, in order of preference: the first that a lead
# answers fills the field (the work contact before the personal one, for B2B routing).
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("WORK_EMAIL", "email"),
    ("EMAIL", "email"),
    ("FULL_NAME", FULL_NAME),
    ("FIRST_NAME", "first_name"),
    ("LAST_NAME", "last_name"),
    ("WORK_PHONE", "phone"),
    ("PHONE_NUMBER", "phone"),
    ("COMPANY_NAME", "company"),
    ("JOB_TITLE", "title"),
    ("COUNTRY", "country"),
    ("REGION", "region"),
    ("CITY", "city"),
    ("POSTAL_CODE", "postal_code"),
    ("ZIP_CODE", "postal_code"),
)
_COLUMN_TARGET = dict(_COLUMNS)
_COLUMN_RANK = {column: rank for rank, (column, _target) in enumerate(_COLUMNS)}
# The first schema's column names (no column_id) that the aliases do not know.
_LEGACY_NAMES = {"user email": "email", "user phone": "phone", "user name": FULL_NAME}
_TARGETS = frozenset((*CANONICAL_FIELDS, FULL_NAME))

# Top-level keys decoded on purpose. ``google_key`` is the shared secret: never a lead field.
_HANDLED = frozenset({"lead_id", "user_column_data", "google_key"})
MAX_BODY_FOR_KEY = 1_000_000


def _blank(value: Any) -> bool:
    return value is None or isinstance(value, dict | list) or as_text(value).strip() == ""


def _put(out: Record, key: str, value: Any) -> None:
    """``out[key] = value`` for a non-blank scalar; a taken key gets a numbered twin."""
    put(out, key, value)


def _label(column_id: str, column_name: str) -> str:
    """The readable key of an answer no field takes: its question text, else its column id."""
    label = column_name or column_id.lower()
    return f"{label} (answer)" if label in _TARGETS else label


def _columns(items: Any, out: Record) -> None:
    if not isinstance(items, list):
        return
    answers: list[tuple[int, str, str, Any]] = []
    for index, item in enumerate(items):
        column_id = get(item, "column_id")
        column_name = get(item, "column_name")
        column_id = column_id.strip().upper() if isinstance(column_id, str) else ""
        column_name = column_name.strip() if isinstance(column_name, str) else ""
        value = get(item, "string_value")
        if (column_id or column_name) and not _blank(value):
            answers.append((index, column_id, column_name, value))
    # Predefined columns first, by preference; qualifying and custom questions after, as sent.
    answers.sort(key=lambda a: (_COLUMN_RANK.get(a[1], len(_COLUMNS)), a[0]))
    for _index, column_id, column_name, value in answers:
        target = _COLUMN_TARGET.get(column_id)
        if target is None:
            # The first schema (the column's name is all there is), or a question of the
            # advertiser's whose text or id the aliases know ("Company size").
            target = (
                _LEGACY_NAMES.get(column_name.lower())
                or canonical_key(column_name)
                or canonical_key(column_id.lower())
            )
        if target is not None and _blank(out.get(target)):
            out[target] = value
        else:
            # STREET_ADDRESS, qualifying questions ("What is your budget?"), custom questions
            # and second answers of a field, under the question's text.
            _put(out, _label(column_id, column_name), value)


def decode(record: Record, options: Options) -> Record:
    out: Record = {}
    _columns(get(record, "user_column_data"), out)
    _put(out, "external_id", get(record, "lead_id"))
    for key, value in record.items():
        if isinstance(key, str) and key not in _HANDLED:
            _put(out, f"google_{key}" if canonical_key(key) else key, value)
    return out


def verify(inbound: Inbound, secret: str, now: datetime) -> bool:
    """The body's ``google_key`` equals the key configured on the lead form (no header)."""
    if not secret or len(inbound.body) > MAX_BODY_FOR_KEY:
        return False
    try:
        body = json.loads(inbound.body)
    except (ValueError, RecursionError):
        return False
    sent = body.get("google_key") if isinstance(body, dict) else None
    if not isinstance(sent, str) or not sent:
        return False
    return hmac.compare_digest(sent.encode("utf-8"), secret.encode("utf-8"))


def redact(record: Record) -> Record:
    """The record without ``google_key``: the source's secret is never stored with a lead."""
    record.pop("google_key", None)
    return record


def redact_body(body: bytes) -> bytes:
    """A refused body without ``google_key`` (a body that is not JSON holds none we can find)."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return body if b"google_key" not in body else b""
    if isinstance(value, dict) and "google_key" in value:
        value.pop("google_key")
        return json.dumps(value, ensure_ascii=False).encode("utf-8")
    return body


KIND = SourceKind(
    name="google_ads",
    label="Google Ads lead forms (webhook)",
    docs="https://developers.google.com/google-ads/webhook/docs/implementation",
    decode=decode,
    verify=verify,
    signature_header="",
    redact=redact,
    redact_body=redact_body,
)
