"""The engine's copy of the canonical field names stays in step with normalisation."""

from __future__ import annotations

from leads.normalize import CANONICAL_FIELDS as NORMALIZED_FIELDS
from routing.engine.fields import CANONICAL_FIELDS, FieldKind, field_kind


def test_canonical_fields_match_leads_normalize() -> None:
    assert CANONICAL_FIELDS == NORMALIZED_FIELDS


def test_field_kinds() -> None:
    assert field_kind("country") is FieldKind.TEXT
    assert field_kind("employees") is FieldKind.NUMBER
    assert field_kind("lead_score") is FieldKind.NUMBER
    assert field_kind("is_free_email") is FieldKind.BOOLEAN
    assert field_kind("account.exists") is FieldKind.BOOLEAN
    assert field_kind("account.tier") is FieldKind.TEXT
    assert field_kind("source") is FieldKind.TEXT
    assert field_kind("custom.plan") is FieldKind.ANY
    assert field_kind("custom.") is None
    assert field_kind("account.owner") is None
    assert field_kind("full_name") is None
    assert field_kind("Country") is None
