"""WPForms: the Webhooks addon's request body, or an entry's ``fields`` object.

Shapes from WPForms' docs: the Webhooks addon ("How to Install and Use the Webhooks Addon with
WPForms", https://wpforms.com/docs/how-to-install-and-use-the-webhooks-addon-with-wpforms/)
sends the Request Body the admin maps — a key of their choosing per form field or Smart Tag,
as JSON or as a form post; and the developer docs of ``wpforms_process_complete``
(https://wpforms.com/developers/wpforms_process_complete/) describe the entry's ``fields``:
``{"1": {"name": "Name", "value": "Jane Doe", "id": 1, "type": "name", "first": "Jane",
"middle": "", "last": "Doe"}, "2": {"name": "Email", "value": "...", "type": "email"}, ...}``,
an Address field with ``address1``, ``address2``, ``city``, ``state``, ``postal``,
``country``, and Checkbox / Dropdown values with one choice a line.

A field is read by its type where the type says what it holds (name, email, phone, address,
url), else by its label through the aliases; every other answer is kept under its label.
The entry id (``entry_id`` or the ``{entry_id}`` Smart Tag) is the idempotency key.
"""

from __future__ import annotations

from typing import Any

from leads.sources.base import Options, Record, SourceKind, as_text, get, put, scalar_or_joined

_TYPED = {"email": "email", "phone": "phone", "url": "website"}
_ADDRESS = {
    "address1": "street",
    "address2": "street_2",
    "city": "city",
    "state": "region",
    "postal": "postal_code",
    "country": "country",
}
_NAME = {"first": "first_name", "middle": "name_middle", "last": "last_name"}
_ENTRY_ID_KEYS = frozenset({"entry_id", "entryid", "entry id", "wpforms_entry_id"})
# Keys of a field object that are about the field, not the answer.
_FIELD_META = frozenset({"name", "value", "id", "type", "value_raw", "label", "key"})


def _put(out: Record, key: str, value: Any) -> None:
    """``out[key] = value`` for a non-blank scalar, without overwriting a non-blank value."""
    put(out, key, _choices(value))


def _choices(value: Any) -> Any:
    """WPForms writes several ticked choices one a line: "a\\nb" → "a; b"."""
    value = scalar_or_joined(value)
    if isinstance(value, str) and "\n" in value.strip():
        lines = [line.strip() for line in value.splitlines()]
        return "; ".join(line for line in lines if line)
    return value


def _field_objects(record: Record) -> list[dict[str, Any]] | None:
    """The entry's field objects: ``record["fields"]`` (an object keyed by id, or a list), or
    the record itself when its values are field objects; None for a mapped flat body."""
    fields = get(record, "fields")
    candidates: Any = fields if isinstance(fields, dict | list) else record
    items = list(candidates.values()) if isinstance(candidates, dict) else candidates
    objects = [item for item in items if isinstance(item, dict) and "value" in item]
    if objects and (candidates is not record or len(objects) * 2 >= len(items)):
        return objects
    return None


def _field(out: Record, field: dict[str, Any]) -> None:
    kind = as_text(get(field, "type")).casefold()
    label = as_text(get(field, "name")).strip() or as_text(get(field, "label")).strip()
    label = label or f"field {as_text(get(field, 'id'))}"
    value = get(field, "value")
    if kind == "name":
        parts = {key: get(field, key) for key in _NAME if as_text(get(field, key)).strip()}
        if parts:
            for key, part in parts.items():
                _put(out, _NAME[key], part)
        else:
            _put(out, "full_name", value)  # the "Simple" name format: one box
        return
    if kind == "address":
        parts = {key: get(field, key) for key in _ADDRESS if as_text(get(field, key)).strip()}
        if parts:
            for key, part in parts.items():
                _put(out, _ADDRESS[key], part)
        else:
            _put(out, label, value)
        return
    target = _TYPED.get(kind)
    if target is not None and target not in out:
        _put(out, target, value)
    else:
        _put(out, label, value)
    for key, extra in field.items():  # e.g. a payment field's amount, a file's URL
        if (
            isinstance(key, str)
            and key not in _FIELD_META
            and key not in _NAME
            and not isinstance(get(field, key), dict | list)
        ):
            _put(out, f"{label} {key}", extra)


def decode(record: Record, options: Options) -> Record:
    out: Record = {}
    objects = _field_objects(record)
    if objects is not None:
        for field in objects:
            _field(out, field)
    for key, value in record.items():
        if not isinstance(key, str):
            continue
        if objects is not None and key == "fields":
            continue
        value = get(record, key)
        if isinstance(value, dict) and "value" in value and objects is not None:
            continue  # a field object, read above
        if key.strip().casefold() in _ENTRY_ID_KEYS:
            _put(out, "external_id", value)
        elif isinstance(value, dict):
            # A mapped key holding a field's parts (a relay that sends the Name as an object).
            for part, part_value in value.items():
                if isinstance(part, str):
                    target = _NAME.get(part) or _ADDRESS.get(part) or f"{key} {part}"
                    _put(out, target, part_value)
        else:
            # A form post's repeated "Topics[]" (one key per ticked choice) is one answer.
            _put(out, key[:-2] if key.endswith("[]") and len(key) > 2 else key, value)
    return out


KIND = SourceKind(
    name="wpforms",
    label="WPForms (Webhooks addon: mapped body, or the entry's fields)",
    docs="https://wpforms.com/docs/how-to-install-and-use-the-webhooks-addon-with-wpforms/",
    decode=decode,
)
