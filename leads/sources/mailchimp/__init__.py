"""Mailchimp: audience (list) webhooks, posted as ``application/x-www-form-urlencoded``.

Shape from Mailchimp's "Synchronize Audience Data with Webhooks" guide
(https://mailchimp.com/developer/marketing/guides/sync-audience-data-webhooks/) and its
per-event samples (formerly https://apidocs.mailchimp.com/webhooks/): ``type`` (subscribe,
unsubscribe, profile, upemail, cleaned, campaign), ``fired_at`` ("YYYY-MM-DD HH:MM:SS") and
``data[...]`` keys written with PHP brackets — ``data[merges][FNAME]``,
``data[merges][ADDRESS][country]`` — which a form parser keeps as literal key names. Mailchimp
sends no signature; the webhook URL carries our token. Saving the URL in Mailchimp sends a GET
(User-Agent "MailChimp.com WebHook Validator") that must answer 200.

The idempotency key is the member id with the event type and time: Mailchimp retries a failed
POST unchanged, while the same member (``data[id]``, a hash of the address) also comes back in
later profile, e-mail and unsubscribe events, each a body of its own that must not be refused
as a reused key.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from leads.sources.base import (
    Inbound,
    Options,
    Record,
    Reply,
    SourceKind,
    as_text,
    put,
    scalar_or_joined,
)

_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_MAX_DEPTH = 8

# Mailchimp's default audience merge tags (EMAIL, FNAME, LNAME, ADDRESS, PHONE, BIRTHDAY).
_MERGES = {
    "EMAIL": "email",
    "FNAME": "first_name",
    "LNAME": "last_name",
    "PHONE": "phone",
}
_ADDRESS = {
    "addr1": "street",
    "addr2": "street_2",
    "city": "city",
    "state": "region",
    "zip": "postal_code",
    "country": "country",
}
# data[...] keys that are about the event, not the person, renamed for the record.
_DATA_KEYS = {
    "id": "mailchimp_member_id",
    "new_id": "mailchimp_member_id",
    "list_id": "mailchimp_list_id",
    "web_id": "mailchimp_web_id",
    "email_type": "email_type",
    "ip_opt": "ip_opt",
    "ip_signup": "ip_signup",
    "action": "unsubscribe_action",
    "reason": "reason",
    "campaign_id": "mailchimp_campaign_id",
    "old_email": "old_email",
}


def _split(key: str) -> tuple[str, ...]:
    """``data[merges][FNAME]`` → ("data", "merges", "FNAME")."""
    head, bracket, _rest = key.partition("[")
    if not bracket:
        return (key,)
    return (head, *_BRACKETS.findall(key[len(head) :]))


def _leaves(
    record: Any, prefix: tuple[str, ...] = (), depth: int = 0
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path..., value) for every scalar, whether the body came as bracketed form keys or as
    nested JSON objects (a relay that re-encodes the form)."""
    if depth > _MAX_DEPTH or not isinstance(record, dict):
        return
    for key, value in record.items():
        if not isinstance(key, str):
            continue
        path = (*prefix, *_split(key))
        if isinstance(value, dict):
            yield from _leaves(value, path, depth + 1)
        else:
            yield path, scalar_or_joined(value)


def _interests(value: Any) -> Any:
    """ "Group1,Group2" (Mailchimp's separator) → "Group1; Group2"."""
    text = as_text(value)
    parts = [part.strip() for part in text.split(",")]
    return "; ".join(part for part in parts if part) or value


def decode(record: Record, options: Options) -> Record:
    out: Record = {}
    data: dict[tuple[str, ...], Any] = {}
    top: dict[str, Any] = {}
    for leaf, value in _leaves(record):
        if len(leaf) >= 2 and leaf[0] == "data":
            data.setdefault(leaf[1:], value)
        elif len(leaf) == 1:
            top.setdefault(leaf[0], value)
        else:
            top.setdefault("".join(f"[{p}]" if i else p for i, p in enumerate(leaf)), value)
    event = as_text(top.get("type"))

    # The address the event is about: upemail's new one, else the member's.
    put(out, "email", data.get(("new_email",)) or data.get(("email",)))
    groupings: dict[str, dict[str, Any]] = {}
    for path, value in data.items():
        if path[0] != "merges" or len(path) < 2:
            continue
        tag = path[1]
        if tag == "ADDRESS" and len(path) == 3:
            put(out, _ADDRESS.get(path[2], f"address_{path[2]}"), value)
        elif tag == "ADDRESS":
            put(out, "address", value)  # a text-typed address merge field
        elif tag == "INTERESTS":
            put(out, "interests", _interests(value))
        elif tag == "GROUPINGS" and len(path) == 4:
            groupings.setdefault(path[2], {})[path[3]] = value
        elif len(path) == 2:
            target = _MERGES.get(tag)
            if target == "email" and "email" in out:
                if as_text(value).strip().lower() != as_text(out["email"]).strip().lower():
                    put(out, "merge_email", value)
                continue
            # Other tags keep their names: the aliases read "COMPANY" or "WEBSITE", and a
            # numbered tag of an imported audience ("MMERGE6") is kept as sent.
            put(out, target or tag, value)
    for grouping in groupings.values():
        name = as_text(grouping.get("name")) or f"group {as_text(grouping.get('id'))}"
        put(out, f"interests: {name}", _interests(grouping.get("groups")))
    for path, value in data.items():
        if path in (("email",), ("new_email",)) or path[0] == "merges":
            continue
        if len(path) == 1:
            put(out, _DATA_KEYS.get(path[0], path[0]), value)
        else:
            put(out, "data" + "".join(f"[{p}]" for p in path), value)

    # A cleaned event names no member id: its address stands in for one.
    member = data.get(("new_id",)) or data.get(("id",)) or out.get("email")
    if member not in (None, "") and event:
        put(out, "external_id", f"{as_text(member)}:{event}:{as_text(top.get('fired_at'))}")
    put(out, "mailchimp_event", event)
    for key, value in top.items():
        if key != "type":
            put(out, key, value)
    return out


def handshake(inbound: Inbound, secret: str, options: Options) -> Reply | None:
    """Mailchimp's validator GETs the URL when the webhook is saved and wants a 200."""
    if inbound.method.upper() in ("GET", "HEAD"):
        return Reply(200, b"")
    return None


KIND = SourceKind(
    name="mailchimp",
    label="Mailchimp (audience webhooks: subscribe, profile, upemail, cleaned, unsubscribe)",
    docs="https://mailchimp.com/developer/marketing/guides/sync-audience-data-webhooks/",
    decode=decode,
    handshake=handshake,
)
