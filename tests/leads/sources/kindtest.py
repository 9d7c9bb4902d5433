"""Helpers for the per-kind tests: read a kind's fixture, and read it as the worker would.

A fixture is the vendor's body exactly as documented (``.json``, ``.xml``, ``.csv`` or
``.form`` for an ``application/x-www-form-urlencoded`` body), in ``leads/sources/<kind>/
fixtures/``; ``fixtures/SOURCES.md`` says where each one comes from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from leads.normalize import NormalizedLead, normalize
from leads.sources import Flattened, flatten, kind_get

SOURCES_DIR = Path(__file__).resolve().parents[3] / "leads" / "sources"


def fixture_path(kind: str, name: str) -> Path:
    return SOURCES_DIR / kind / "fixtures" / name


def fixture_bytes(kind: str, name: str) -> bytes:
    return fixture_path(kind, name).read_bytes()


def fixture_record(kind: str, name: str) -> Any:
    """The fixture as the intake stores it: a parsed JSON body, or a form body as a record
    (a repeated key becomes a list, as ``leads.parsing`` does)."""
    path = fixture_path(kind, name)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    if path.suffix == ".form":
        record: dict[str, Any] = {}
        for key, value in parse_qsl(text.strip(), keep_blank_values=True):
            if key in record:
                existing = record[key]
                pair = [*existing, value] if isinstance(existing, list) else [existing, value]
                record[key] = pair
            else:
                record[key] = value
        return record
    raise ValueError(f"read {path.suffix} fixtures with the kind's parse hook")


def flattened(kind: str, record: Any, options: dict[str, Any] | None = None) -> Flattened:
    return flatten(record, kind=kind, field_map=None, options=options)


def lead_from(
    kind: str,
    record: Any,
    options: dict[str, Any] | None = None,
    field_map: dict[str, str] | None = None,
) -> NormalizedLead:
    """What the worker makes of ``record`` from a source of ``kind``: flatten, then normalise.

    Asserts the kind's own decoder read it (no fallback to the generic reading)."""
    assert kind_get(kind).name == kind, f"no kind {kind!r} is registered"
    flat = flatten(record, kind=kind, field_map=field_map, options=options)
    assert not flat.decoder_error, flat.decoder_error
    result = normalize(flat.record, field_map)
    return NormalizedLead(
        fields=result.fields,
        custom=result.custom,
        flags=tuple(sorted({*result.flags, *flat.flags})),
    )
