"""Meta Lead Ads (Facebook and Instagram instant forms): a lead, or the webhook that announces one.

Shapes from Meta's developer docs:

- A lead as the Graph API returns it ("Retrieving Leads",
  https://developers.facebook.com/docs/marketing-api/guides/lead-ads/retrieving, and the Lead
  reference https://developers.facebook.com/docs/marketing-api/reference/user-lead-gen-info/):
  ``id``, ``created_time``, ``ad_id`` / ``form_id`` / ``campaign_name``..., and the answers as
  ``field_data: [{"name": ..., "values": [...]}]``, named by Meta's standard question keys
  (``email``, ``full_name``, ``phone_number``, ``company_name``, ``job_title``, ``zip_code``...)
  or by the advertiser's own question keys. Export tools (Zapier and the like) post the same.
- The Graph webhook notification for the Page ``leadgen`` field ("Webhooks for Leadgen",
  https://developers.facebook.com/docs/graph-api/webhooks/getting-started/webhooks-for-leadgen):
  ``{"object": "page", "entry": [{"id", "time", "changes": [{"field": "leadgen", "value":
  {"leadgen_id", "page_id", "form_id", "adgroup_id", "ad_id", "created_time"}}]}]}``. It carries
  ids only. With the source's ``page_access_token`` option set, each change is accepted as a
  lead of its own (``split``) waiting for the worker to fetch it from the Graph API
  (``graph.py``, ``routing/fetch/``); without it the notification is refused into the inbox
  with a reason that says to set the token (``awaits_fetch``).
- "Getting Started" with Graph webhooks
  (https://developers.facebook.com/docs/graph-api/webhooks/getting-started): the GET
  verification request (``hub.mode=subscribe``, ``hub.verify_token``, ``hub.challenge``) and the
  ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body keyed by the app secret>`` header.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import datetime
from typing import Any

from leads.normalize import FULL_NAME
from leads.sources.base import (
    Inbound,
    Options,
    Record,
    Reply,
    SourceKind,
    as_text,
    get,
    put,
)

SIGNATURE_HEADER = "X-Hub-Signature-256"

# Meta's standard question keys → canonical fields. Ordered: the first key of a field that a
# lead answers fills it (the work e-mail and phone before the personal ones, as a B2B router
# wants); a later one is kept under its own name, which normalisation can still fall back on.
_STANDARD: tuple[tuple[str, str], ...] = (
    ("work_email", "email"),
    ("email", "email"),
    ("full_name", FULL_NAME),
    ("first_name", "first_name"),
    ("last_name", "last_name"),
    ("work_phone_number", "phone"),
    ("phone_number", "phone"),
    ("phone", "phone"),
    ("company_name", "company"),
    ("company", "company"),
    ("job_title", "title"),
    ("country", "country"),
    ("state", "region"),
    ("province", "region"),
    ("city", "city"),
    ("zip_code", "postal_code"),
    ("post_code", "postal_code"),
    ("zip", "postal_code"),
    ("postal_code", "postal_code"),
    ("website", "website"),
    ("company_website", "website"),
)
_STANDARD_TARGET = dict(_STANDARD)
# A standard answer that lost to a preferred one, kept under a name that is no canonical field.
_RENAMED_WHEN_SECOND = {"email": "personal_email"}
# "phone_number_(eg.65xxxxxxxx)": a standard key with the advertiser's hint appended.
_HINT_RE = re.compile(r"_?\(.*\)$")
_STANDARD_RANK = {name: rank for rank, (name, _target) in enumerate(_STANDARD)}

# Top-level keys of a lead decoded on purpose; every other scalar is kept under its own name.
_LEAD_HANDLED = frozenset({"id", "field_data", "custom_disclaimer_responses"})

MAX_CHALLENGE_CHARS = 256

# Kind options for fetching a lead a leadgen notification names (the Graph API's "Retrieving
# Leads"). The token is a secret option: never exported, audited redacted, never shown again.
PAGE_TOKEN_OPTION = "page_access_token"  # noqa: S105 - the option's name, not a token
VERSION_OPTION = "graph_api_version"
BASE_URL_OPTION = "graph_base_url"
DEFAULT_GRAPH_VERSION = "v21.0"
DEFAULT_GRAPH_BASE_URL = "https://graph.facebook.com"


def _scalar(value: Any) -> Any:
    """An answer as one scalar: ``values`` lists joined as "a; b", blanks dropped, containers
    (other than lists of scalars) as None."""
    if isinstance(value, list):
        parts = [as_text(item).strip() for item in value if not isinstance(item, dict | list)]
        parts = [part for part in parts if part]
        return "; ".join(parts) if parts else None
    if isinstance(value, dict):
        return None
    return value


def _blank(value: Any) -> bool:
    return value is None or as_text(value).strip() == ""


def _put(out: Record, key: str, value: Any) -> None:
    """``out[key] = value`` for a non-blank scalar; a taken key gets a numbered twin, so that no
    answer is lost and no custom key shadows a canonical field."""
    put(out, key, _scalar(value))


def _field_data(items: Any, out: Record) -> None:
    """``field_data`` answers, flat: standard questions as canonical fields (in Meta's order of
    preference, see ``_STANDARD``), the rest under the advertiser's question key."""
    if not isinstance(items, list):
        return

    def standard(name: str) -> str:
        return _HINT_RE.sub("", name.lower())

    pairs: list[tuple[str, Any]] = []
    for item in items:
        name = get(item, "name")
        if not isinstance(name, str) or not name.strip():
            continue
        values = get(item, "values")
        pairs.append((name.strip(), values if values is not None else get(item, "value")))
    # Standard questions first, by preference; the advertiser's questions after, as sent.
    ordered = sorted(
        enumerate(pairs),
        key=lambda p: (_STANDARD_RANK.get(standard(p[1][0]), len(_STANDARD)), p[0]),
    )
    for _index, (name, values) in ordered:
        target = _STANDARD_TARGET.get(standard(name))
        value = _scalar(values)
        if _blank(value):
            continue
        if target is not None and _blank(out.get(target)):
            out[target] = value
        else:
            # The key as Meta names it ("email" when "work_email" came first is renamed, so
            # that it does not shadow the field).
            _put(out, _RENAMED_WHEN_SECOND.get(name, name) if target else name, value)


def _lead(record: Record, out: Record) -> None:
    """A lead object (Graph API / export): its answers, its id, and its ad and form ids."""
    _field_data(get(record, "field_data"), out)
    _put(out, "external_id", get(record, "id"))
    disclaimers = get(record, "custom_disclaimer_responses")
    if isinstance(disclaimers, list):
        for item in disclaimers:
            key = get(item, "checkbox_key")
            if isinstance(key, str | int) and not isinstance(key, bool):
                _put(out, f"disclaimer {key}", as_text(get(item, "is_checked")))
    for key, value in record.items():
        if not isinstance(key, str) or key in _LEAD_HANDLED:
            continue
        # A flat export (no field_data) carries the answers at the top level under Meta's
        # standard names: read them as field_data would be.
        target = _STANDARD_TARGET.get(key.lower())
        if target is not None and _blank(out.get(target)) and not _blank(_scalar(value)):
            out[target] = _scalar(value)
            continue
        _put(out, key, value)


def _changes(record: Record) -> list[dict[str, Any]]:
    """The ``leadgen`` change values of a notification (``entry[].changes[]``), or of a bare
    change object (``{"field": "leadgen", "value": {...}}``, as the App Dashboard's test sends)."""
    found: list[dict[str, Any]] = []
    changes: list[Any] = []
    entries = get(record, "entry")
    if isinstance(entries, list):
        for entry in entries:
            items = get(entry, "changes")
            if isinstance(items, list):
                changes.extend(items)
    elif get(record, "field") == "leadgen":
        changes.append(record)
    for change in changes:
        value = get(change, "value")
        if get(change, "field") == "leadgen" and isinstance(value, dict):
            found.append(value)
    return found


def leadgen_change(record: Any) -> dict[str, Any] | None:
    """The ``leadgen`` change value of a notification that names one lead (as ``split`` leaves
    it), or None when ``record`` is no leadgen notification or has no usable ``leadgen_id``."""
    if not isinstance(record, dict):
        return None
    values = _changes(record)
    if len(values) != 1:
        return None
    leadgen_id = as_text(values[0].get("leadgen_id")).strip()
    if not leadgen_id or len(leadgen_id) > 64 or not leadgen_id.isdigit():
        return None
    return values[0]


def page_token(options: Options) -> str:
    """The source's Page access token option ("" when unset)."""
    token = options.get(PAGE_TOKEN_OPTION) if isinstance(options, dict) else None
    return token.strip() if isinstance(token, str) else ""


def split(record: Record, options: Options) -> list[Record]:
    """A notification batching several leadgen changes, as one notification per change (each
    one lead, its ``leadgen_id`` its external id) — when the page token is set, so that each
    can be fetched. Without it the body stays whole: refused as one, re-accepted as many."""
    if not page_token(options) or isinstance(record.get("field"), str):
        return [record]
    entries = record.get("entry")
    if not isinstance(entries, list):
        return [record]
    parts: list[Record] = []
    for entry in entries:
        changes = get(entry, "changes")
        if not isinstance(entry, dict) or not isinstance(changes, list):
            continue
        for change in changes:
            if get(change, "field") == "leadgen" and isinstance(get(change, "value"), dict):
                parts.append({**record, "entry": [{**entry, "changes": [change]}]})
    return parts if len(parts) > 1 else [record]


NO_TOKEN_MESSAGE = (
    " This is a Meta leadgen notification: it carries only the lead's id (leadgen_id). Set "  # noqa: S105
    "the source's page_access_token kind option (a Page or System User access token with "
    "leads_retrieval; docs/revops.md) so the worker can fetch the lead from the Graph API, "
    "then re-accept this payload from the refused inbox."
)


def awaits_fetch(record: Record, options: Options) -> str | None:
    """ "" for a leadgen notification the worker can fetch (the page token is set), the reason
    to refuse one it cannot, None for anything else."""
    if not _changes(record):
        return None
    if not page_token(options):
        return NO_TOKEN_MESSAGE
    if leadgen_change(record) is None:  # split leaves one change per record
        return " The leadgen notification names no usable leadgen_id."
    return ""


def _notification(record: Record, values: list[dict[str, Any]], out: Record) -> None:
    first = values[0]
    # The leadgen id is the lead's own id: the lead fetched later carries it as ``id``.
    _put(out, "external_id", get(first, "leadgen_id"))
    for key, value in first.items():
        if isinstance(key, str):
            _put(out, key, value)
    entries = get(record, "entry")
    _put(out, "meta_object", get(record, "object"))
    _put(out, "entry_id", get(entries, 0, "id"))
    _put(out, "entry_time", get(entries, 0, "time"))
    if len(values) > 1:
        # Meta batches changes; one JSON body is one record here, so the rest are named.
        ids = [as_text(get(value, "leadgen_id")) for value in values]
        _put(out, "leadgen_ids", "; ".join(i for i in ids if i))


def decode(record: Record, options: Options) -> Record:
    out: Record = {}
    values = _changes(record)
    if values:
        _notification(record, values, out)
        return out
    lead = record
    # A Graph "list leads" page ({"data": [lead, ...]}) read as its first lead.
    data = get(record, "data")
    if get(record, "field_data") is None and isinstance(data, list):
        lead = next((item for item in data if isinstance(item, dict)), record)
    _lead(lead, out)
    return out


def verify(inbound: Inbound, secret: str, now: datetime) -> bool:
    """``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body keyed by the app secret>``."""
    sent = inbound.header(SIGNATURE_HEADER).strip()
    if not secret or not sent.lower().startswith("sha256="):
        return False
    expected = hmac.new(secret.encode("utf-8"), inbound.body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(sent[7:].strip().lower().encode(), expected.encode())


def _query(inbound: Inbound, name: str) -> str:
    # PHP-style frameworks turn "hub.mode" into "hub_mode"; Meta's docs mention both.
    return inbound.query.get(name) or inbound.query.get(name.replace(".", "_")) or ""


def handshake(inbound: Inbound, secret: str, options: Options) -> Reply | None:
    """Meta's GET verification: echo ``hub.challenge`` when ``hub.verify_token`` is the source's
    ``verify_token`` option; 403 otherwise. Any other request is no handshake."""
    if inbound.method.upper() != "GET" or _query(inbound, "hub.mode") != "subscribe":
        return None
    expected = options.get("verify_token") if isinstance(options, dict) else None
    sent = _query(inbound, "hub.verify_token")
    if not isinstance(expected, str) or not expected or not sent:
        return Reply(403, b"The verify token does not match.")
    if not hmac.compare_digest(sent.encode("utf-8"), expected.encode("utf-8")):
        return Reply(403, b"The verify token does not match.")
    challenge = _query(inbound, "hub.challenge")
    # Meta sends an integer; anything else is echoed only when short and printable.
    if not challenge or len(challenge) > MAX_CHALLENGE_CHARS or not challenge.isprintable():
        return Reply(400, b"No usable hub.challenge.")
    return Reply(200, challenge.encode("utf-8"))


KIND = SourceKind(
    name="meta_lead_ads",
    label="Meta Lead Ads (Facebook / Instagram instant forms)",
    docs="https://developers.facebook.com/docs/marketing-api/guides/lead-ads/retrieving",
    decode=decode,
    verify=verify,
    signature_header=SIGNATURE_HEADER,
    handshake=handshake,
    secret_options=("verify_token", PAGE_TOKEN_OPTION),
    options={
        "verify_token": "The Verify Token typed into the Meta app's Webhooks settings; "
        "Meta's GET verification must present it.",
        PAGE_TOKEN_OPTION: "A long-lived Page (or System User) access token with "
        "leads_retrieval: the worker fetches each lead a leadgen notification names with it.",
        VERSION_OPTION: f"The Graph API version to call (default {DEFAULT_GRAPH_VERSION}).",
        BASE_URL_OPTION: f"The Graph API's address (default {DEFAULT_GRAPH_BASE_URL}).",
    },
    split=split,
    awaits_fetch=awaits_fetch,
)
