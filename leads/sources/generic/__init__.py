"""Generic: any tool that posts a JSON object or a form; keys matched by the field map and the
built-in aliases, and canonical values below the top level found by ``leads.sources.deep``."""

from __future__ import annotations

from leads.sources.base import Options, Record, SourceKind


def decode(record: Record, options: Options) -> Record:
    # The top level as sent; the look below it is every kind's fallback (leads.sources.flatten).
    return dict(record)


KIND = SourceKind(
    name="generic",
    label="Generic (JSON object, form post or CSV; field map and aliases)",
    docs="docs/api.md#generic-sources",
    decode=decode,
)
