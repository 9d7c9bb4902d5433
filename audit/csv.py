"""The CSV exports (the history, the dashboard's tables), safe to open in a spreadsheet."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet

from audit.reports import Figures, RepRow, TeamFairness, TeamRow
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
    "priority",
    "tags",
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
            row.priority,
            "; ".join(row.tags),
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


# --- The dashboard's tables ---------------------------------------------------------------------


def table_lines(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> Iterator[str]:
    """A report table as CSV lines: numbers as they are (a negative gap stays a number), every
    other cell through ``cell_safe``."""
    writer = csv.writer(_Echo())
    yield writer.writerow([cell_safe(name) for name in header])
    for row in rows:
        yield writer.writerow([_report_cell(value) for value in row])


def _report_cell(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return cell_safe(value)


def _seconds(value: timedelta | None) -> str:
    return "" if value is None else f"{value.total_seconds():.1f}"


FIGURE_HEADER = (
    "assigned",
    "new",
    "reassigned in",
    "sla met",
    "sla missed",
    "sla met %",
    "time to assign p50 s",
    "time to assign p95 s",
    "time to first touch p50 s",
    "time to first touch p95 s",
    "reassigned away: sla",
    "reassigned away: by hand",
    "reassigned away: in the crm",
    "reassigned away: other",
)


def figure_cells(figures: Figures) -> list[Any]:
    return [
        figures.assigned,
        figures.new,
        figures.reassigned_in,
        figures.sla_met,
        figures.sla_missed,
        "" if figures.sla_pct is None else figures.sla_pct,
        _seconds(figures.tta_p50),
        _seconds(figures.tta_p95),
        _seconds(figures.ttft_p50),
        _seconds(figures.ttft_p95),
        figures.away_sla,
        figures.away_hand,
        figures.away_crm,
        figures.away_other,
    ]


def team_table_lines(rows: Iterable[TeamRow]) -> Iterator[str]:
    return table_lines(
        ("team", "strategy", *FIGURE_HEADER),
        ([row.name, row.strategy, *figure_cells(row.figures)] for row in rows),
    )


def rep_table_lines(rows: Iterable[RepRow]) -> Iterator[str]:
    return table_lines(
        (
            "rep",
            "email",
            "time zone",
            "active",
            "open now",
            "max open",
            "today (local day)",
            "max per day",
            *FIGURE_HEADER,
        ),
        (
            [
                row.name,
                row.email,
                row.timezone,
                "yes" if row.active else "no",
                row.open,
                row.max_open or "",
                row.today,
                row.max_per_day or "",
                *figure_cells(row.figures),
            ]
            for row in rows
        ),
    )


def fairness_table_lines(teams: Iterable[TeamFairness]) -> Iterator[str]:
    return table_lines(
        ("team", "strategy", "rep", "weight", "active", "leads", "share %", "target %", "gap"),
        (
            [
                team.team,
                team.strategy,
                member.rep,
                member.weight,
                "yes" if member.active else "no",
                member.leads,
                "" if member.share is None else member.share,
                "" if member.target is None else member.target,
                "" if member.gap is None else member.gap,
            ]
            for team in teams
            for member in team.members
        ),
    )
