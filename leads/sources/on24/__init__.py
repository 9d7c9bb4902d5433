"""ON24: registration and attendee report exports, and the registrant record of its API.

Shapes from ON24's documentation:
- reports: support.on24.com, Analytics → Event reports → "Registration" / "Attendee" report,
  exported as CSV/Excel with a short title block; the columns are the registration form's
  standard fields ("Email", "First Name", "Last Name", "Company", "Job Title", "Country",
  "State", "City", "Zip", "Work Phone"...), then engagement columns ("Live Minutes",
  "Archive Minutes", "Engagement Score") and one column per custom question.
- API: ON24 REST v2 ``/client/{clientId}/event/{eventId}/registrant`` (lower-case keys:
  ``email``, ``firstname``, ``lastname``, ``company``, ``jobtitle``, ``workphone``, ``zip``,
  ``eventuserid``...), the record ON24 Connect integrations forward.

ON24 exports have no request signature; the source's token authenticates an upload.
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

# Export heading or API key (folded: "Work Phone" and "workphone" are one) → canonical field.
_FIELDS = {
    fold_key(column): field
    for column, field in {
        "Email": "email",
        "Email Address": "email",
        "First Name": "first_name",
        "Last Name": "last_name",
        "Company": "company",
        "Company Name": "company",
        "Organization": "company",
        "Job Title": "title",
        "Work Phone": "phone",
        "Phone": "phone",
        "Country": "country",
        "State": "region",
        "State/Province": "region",
        "City": "city",
        "Zip": "postal_code",
        "Zip/Postal Code": "postal_code",
        "Company Industry": "industry",
        "Industry": "industry",
        "Company Size": "employees",
        "Event User ID": "external_id",
        "Event User Id": "external_id",
        # partnerref is ON24's tracking code on the registration link: the campaign source.
        "Partner Ref": "utm_source",
    }.items()
}

_NO_VALUE = frozenset({"", "n/a", "--"})


def _keep(rest: Record, key: str, value: Any) -> None:
    """A value that cannot be the canonical one (an object, a list of objects) stays in custom
    under a key the aliases do not map, so it is neither lost nor read as the field."""
    name = key if canonical_key(key) is None else f"{key} (as sent)"
    rest[name] = value


def _scalar(value: Any) -> Any:
    value = scalar_or_joined(value)
    return None if isinstance(value, dict | list) else value


def decode(record: Record, options: Options) -> Record:
    out: Record = {}
    rest: Record = {}
    for key, value in record.items():
        if key == "userquestions":
            continue
        field = _FIELDS.get(fold_key(key)) if isinstance(key, str) else None
        if field is None:
            rest[str(key)] = scalar_or_joined(value)
            continue
        if _scalar(value) is None and isinstance(value, dict | list) and value:
            _keep(rest, str(key), value)
            continue
        value = _scalar(value)
        if value is None or str(value).strip().casefold() in _NO_VALUE:
            continue
        if field in out:
            _keep(rest, str(key), value)  # "Phone" beside "Work Phone": kept, not lost
            continue
        out[field] = str(value) if field == "external_id" else value
    # The API lists custom registration questions as [{question, answer}].
    answers = pairs_to_record(
        record.get("userquestions") or [], name_keys=("question",), value_keys=("answer",)
    )
    return {**out, **rest, **answers}


KIND = SourceKind(
    name="on24",
    label="ON24 (registration / attendee export CSV, API registrant)",
    docs="leads/sources/on24/RECIPE.md",
    decode=decode,
    batch=True,
)
