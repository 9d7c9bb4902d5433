"""Segment: Identify (and Track) calls forwarded by a Webhooks destination or a Source function.

Shapes from Segment's docs: the Spec's Identify call and its reserved traits (``address``,
``company``, ``firstName`` / ``first_name``, ...) at https://segment.com/docs/connections/spec/
identify/, the common fields (``messageId``, ``context.campaign``, ``context.traits``) at
https://segment.com/docs/connections/spec/common/, and the Webhooks destinations
(https://segment.com/docs/connections/destinations/catalog/webhooks/ and .../actions-webhook/):
with a shared secret, ``X-Signature`` is the hex HMAC-SHA1 of the body keyed by that secret.

``messageId`` is the idempotency key: Segment retries a failed delivery with the same message,
and every call (one per identify) has its own. Reserved traits may be camelCase or snake_case.
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
)

SIGNATURE_HEADER = "X-Signature"
_CALL_TYPES = frozenset({"identify", "track", "page", "screen", "group", "alias"})

# Reserved traits with a canonical meaning, in both spellings the Spec allows.
_TRAITS = {
    "email": "email",
    "firstName": "first_name",
    "first_name": "first_name",
    "lastName": "last_name",
    "last_name": "last_name",
    "name": "full_name",
    "phone": "phone",
    "title": "title",
    "website": "website",
}
_ADDRESS = {
    "street": "street",
    "city": "city",
    "state": "region",
    "postalCode": "postal_code",
    "postal_code": "postal_code",
    "country": "country",
}
_COMPANY = {
    "name": "company",
    "industry": "industry",
    "employee_count": "employees",
    "employeeCount": "employees",
    "employees": "employees",
    "id": "company_id",
    "plan": "company_plan",
    "website": "website",
}
# Top-level keys of the message kept for the record, renamed where an alias would misread them.
_MESSAGE_KEYS = {
    "userId": "segment_user_id",
    "anonymousId": "segment_anonymous_id",
    "event": "event",
    "type": "segment_call",
    "timestamp": "timestamp",
    "groupId": "segment_group_id",
    "channel": "channel",
}


def _traits(traits: Any, out: Record, *, group: bool = False) -> None:
    """Reserved traits by meaning, the rest under their own names. A Group call's traits
    describe the company, so its ``name`` is the company's."""
    if not isinstance(traits, dict):
        return
    for key, value in traits.items():
        if not isinstance(key, str):
            continue
        value = get(traits, key)
        if group and key in ("name", "industry", "employees", "plan", "website"):
            put(out, {"name": "company", "plan": "company_plan"}.get(key, key), value)
        elif key == "address" and isinstance(value, dict):
            for part, part_value in value.items():
                if isinstance(part, str):
                    put(out, _ADDRESS.get(part, f"address_{part}"), part_value)
        elif key == "company" and isinstance(value, dict):
            for part, part_value in value.items():
                if isinstance(part, str):
                    put(out, _COMPANY.get(part, f"company_{part}"), part_value)
        elif key == "company":
            put(out, "company", value)
        elif key == "id":
            put(out, "segment_user_id", value)  # the customer's own user id (Spec: "id")
        else:
            put(out, _TRAITS.get(key, key), value)


def _message(record: Record) -> Record:
    """The Segment message: the record itself, or one wrapped by a Webhooks (Actions) mapping
    or a Source function (``{"data": {...}}``, ``{"event": {...}}``, ``{"payload": {...}}``)."""
    if as_text(record.get("type")) in _CALL_TYPES:
        return record
    for key in ("data", "event", "payload", "message"):
        inner = get(record, key)
        if isinstance(inner, dict) and as_text(inner.get("type")) in _CALL_TYPES:
            return inner
    return record


def decode(record: Record, options: Options) -> Record:
    out: Record = {}
    message = _message(record)
    call = as_text(message.get("type"))
    # Who the person is: identify/group traits first, then a track's properties, then the
    # traits the library attached to the context (analytics.js sends them on every call).
    _traits(get(message, "traits"), out, group=call == "group")
    properties = get(message, "properties")
    if isinstance(properties, dict):
        _traits(properties, out)
    _traits(get(message, "context", "traits"), out)

    campaign = get(message, "context", "campaign")
    if isinstance(campaign, dict):
        put(out, "utm_source", get(campaign, "source"))
        put(out, "utm_medium", get(campaign, "medium"))
        put(out, "utm_campaign", get(campaign, "name"))
        put(out, "utm_term", get(campaign, "term"))
        put(out, "utm_content", get(campaign, "content"))
    # The device's location: only where the traits named none.
    location = get(message, "context", "location")
    if isinstance(location, dict):
        put(out, "country", get(location, "country"))
        put(out, "region", get(location, "region"))
        put(out, "city", get(location, "city"))
    put(out, "ip", get(message, "context", "ip"))
    put(out, "page_url", get(message, "context", "page", "url"))
    put(out, "user_agent", get(message, "context", "userAgent"))

    put(out, "external_id", get(message, "messageId"))
    for key, target in _MESSAGE_KEYS.items():
        put(out, target, get(message, key))
    if message is not record:
        for key, value in record.items():
            if isinstance(key, str) and not isinstance(get(record, key), dict | list):
                put(out, key, value)
    return out


def split(record: Record, options: Options) -> list[Record]:
    """The calls of a batch (``{"batch": [...]}``, the HTTP Tracking API's ``/v1/batch`` body,
    as Segment-compatible libraries send it), each a lead of its own with the batch's
    ``context`` where the call has none; any other body is one call."""
    batch = record.get("batch")
    if not isinstance(batch, list):
        return [record]
    context = record.get("context")
    calls: list[Record] = []
    for call in batch:
        if not isinstance(call, dict):
            continue
        if isinstance(context, dict) and "context" not in call:
            call = {**call, "context": context}
        calls.append(call)
    return calls or [record]


def verify(inbound: Inbound, secret: str, now: datetime) -> bool:
    """``X-Signature: <hex HMAC-SHA1 of the body, keyed by the destination's shared secret>``."""
    sent = inbound.header(SIGNATURE_HEADER).strip().lower()
    if not secret or not sent:
        return False
    expected = hmac.new(secret.encode("utf-8"), inbound.body, hashlib.sha1).hexdigest()
    return hmac.compare_digest(sent, expected)


KIND = SourceKind(
    name="segment",
    label="Segment (Identify / Track calls from a Webhooks destination)",
    docs="https://segment.com/docs/connections/destinations/catalog/actions-webhook/",
    decode=decode,
    verify=verify,
    signature_header=SIGNATURE_HEADER,
    split=split,
)
