"""The fields a condition may test, and what kind of value each holds."""

from __future__ import annotations

import enum

# Copied from leads.normalize.CANONICAL_FIELDS: the engine may not import the apps (an
# import-linter contract), and tests/routing/engine/test_fields.py keeps the two in step.
CANONICAL_FIELDS: tuple[str, ...] = (
    "email",
    "email_domain",
    "first_name",
    "last_name",
    "phone",
    "company",
    "domain",
    "title",
    "country",
    "region",
    "city",
    "postal_code",
    "employees",
    "annual_revenue",
    "industry",
    "lead_score",
    "utm_source",
    "utm_medium",
    "utm_campaign",
    "website",
    "external_id",
)

CUSTOM_PREFIX = "custom."


class FieldKind(enum.Enum):
    """What a field holds, which decides the value types its operators accept."""

    TEXT = "text"
    NUMBER = "number"
    BOOLEAN = "yes/no"
    ANY = "any"  # custom.* keys arrive as sent: text, number or yes/no


_NUMBER_FIELDS = frozenset({"employees", "annual_revenue", "lead_score"})

_FIELD_KINDS: dict[str, FieldKind] = {
    **{
        name: FieldKind.NUMBER if name in _NUMBER_FIELDS else FieldKind.TEXT
        for name in CANONICAL_FIELDS
    },
    "source": FieldKind.TEXT,
    "is_free_email": FieldKind.BOOLEAN,
    "account.exists": FieldKind.BOOLEAN,
    "account.name": FieldKind.TEXT,
    "account.tier": FieldKind.TEXT,
    "account.domain": FieldKind.TEXT,
}

FIELD_NAMES: tuple[str, ...] = (*_FIELD_KINDS, CUSTOM_PREFIX + "<key>")


def field_kind(name: str) -> FieldKind | None:
    """The kind of a condition field, or None when no such field exists."""
    if name.startswith(CUSTOM_PREFIX):
        return FieldKind.ANY if name[len(CUSTOM_PREFIX) :].strip() else None
    return _FIELD_KINDS.get(name)
