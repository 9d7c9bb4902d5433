"""Jotform: the form webhook (Settings → Integrations → WebHooks).

Shapes from Jotform's help article "How to Set Up a Webhook with Jotform"
(https://www.jotform.com/help/245-how-to-setup-a-webhook-with-jotform/) and its API docs
(https://api.jotform.com/docs/): a ``multipart/form-data`` POST whose ``rawRequest`` field is
the submission as a JSON string, answers keyed ``q<N>_<uniqueName>`` — a Full Name field as
``{first, last}`` (``prefix``, ``middle``, ``suffix`` where enabled), a Phone field as
``{full}`` or ``{area, phone}``, an Address field as ``{addr_line1, addr_line2, city, state,
postal, country}``, a Date as ``{month, day, year}``, multiple choices as a list — beside the
form's ``formID``, ``formTitle``, ``submissionID``, ``ip`` and ``pretty`` (the answers as
"Label:value, Label:value"). The sample bodies Zulip's Jotform integration tests with
(zulip/zulip, ``zerver/webhooks/jotform/fixtures/``) show the same fields.

A field's unique name is its label's first words in camel case ("What is your e-mail?" →
``whatIs``), so the labels come from ``pretty`` where they can be matched to a name. An answer
becomes a canonical field by its structure (a name, a phone, an address) or by its label or
name; everything else is kept under its label. Jotform does not sign its webhooks, so the
source authenticates with our token in the URL. The submission id is the idempotency key.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from leads.normalize import FULL_NAME, canonical_key
from leads.sources.base import Options, Record, SourceKind, as_text, get, put, scalar_or_joined
from leads.sources.labels import TEXT_TARGETS, camel_words, question_target

_ANSWER_RE = re.compile(r"q(\d+)_(.+)")
_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}")
_ADDRESS_PARTS = {
    "addr_line1": "street",
    "addr_line2": "street 2",
    "city": "city",
    "state": "region",
    "postal": "postal_code",
    "country": "country",
}
_NAME_PARTS = {
    "prefix": "name prefix",
    "first": "first_name",
    "middle": "middle name",
    "last": "last_name",
    "suffix": "name suffix",
}
_OTHER_PARTY_RE = re.compile(r"\b(their|colleague|friend|referr\w*|manager|emergency)\b")
# Top-level webhook fields kept for the record, under clearer names.
_FORM_FIELDS = {
    "formID": "jotform_form_id",
    "formTitle": "jotform_form_title",
    "ip": "ip_address",
    "type": "jotform_submission_type",
}


def _pretty_labels(pretty: Any) -> list[str]:
    """The labels in ``pretty`` ("Name:Jane Doe, E-mail:jane@x.de"), in order.

    The string is not escaped (a label or a value may hold ", " or ":"), so this is a best
    reading: each ", "-separated piece with a ":" starts a new answer.
    """
    if not isinstance(pretty, str):
        return []
    labels = []
    for piece in pretty.split(", "):
        label, colon, _value = piece.partition(":")
        if colon and label.strip():
            labels.append(label.strip())
    return labels


def _fold(text: str) -> str:
    """ "Date préférée" and "datePreferee" alike: lower-case letters and digits, no accents."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if ch.isalnum() and not unicodedata.combining(ch))


def _label_for(name: str, labels: list[str], used: set[int]) -> str:
    """The ``pretty`` label whose words start as the unique name does, else the name."""
    folded = _fold(name)
    if folded:
        for i, label in enumerate(labels):
            if i not in used and _fold(label).startswith(folded):
                used.add(i)
                return label
    return camel_words(name)


def _joined_parts(value: dict[str, Any]) -> str | None:
    parts = [(k, as_text(scalar_or_joined(v))) for k, v in value.items() if isinstance(k, str)]
    return "; ".join(f"{k}: {text}" for k, text in parts if text.strip()) or None


def _answer(out: Record, custom: list[tuple[str, Any]], name: str, label: str, value: Any) -> None:
    """One answer: structured fields by their parts, scalars by their label or name."""
    if isinstance(value, dict):
        keys = set(value)
        if keys & {"first", "last"}:
            # The lead's own name, unless the label says it is someone else's
            # ("Referrer's name") or another field already gave it.
            about_lead = question_target(label) in (FULL_NAME, "first_name", None)
            about_lead = about_lead and not _OTHER_PARTY_RE.search(label.casefold())
            about_lead = about_lead and "first_name" not in out and "last_name" not in out
            for part, key in _NAME_PARTS.items():
                put(out, key if about_lead else f"{label} ({part})", value.get(part))
            return
        if keys & {"full", "area", "phone"}:
            full = as_text(value.get("full")).strip()
            if not full:
                pieces = (as_text(value.get(k)).strip() for k in ("country", "area", "phone"))
                full = " ".join(piece for piece in pieces if piece)
            if full and "phone" not in out:
                out["phone"] = full
            elif full:
                custom.append((label, full))
            return
        if keys & {"addr_line1", "city", "postal", "country", "state"}:
            for part, key in _ADDRESS_PARTS.items():
                put(out, key if key not in out else f"{label} ({part})", value.get(part))
            return
        if keys >= {"month", "day", "year"}:
            date = "-".join(as_text(value.get(k)).strip() for k in ("year", "month", "day"))
            if date.strip("-"):
                custom.append((label, date))
            return
        joined = _joined_parts(value)
        if joined:
            custom.append((label, joined))
        return
    value = scalar_or_joined(value)
    if value is None or isinstance(value, dict | list) or as_text(value).strip() == "":
        return
    target = question_target(label, TEXT_TARGETS) or canonical_key(name)
    if target is None and isinstance(value, str) and _EMAIL_RE.fullmatch(value.strip()):
        target = "email"  # an e-mail answer under a label that says nothing ("whatIs")
    if target is not None and target not in out:
        out[target] = value
    else:
        custom.append((label, value))


def decode(record: Record, options: Options) -> Record:
    raw = get(record, "rawRequest")
    # Submitted with the webhook off, or posted by a relay: the answers at the top level.
    answers = raw if isinstance(raw, dict) else record
    labels = _pretty_labels(get(record, "pretty"))
    used: set[int] = set()
    ordered = []
    for key, value in answers.items():
        match = _ANSWER_RE.fullmatch(key) if isinstance(key, str) else None
        if match is not None:
            ordered.append((int(match.group(1)), match.group(2), value))
    ordered.sort(key=lambda item: item[0])  # pretty lists the answers in the form's order

    out: Record = {}
    custom: list[tuple[str, Any]] = []
    for _number, name, value in ordered:
        label = _label_for(name, labels, used)
        _answer(out, custom, name, label, value)
    # Uploads arrive twice: temporary names under temp_upload.qN_name, and the stored files'
    # links under the bare unique name.
    for key, value in answers.items():
        links = isinstance(value, list) and bool(value)
        links = links and all(isinstance(v, str) and v.startswith("https://") for v in value)
        if isinstance(key, str) and links:
            custom.append((_label_for(key, labels, used), "; ".join(value)))
    for key, value in custom:
        put(out, key, value)

    put(out, "external_id", get(record, "submissionID") or get(answers, "submission_id"))
    for key, name in _FORM_FIELDS.items():
        put(out, name, get(record, key))
    put(out, "jotform_event_id", get(answers, "event_id"))
    return out


KIND = SourceKind(
    name="jotform",
    label="Jotform (form webhook)",
    docs="https://www.jotform.com/help/245-how-to-setup-a-webhook-with-jotform/",
    decode=decode,
)
