"""Gravity Forms: the Webhooks Add-On's request body, which is the Entry object.

Shapes from Gravity Forms' docs: the Webhooks Add-On ("Triggering Webhooks on Form
Submissions", https://docs.gravityforms.com/triggering-webhooks-form-submissions/; Request
Body "All Fields" sends the entry, "Select Fields" sends the keys the admin names) and the
Entry object (https://docs.gravityforms.com/entry-object/): entry properties (``id``,
``form_id``, ``date_created``, ``source_url``, ``ip``, ...) beside field values keyed by field
id, with one key per input of a multi-input field — the Name field's ``N.2`` prefix, ``N.3``
first, ``N.4`` middle, ``N.6`` last, ``N.8`` suffix; the Address field's ``N.1`` street,
``N.2`` line 2, ``N.3`` city, ``N.4`` state, ``N.5`` ZIP, ``N.6`` country; a Checkbox field's
``N.1``, ``N.2``... one per choice. A Multi Select is stored as a JSON array in a string.

The numbers mean nothing by themselves, so the source option ``fields`` maps them
(``{"2": "email", "1.3": "first_name", "4": "Company size"}``). Without it, a Name or Address
field is told by its inputs, an e-mail or phone answer by its value, and other fields keep
their ids (so the source's field map can still name them). Entries whose keys are labels
("Email", "Name (First)", "Address (Country)") are read by the aliases.
"""

from __future__ import annotations

import json
import re
from typing import Any

from leads.normalize import canonical_key, normalize_country
from leads.sources.base import Options, Record, SourceKind, as_text, get, put, scalar_or_joined

# Entry properties: kept for the record; ``id`` becomes the idempotency key.
_ENTRY_PROPERTIES = frozenset(
    {
        "form_id",
        "created_by",
        "date_created",
        "date_updated",
        "is_starred",
        "is_read",
        "ip",
        "source_url",
        "post_id",
        "user_agent",
        "status",
        "currency",
        "payment_status",
        "payment_date",
        "payment_amount",
        "payment_method",
        "transaction_id",
        "is_fulfilled",
        "transaction_type",
        "source_id",
    }
)
_INPUT_RE = re.compile(r"(\d+)\.(\d+)")
_FIELD_RE = re.compile(r"\d+")
_NAME_INPUTS = {"2": "name_prefix", "3": "first_name", "4": "name_middle", "6": "last_name"}
_NAME_INPUTS["8"] = "name_suffix"
_ADDRESS_INPUTS = {
    "1": "street",
    "2": "street_2",
    "3": "city",
    "4": "region",
    "5": "postal_code",
    "6": "country",
}
# "Name (First)", "Address (ZIP / Postal Code)": how Gravity Forms labels an input.
_LABEL_INPUT_RE = re.compile(r"^(?P<field>.*\S)\s*\((?P<input>[^()]+)\)$")
_INPUT_LABELS = {
    "prefix": "name_prefix",
    "first": "first_name",
    "middle": "name_middle",
    "last": "last_name",
    "suffix": "name_suffix",
    "street address": "street",
    "address line 2": "street_2",
    "city": "city",
    "state / province": "region",
    "state / province / region": "region",
    "state": "region",
    "province": "region",
    "county": "region",
    "zip / postal code": "postal_code",
    "postal code": "postal_code",
    "zip code": "postal_code",
    "zip": "postal_code",
    "country": "country",
}
_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}")
# A phone as typed into a form: a plus, a leading zero or separators, 7 to 15 digits.
_PHONE_RE = re.compile(r"(?:\+|00|0|\()[\d ()./-]{6,24}|\d{2,5}[ -][\d -]{5,20}")
# Dates a Date field stores ("2026-03-02", "03/02/2026", "02.03.2026") are no phones.
_DATE_RE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}[./-]\d{1,2}[./-]\d{2,4}")


def _field_option(options: Options) -> dict[str, str]:
    """The ``fields`` option: a JSON object (or its text) of field / input id → key."""
    value = options.get("fields") if hasattr(options, "get") else None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return {}
    if not isinstance(value, dict):
        return {}
    return {str(k).strip(): v.strip() for k, v in value.items() if isinstance(v, str) and v.strip()}


def _kind_of(inputs: dict[str, Any]) -> str:
    """ "name", "address" or "choices": what a multi-input field is, from its input numbers
    (both Name and Address use .3 and .6; a Checkbox field's choices always start at .1)."""
    numbers = set(inputs)
    if numbers <= set(_NAME_INPUTS) and numbers & {"3", "6"} and not numbers & {"1", "5"}:
        return "name"
    # The entry holds every input of an Address field, blank or not; a Checkbox field's choices
    # are numbered the same way, so a six-choice one is told apart by its ".6" not a country.
    if numbers <= set(_ADDRESS_INPUTS) and numbers >= {"1", "3", "5", "6"}:
        country = as_text(inputs.get("6")).strip()
        if not country or normalize_country(country):
            return "address"
    return "choices"


def _kinds(groups: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each multi-input field's kind, told with the others in view.

    An Address field whose blank inputs were left out of the entry (a "Select Fields" body, a
    relay that drops blanks) may keep only .6, or .4 and .6, which are also Name inputs. When
    the entry already has a Name field with a first name (.3), a field without one whose .6 is a
    country is that address; a Name field's own .6 ("Jordan", "Georgia") is never looked up.
    """
    kinds = {field_id: _kind_of(inputs) for field_id, inputs in groups.items()}
    if any(kinds[f] == "name" and "3" in inputs for f, inputs in groups.items()):
        for field_id, inputs in groups.items():
            if kinds[field_id] != "name" or "3" in inputs or not set(inputs) <= {"2", "4", "6"}:
                continue
            if normalize_country(as_text(scalar_or_joined(inputs.get("6"))).strip()):
                kinds[field_id] = "address"
    return kinds


def _looks_like_phone(text: str) -> bool:
    digits = sum(ch.isdigit() for ch in text)
    text = text.strip()
    return (
        7 <= digits <= 15
        and _PHONE_RE.fullmatch(text) is not None
        and _DATE_RE.fullmatch(text) is None
    )


def _unlabelled(out: Record, key: str, value: Any) -> None:
    """A field known only by its id: an e-mail or phone answer by its value, else its id."""
    text = as_text(scalar_or_joined(value)).strip()
    if "email" not in out and _EMAIL_RE.fullmatch(text):
        put(out, "email", value)
    elif "phone" not in out and _looks_like_phone(text):
        put(out, "phone", value)
    else:
        put(out, key, value)


def decode(record: Record, options: Options) -> Record:
    out: Record = {}
    mapped = _field_option(options)
    groups: dict[str, dict[str, Any]] = {}
    singles: list[tuple[str, Any]] = []
    for key, value in record.items():
        if not isinstance(key, str):
            continue
        value = get(record, key)  # a Multi Select's JSON array, decoded
        if isinstance(value, dict):
            continue  # no field stores an object; a relay's own wrapper, left to the fallback
        key = key.strip()
        if key in mapped:
            put(out, mapped[key], value)
            continue
        match = _INPUT_RE.fullmatch(key)
        if match:
            groups.setdefault(match[1], {})[match[2]] = value
        else:
            singles.append((key, value))

    kinds = _kinds(groups)
    for field_id, inputs in groups.items():
        if field_id in mapped:  # the whole field named by the option: its inputs as one answer
            joiner = " " if canonical_key(mapped[field_id]) == "full_name" else "; "
            parts = [as_text(scalar_or_joined(inputs[n])) for n in sorted(inputs, key=int)]
            put(out, mapped[field_id], joiner.join(p for p in parts if p.strip()))
            continue
        kind = kinds[field_id]
        if kind == "name":
            for number, value in inputs.items():
                put(out, _NAME_INPUTS[number], value)
        elif kind == "address":
            for number, value in inputs.items():
                put(out, _ADDRESS_INPUTS[number], value)
        else:
            # Checkbox choices (or an unknown multi-input field): the ticked ones, joined.
            parts = [as_text(scalar_or_joined(inputs[n])) for n in sorted(inputs, key=int)]
            put(out, field_id, "; ".join(p for p in parts if p.strip()))

    for key, value in singles:
        if key == "id" or key.casefold().replace(" ", "_") == "entry_id":
            put(out, "external_id", value)  # "Select Fields" bodies name it themselves
        elif key in _ENTRY_PROPERTIES:
            put(out, key, value)
        elif _FIELD_RE.fullmatch(key):
            _unlabelled(out, key, value)
        else:
            label = _LABEL_INPUT_RE.fullmatch(key)
            target = _INPUT_LABELS.get(label["input"].strip().casefold()) if label else None
            put(out, target or key, value)
    return out


KIND = SourceKind(
    name="gravity_forms",
    label="Gravity Forms (Webhooks Add-On: the entry, by field id or label)",
    docs="https://docs.gravityforms.com/triggering-webhooks-form-submissions/",
    decode=decode,
    options={
        "fields": (
            'JSON object of field or input id → lead field or label, e.g. {"2": "email", '
            '"1.3": "first_name", "5": "company"}; unmapped Name / Address inputs are '
            "recognised by their numbers"
        )
    },
)
