"""GoTo Webinar (GoToWebinar): registrant and attendee report exports, and the registrant webhook.

Shapes from GoTo's documentation:
- reports: support.goto.com GoTo Webinar help, "Generate reports" (Registration and Attendee
  reports, exported as CSV/Excel with a title block and an "Attendee Details" section); the
  columns are the registration form's fields ("First Name", "Last Name", "Email Address",
  "Organization", "Job Title", "Country/Region", "State", "Zip Code", "Phone"...), one column per
  custom question. ``leads.parsing.parse_csv`` skips the title block.
- webhook and API: developer.goto.com/guides/GoToWebinar/07_HOW_WebHooksOverview/ and
  08_HOW_webhooks/ (``registrant.added`` / ``registrant.joined`` events: a flat JSON object with
  ``firstName``, ``lastName``, ``email``, ``registrantKey``, ``webinarKey``...), and the
  GoToWebinar V2 API's detailed registrant (``organization``, ``jobTitle``, ``zipCode``,
  ``responses[{question, answer}]``) which integrations forward as is.

GoTo signs webhooks with a secret key created through its API, but the signing scheme is not in
the pages we hold, so this kind has no ``verify``: use the source's token (``?token=``).
"""

from __future__ import annotations

from typing import Any

from leads.normalize import canonical_key
from leads.sources.base import (
    Options,
    Record,
    SourceKind,
    fold_key,
    pairs_to_record,
    scalar_or_joined,
)

# Export column (folded) → canonical field; other columns keep their heading.
_COLUMNS = {
    fold_key(column): field
    for column, field in {
        "Email Address": "email",
        "Email": "email",
        "First Name": "first_name",
        "Last Name": "last_name",
        "Phone": "phone",
        "Organization": "company",
        "Job Title": "title",
        "Country/Region": "country",
        "Country": "country",
        "State": "region",
        "State/Province": "region",
        "City": "city",
        "Zip Code": "postal_code",
        "Zip/Postal Code": "postal_code",
        "Industry": "industry",
        "Number of Employees": "employees",
        "Registrant Key": "external_id",
    }.items()
}

# Webhook / API registrant key → canonical field.
_REGISTRANT = {
    "email": "email",
    "firstName": "first_name",
    "lastName": "last_name",
    "phone": "phone",
    "organization": "company",
    "jobTitle": "title",
    "country": "country",
    "state": "region",
    "city": "city",
    "zipCode": "postal_code",
    "industry": "industry",
    "numberOfEmployees": "employees",
    "registrantKey": "external_id",
}

# GoTo's exports leave a cell empty or write "N/A" for a question the registrant skipped.
_NO_VALUE = frozenset({"", "n/a", "--"})


def _keep(rest: Record, key: str, value: Any) -> None:
    """A value that cannot be the canonical one (an object, a list of objects) stays in custom
    under a key the aliases do not map, so it is neither lost nor read as the field."""
    name = key if canonical_key(key) is None else f"{key} (as sent)"
    rest[name] = value


def _scalar(value: Any) -> Any:
    value = scalar_or_joined(value)
    return None if isinstance(value, dict | list) else value


def _blank(value: Any) -> bool:
    return value is None or str(value).strip().casefold() in _NO_VALUE


def _json_registrant(record: Record) -> Record:
    out: Record = {}
    rest: Record = {}
    for key, value in record.items():
        if key == "responses":
            continue
        field = _REGISTRANT.get(key)
        if field is None:
            rest[key] = scalar_or_joined(value)
            continue
        if _scalar(value) is None and isinstance(value, dict | list) and value:
            _keep(rest, str(key), value)
            continue
        value = _scalar(value)
        if _blank(value):
            continue
        # registrantKey is a 64-bit number: text, so it survives as the idempotency key.
        out[field] = str(value) if field == "external_id" else value
    answers = pairs_to_record(
        record.get("responses") or [], name_keys=("question",), value_keys=("answer",)
    )
    return {**out, **rest, **answers}


def _export_row(record: Record) -> Record:
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
        if _blank(value):
            continue
        if field in out:
            _keep(rest, str(key), value)  # a second column for the field: kept, not lost
        else:
            out[field] = value
    return {**out, **rest}


def decode(record: Record, options: Options) -> Record:
    # The JSON shapes use camelCase keys; an export row is keyed by spaced headings.
    if any(key in record for key in ("registrantKey", "firstName", "eventName", "webinarKey")):
        return _json_registrant(record)
    return _export_row(record)


KIND = SourceKind(
    name="gotowebinar",
    label="GoTo Webinar (registrant / attendee export CSV, registrant webhook)",
    docs="leads/sources/gotowebinar/RECIPE.md",
    decode=decode,
    batch=True,
)
