"""Enrichment never overwrites: what a provider found only fills fields that are still empty.

Also the validation of what an outside provider sends: each value goes through the same
``leads.normalize`` function as a lead's own value, and anything that does not normalise, or any
key that is not a field we accept, is ignored (named in ``ignored``), never stored as sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from leads.normalize import (
    normalize_country,
    normalize_domain,
    normalize_employees,
    normalize_number,
    normalize_postal_code,
    normalize_region,
    normalize_text,
)

# What the HTTP provider may fill, and how each value is checked. `region` is checked against
# the lead's country after the merge (see `provider_values`).
_ACCEPTED: dict[str, Callable[[Any], Any]] = {
    "company": normalize_text,
    "domain": normalize_domain,
    "industry": normalize_text,
    "title": normalize_text,
    "city": normalize_text,
    "postal_code": normalize_postal_code,
    "country": normalize_country,
    "employees": normalize_employees,
    "annual_revenue": normalize_number,
}
ACCEPTED_FIELDS: tuple[str, ...] = (*_ACCEPTED, "region")
MAX_IGNORED_LISTED = 20


def is_empty(value: Any) -> bool:
    """What counts as "no value" on a lead: None or the empty string (0 is a value)."""
    return value is None or value == ""


def merge_empty(current: Mapping[str, Any], incoming: Mapping[str, Any]) -> dict[str, Any]:
    """The values of ``incoming`` for fields that are empty in ``current`` (and non-empty there).

    Pure: the caller applies the result. Fields absent from ``current`` count as empty.
    """
    return {
        name: value
        for name, value in incoming.items()
        if not is_empty(value) and is_empty(current.get(name))
    }


def fill_empty(target: Any, values: Mapping[str, Any]) -> list[str]:
    """Set each of ``values`` on ``target`` (a Lead) where that attribute is empty; the names."""
    current = {name: getattr(target, name, None) for name in values}
    fills = merge_empty(current, values)
    for name, value in fills.items():
        setattr(target, name, value)
    return list(fills)


def _revenue(value: Any) -> Decimal | None:
    number = normalize_number(value)
    if number is None or number < 0:
        return None
    try:
        amount = Decimal(str(number)).quantize(Decimal("0.01"))
    except (InvalidOperation, ValueError):
        return None
    return amount if amount < Decimal(10) ** 18 else None


def provider_values(body: Any, *, country: str = "") -> tuple[dict[str, Any], list[str]]:
    """(clean values by field, names of what was ignored) from a provider's JSON object.

    Never raises, whatever ``body`` is. Text is trimmed and capped, the country is an ISO
    alpha-2 code, the region a subdivision of the lead's country (else the provided one),
    employees a non-negative int, annual revenue a non-negative Decimal with two places.
    """
    if not isinstance(body, dict):
        return {}, ["(body is not a JSON object)"]
    values: dict[str, Any] = {}
    ignored: list[str] = []
    for raw_key, raw_value in body.items():
        key = raw_key if isinstance(raw_key, str) else str(raw_key)
        if raw_value is None or raw_value == "":
            continue
        if key == "annual_revenue":
            value: Any = _revenue(raw_value)
        elif key in _ACCEPTED and not isinstance(raw_value, dict | list):
            value = _ACCEPTED[key](raw_value)
        elif key == "region" or key in _ACCEPTED:
            value = None if isinstance(raw_value, dict | list) else raw_value
        else:
            value = None
        if value is None:
            ignored.append(normalize_text(key, 64) or "?")
            continue
        values[key] = value
    if "region" in values:
        # The lead's own country wins: a provider's country only fills an empty one.
        region = normalize_region(values.pop("region"), country or values.get("country"))
        if region is None:
            ignored.append("region")
        else:
            values["region"] = region
    return values, ignored[:MAX_IGNORED_LISTED]
