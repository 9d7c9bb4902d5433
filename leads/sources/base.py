"""What a source kind is: a decoder from one tool's payload to a flat record, plus its handshakes.

A kind is plain data and functions, with no Django import, so decoders run the same in the
kickoff, the worker, the try-it page and the tests. Each kind lives in a module of its own
(``leads.sources.<kind>``) with the vendor's documented sample payloads beside it as fixtures.

The contract of ``decode``: it takes the record as stored (a JSON object: the parsed body, or
one record of a batch) and the source's kind options, and returns a *flat* record — keys named
as canonical fields or their aliases (``email``, ``first_name``, ``full_name``, ``country``...)
and any other keys the tool sent, each with a JSON value. The usual field mapping and
normalisation (``leads.normalize``) then run on that flat record. A decoder may raise anything
on a payload it does not understand; the caller falls back to the generic decoder and says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

Record = dict[str, Any]
Options = Mapping[str, Any]


class DecodeError(Exception):
    """A payload a kind cannot read; the message says why, for the refused inbox."""


@dataclass(frozen=True)
class Inbound:
    """An HTTP request as a kind's hooks see it: no Django objects, headers lower-cased."""

    method: str
    body: bytes
    content_type: str
    headers: Mapping[str, str]
    query: Mapping[str, str] = field(default_factory=dict)
    url: str = ""

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass(frozen=True)
class Reply:
    """A response a kind gives instead of the API's own: a handshake answer or a vendor ack."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class SourceKind:
    """One tool's payload shape, written from the vendor's public documentation.

    - ``decode(record, options)`` → flat record (see the module docstring).
    - ``parse(inbound)`` → the records in a body that is not a JSON object or a form (a SOAP
      message, say); ``None`` uses the intake's own JSON / form / CSV reading.
    - ``verify(inbound, secret, now)`` → whether the vendor's signature over the request is
      valid for ``secret`` (the secret the vendor gave, entered on the source).
    - ``handshake(inbound, secret, options)`` → the answer to a vendor's verification request
      (a GET challenge), or ``None`` when the request is not one.
    - ``acknowledge(accepted_ids)`` → the body the vendor requires on success (a SOAP ack).
    - ``options`` names the kind options the source may set, each with a one-line meaning.
    - ``redact(record)`` → the record without what must not be stored (a secret the vendor puts
      in the body), applied before a lead is stored; ``redact_body(body)`` likewise for a body
      kept in the refused inbox.
    - ``split(record, options)`` → the records one JSON body holds, each becoming a lead (Meta
      batches several leadgen changes in one notification); ``None`` keeps the body whole.
    - ``awaits_fetch(record, options)`` → for a record that is no lead itself but names one the
      worker fetches from the vendor's API (a leadgen notification): ``""`` to accept it as a
      lead waiting for that fetch, or why it cannot be fetched (the refusal's message); ``None``
      when the record is no such notice.
    """

    name: str
    label: str
    docs: str
    decode: Callable[[Record, Options], Record]
    parse: Callable[[Inbound], list[Record]] | None = None
    verify: Callable[[Inbound, str, datetime], bool] | None = None
    signature_header: str = ""
    handshake: Callable[[Inbound, str, Options], Reply | None] | None = None
    acknowledge: Callable[[list[str]], Reply] | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    secret_options: tuple[str, ...] = ()  # options that are secrets: never exported or audited
    redact: Callable[[Record], Record] | None = None
    redact_body: Callable[[bytes], bytes] | None = None
    batch: bool = False  # its exports arrive as CSV batches (webinar reports)
    split: Callable[[Record, Options], list[Record]] | None = None
    awaits_fetch: Callable[[Record, Options], str | None] | None = None


# --- helpers for decoders ---------------------------------------------------------------------


def as_text(value: Any) -> str:
    """A scalar as text ("" for None and containers); numbers as written."""
    if value is None or isinstance(value, dict | list):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def first(value: Any) -> Any:
    """The first non-blank item of a list (or the value itself when it is not a list)."""
    if isinstance(value, list):
        for item in value:
            if item not in (None, "") and not isinstance(item, dict | list):
                return item
        return None
    return value


def scalar_or_joined(value: Any) -> Any:
    """A one-item list as its item; a list of scalars as "a; b"; anything else unchanged."""
    if isinstance(value, list):
        scalars = [as_text(item) for item in value if not isinstance(item, dict | list)]
        scalars = [text for text in scalars if text.strip()]
        if len(scalars) == len(value):
            return scalars[0] if len(scalars) == 1 else "; ".join(scalars)
    return value


def json_in(value: Any) -> Any:
    """A JSON object or array written as a string, decoded; anything else unchanged."""
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("{", "[") and len(text) <= 1_000_000:
            try:
                return json.loads(text)
            except (ValueError, RecursionError):
                return value
    return value


def get(record: Any, *keys: str | int) -> Any:
    """``record[k1][k2]...`` or None when any step is missing or of the wrong type."""
    node = record
    for key in keys:
        if isinstance(key, int):
            if not isinstance(node, list) or not -len(node) <= key < len(node):
                return None
            node = node[key]
        else:
            if not isinstance(node, dict):
                return None
            node = node.get(key)
        node = json_in(node)
    return node


def pairs_to_record(
    items: Iterable[Any], *, name_keys: Iterable[str], value_keys: Iterable[str]
) -> Record:
    """[{name, value}, ...] → {name: value}: the first of ``name_keys`` each item has names it,
    the first of ``value_keys`` gives the value (a one-item list unwrapped). Repeated names keep
    the first non-blank value."""
    out: Record = {}
    names = tuple(name_keys)
    values = tuple(value_keys)
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        name = next((item[k] for k in names if isinstance(item.get(k), str | int)), None)
        if name is None or isinstance(name, bool):
            continue
        value = next((item[k] for k in values if k in item), None)
        value = scalar_or_joined(value)
        key = str(name)
        if key not in out or out[key] in (None, ""):
            out[key] = value
    return out


def merge(*parts: Mapping[str, Any] | None) -> Record:
    """Records merged left to right; a key already holding a non-blank value keeps it."""
    out: Record = {}
    for part in parts:
        for key, value in (part or {}).items():
            if key not in out or out[key] in (None, "", [], {}):
                out[key] = value
    return out


def put(out: Record, key: str, value: Any, *, twin: bool = True) -> None:
    """``out[key] = value`` for a non-blank scalar (a list of scalars as "a; b"), never
    overwriting another non-blank value: with ``twin`` it goes to "key (2)", "key (3)"... (no
    answer lost), else the first value stays. The same value twice is kept once."""
    value = scalar_or_joined(value)
    if value is None or isinstance(value, dict | list) or as_text(value).strip() == "":
        return
    if key in out and out[key] is not None and as_text(out[key]).strip() != "":
        if out[key] == value or not twin:
            return
        n = 2
        while f"{key} ({n})" in out:
            n += 1
        key = f"{key} ({n})"
    out[key] = value


def fold_key(key: str) -> str:
    """A key's letters and digits, lower-cased: "Job Title", "job_title" and "JobTitle" alike."""
    return "".join(ch for ch in key.casefold() if ch.isalnum())
