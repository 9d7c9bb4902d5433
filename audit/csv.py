"""The history export: CSV of the filtered leads, streamed, safe to open in a spreadsheet."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from audit.selectors import HistoryRow, history_row
from leads.models import Lead

# A spreadsheet reads a cell starting with one of these as a formula (OWASP "CSV injection";
# ASVS V1.2.10): such cells get a leading apostrophe, which makes them plain text.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\0")

HEADER = (
    "lead id",
    "received at",
    "name",
    "email",
    "company",
    "source",
    "status",
    "owner",
    "team",
    "rule",
    "assigned at",
)

EXPORT_CHUNK = 2000


# What a spreadsheet may skip before reading a cell as a formula: every Unicode space (str.strip's
# whitespace, which covers NBSP, the en/em/thin spaces and the ideographic space), plus the
# zero-width characters and the byte-order mark, which are not whitespace to Python.
_INVISIBLE_LEAD = (
    "".join(chr(c) for c in range(0x3001) if chr(c).isspace()) + "\u200b\u200c\u200d\u2060\ufeff"
)


def cell_safe(value: Any) -> str:
    """``value`` as CSV cell text that no spreadsheet evaluates."""
    if value is None:
        return ""
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    # Some spreadsheets trim leading whitespace (spaces, NBSP, newlines) before evaluating.
    if text.startswith(FORMULA_STARTS) or text.lstrip(_INVISIBLE_LEAD).startswith(FORMULA_STARTS):
        return "'" + text
    return text


def row_cells(row: HistoryRow) -> list[str]:
    return [
        cell_safe(value)
        for value in (
            row.id,
            row.received_at,
            row.name,
            row.email,
            row.company,
            row.source,
            row.status,
            row.owner,
            row.team,
            row.rule,
            row.assigned_at,
        )
    ]


class _Echo:
    """A file whose write returns what it was given, so csv.writer yields lines."""

    def write(self, value: str) -> str:
        return value


def csv_lines(rows: Iterable[list[str]]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(HEADER)
    for cells in rows:
        yield writer.writerow(cells)


def export_lines(leads: QuerySet[Lead]) -> Iterator[str]:
    """The CSV of ``leads`` (newest first), read from the database in chunks."""
    ordered = leads.order_by("-received_at", "-id")
    return csv_lines(row_cells(history_row(lead)) for lead in ordered.iterator(EXPORT_CHUNK))
