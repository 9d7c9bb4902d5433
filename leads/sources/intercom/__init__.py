"""Intercom: webhook notifications (``notification_event``) about contacts and conversations.

Shapes from Intercom's developer docs: the notification envelope and topics on "Webhook models"
(https://developers.intercom.com/docs/references/webhooks/webhook-models), the Contact object
(https://developers.intercom.com/docs/references/rest-api/api.intercom.io/contacts) and the
Conversation object (``source.author``, ``contacts``), and "Signed notifications": the
``X-Hub-Signature`` header is ``sha1=`` and the hex HMAC-SHA1 of the body keyed by the app's
client secret. Older (1.x) conversation notifications carry the person under ``item.user``.

The lead is the contact (``contact.*`` topics) or the person who wrote a conversation
(``conversation.*``). The notification id is the idempotency key: Intercom re-sends the same
notification when a delivery fails, while one contact appears in many notifications
(``contact.lead.created``, then ``contact.user.created`` when the lead converts), and a second
notification about the same contact under one key would be refused as a reused key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Any

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

SIGNATURE_HEADER = "X-Hub-Signature"

# Contact keys that are not about the lead, or whose names the aliases would misread
# ("role" is Intercom's lead/user switch, not a job title; "external_id" is the customer's own
# user id, not the vendor's record id).
_CONTACT_RENAMED = {
    "id": "intercom_contact_id",
    "type": "intercom_type",
    "role": "intercom_role",
    "external_id": "intercom_user_id",
    "user_id": "intercom_user_id",
    "workspace_id": "intercom_workspace_id",
    "app_id": "intercom_app_id",
    "owner_id": "intercom_owner_id",
}
# Keys decoded on purpose below; everything else scalar is kept under its own name.
_CONTACT_HANDLED = frozenset(
    {
        "email",
        "name",
        "phone",
        "location",
        "location_data",
        "custom_attributes",
        "companies",
        "tags",
    }
)
_PERSON_TYPES = frozenset({"user", "lead", "contact"})


def _companies(value: Any) -> list[dict[str, Any]]:
    """The company objects of a contact: ``{"data": [...]}`` (2.x), ``{"companies": [...]}``
    (1.x) or a plain list."""
    items = value
    if isinstance(value, dict):
        items = value.get("data") if isinstance(value.get("data"), list) else value.get("companies")
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _contact(contact: Any, out: Record) -> None:
    """A Contact object's fields, flat."""
    if not isinstance(contact, dict):
        return
    put(out, "email", get(contact, "email"))
    put(out, "full_name", get(contact, "name"))
    put(out, "phone", get(contact, "phone"))
    location = get(contact, "location")
    if isinstance(location, dict):
        put(out, "country", get(location, "country") or get(location, "country_code"))
        put(out, "region", get(location, "region"))
        put(out, "city", get(location, "city"))
        put(out, "continent_code", get(location, "continent_code"))
    legacy = get(contact, "location_data")  # the 1.x API's name for it
    if isinstance(legacy, dict):
        put(out, "country", get(legacy, "country_name") or get(legacy, "country_code"))
        put(out, "region", get(legacy, "region_name"))
        put(out, "city", get(legacy, "city_name"))
        put(out, "postal_code", get(legacy, "postal_code"))
    for company in _companies(get(contact, "companies")):
        put(out, "company", get(company, "name"))
        put(out, "website", get(company, "website"))
        put(out, "industry", get(company, "industry"))
        put(out, "employees", get(company, "size"))
        put(out, "intercom_company_id", get(company, "company_id") or get(company, "id"))
        break
    tags = get(contact, "tags")
    tag_items = get(tags, "data") if isinstance(tags, dict) else None
    tag_items = tag_items if isinstance(tag_items, list) else get(tags, "tags")
    if isinstance(tag_items, list):
        names = [as_text(get(tag, "name")) for tag in tag_items if isinstance(tag, dict)]
        put(out, "tags", "; ".join(name for name in names if name.strip()))
    attributes = get(contact, "custom_attributes")
    if isinstance(attributes, dict):
        # Custom attributes are the workspace's own questions ("job_title", "company_size"):
        # kept under their names, so the aliases read the ones that mean a canonical field.
        for key, value in attributes.items():
            if isinstance(key, str):
                put(out, key, value)
    for key, value in contact.items():
        if not isinstance(key, str) or key in _CONTACT_HANDLED:
            continue
        put(out, _CONTACT_RENAMED.get(key, key), value)


def _conversation(item: dict[str, Any], out: Record) -> None:
    """The person who wrote a conversation: ``source.author`` (2.x), ``user`` (1.x) or
    ``conversation_message.author``; then the first contact's id."""
    for path in (("source", "author"), ("user",), ("conversation_message", "author")):
        author = get(item, *path)
        if isinstance(author, dict) and as_text(get(author, "type")) in _PERSON_TYPES:
            put(out, "email", get(author, "email"))
            put(out, "full_name", get(author, "name"))
            put(out, "intercom_contact_id", get(author, "id"))
            put(out, "intercom_user_id", get(author, "user_id"))
            put(out, "intercom_role", get(author, "type"))
            break  # the first person found wrote it; the later paths repeat them, thinner
    contacts = get(item, "contacts")
    if isinstance(contacts, dict):
        contacts = get(contacts, "contacts")
    if isinstance(contacts, list):
        first = next((c for c in contacts if isinstance(c, dict)), None)
        if first is not None:
            put(out, "intercom_contact_id", get(first, "id"))
            put(out, "intercom_user_id", get(first, "external_id"))
    put(out, "intercom_conversation_id", get(item, "id"))
    message = get(item, "source") if isinstance(get(item, "source"), dict) else None
    message = message or get(item, "conversation_message")
    if isinstance(message, dict):
        put(out, "subject", get(message, "subject"))
        put(out, "message", get(message, "body"))
        put(out, "page_url", get(message, "url"))
    put(out, "conversation_title", get(item, "title"))


def decode(record: Record, options: Options) -> Record:
    out: Record = {}
    topic = as_text(get(record, "topic"))
    item = get(record, "data", "item")
    if not isinstance(item, dict):
        # Not an envelope: a bare Contact object (an export, or a test post of one).
        item = record if get(record, "type") == "contact" else None
    if isinstance(item, dict):
        item_type = as_text(get(item, "type"))
        if item_type == "conversation" or topic.startswith("conversation"):
            _conversation(item, out)
        elif item_type in ("contact", "user", "lead", "contact_tag", "user_tag"):
            # A tag notification wraps the contact in ``contact`` / ``user``.
            person = get(item, "contact") or get(item, "user")
            _contact(person if isinstance(person, dict) else item, out)
        else:
            for key in ("contact", "user", "lead"):
                _contact(get(item, key), out)
    # The notification's id is the same on Intercom's re-sends of it (see the module docstring).
    notification_id = get(record, "id") if get(record, "type") == "notification_event" else None
    item_id = get(item, "id") if isinstance(item, dict) else None
    put(out, "external_id", notification_id or item_id)
    put(out, "intercom_topic", topic)
    put(out, "intercom_app_id", get(record, "app_id"))
    put(out, "intercom_notification_created_at", get(record, "created_at"))
    return out


def verify(inbound: Inbound, secret: str, now: datetime) -> bool:
    """``X-Hub-Signature: sha1=<hex HMAC-SHA1 of the body, keyed by the client secret>``."""
    sent = inbound.header(SIGNATURE_HEADER).strip()
    if not secret or not sent.lower().startswith("sha1="):
        return False
    expected = hmac.new(secret.encode("utf-8"), inbound.body, hashlib.sha1).hexdigest()
    return hmac.compare_digest(sent[5:].strip().lower(), expected)


def handshake(inbound: Inbound, secret: str, options: Options) -> Reply | None:
    """Intercom checks a new webhook URL with a HEAD request and then posts a ``ping``
    notification; both want a plain 200, and neither is a lead."""
    if inbound.method.upper() == "HEAD":
        return Reply(200, b"")
    if inbound.method.upper() != "POST" or b'"ping"' not in inbound.body:
        return None
    try:
        body = json.loads(inbound.body)
    except (ValueError, RecursionError):
        return None
    if isinstance(body, dict) and body.get("topic") == "ping":
        return Reply(200, b"")
    return None


KIND = SourceKind(
    name="intercom",
    label="Intercom (webhook notifications: contacts and conversations)",
    docs="https://developers.intercom.com/docs/references/webhooks/webhook-models",
    decode=decode,
    verify=verify,
    signature_header=SIGNATURE_HEADER,
    handshake=handshake,
)
