"""Territories and accounts as CSV: import (validate everything, then write all or nothing) and
a streamed export that imports back to the same data (docs/revops.md, "Territories and accounts
as CSV").

Territories: ``territory,country,region,postal_prefix,team,rep``. Rows with the same
``territory`` build one territory: each row adds its country, region and/or postal prefix to
that territory's lists (in file order); ``team`` or ``rep`` (one of them) names its owner, on at
least one of its rows and the same on every row that names one. A territory in the file replaces
the stored one of that name wholesale; territories not in the file stay, unless
``delete_missing``.

Accounts: ``domain,name,owner_email,tier``, one row per account, upserted by domain; accounts
not in the file stay, unless ``delete_missing``.

Import is two steps so that a background job can report progress while it validates and still
write in one transaction: ``*_plan`` reads and checks every row (reads only, a few queries
whatever the size) and raises :class:`TableErrors` listing every problem as "row 17, column
owner_email: ...", or returns a plan; ``tables_apply`` writes a plan with bulk statements and
records a ``config_imported`` audit event. ``territories_import`` / ``accounts_import`` do both.
Row numbers are the file's lines as a spreadsheet numbers them: the header is row 1.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from django.db import transaction
from django.db.models.functions import Lower
from django.utils import timezone

from audit.csv import cell_safe
from audit.models import EventType
from audit.services import event_record
from routing.models import (
    POSTAL_PREFIX_MAX_LENGTH,
    REGION_MAX_LENGTH,
    Account,
    Rep,
    Team,
    Territory,
    countries_errors,
    domain_errors,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

TERRITORY_COLUMNS = ("territory", "country", "region", "postal_prefix", "team", "rep")
ACCOUNT_COLUMNS = ("domain", "name", "owner_email", "tier")
ERRORS_LISTED = 200  # at most this many problems are listed; the rest are counted
PROGRESS_EVERY = 2000  # rows checked between two progress reports
BATCH = 1000  # rows per bulk statement

Table = Literal["territories", "accounts"]
Progress = Callable[[int, int], None]  # (rows checked, rows in all)


class TableErrors(Exception):
    """The file was refused: every problem found (the first ``ERRORS_LISTED`` listed)."""

    def __init__(self, errors: Sequence[str], count: int | None = None) -> None:
        self.errors = tuple(errors[:ERRORS_LISTED])
        self.count = len(errors) if count is None else count
        super().__init__(f"{self.count} problem(s); nothing was written")

    @property
    def more(self) -> int:
        return self.count - len(self.errors)


@dataclass
class _Problems:
    found: list[tuple[int, str]] = field(default_factory=list)

    def add(self, row: int, column: str | None, message: str) -> None:
        where = f"row {row}, column {column}" if column else f"row {row}"
        self.found.append((row, f"{where}: {message}"))

    def raise_any(self) -> None:
        if self.found:
            self.found.sort(key=lambda found: found[0])  # stable: a row's problems in order
            raise TableErrors([message for _row, message in self.found])


# --- Cells --------------------------------------------------------------------------------------


def cell_out(value: Any) -> str:
    """A cell for export: formula-safe (``audit.csv.cell_safe``), and reversible by ``cell_in``.

    A value that already starts with an apostrophe gets one more, so that import can tell it
    from an apostrophe the export added.
    """
    text = cell_safe(value)
    if value is not None and text == str(value) and text.startswith("'"):
        return "'" + text
    return text


def cell_in(text: str) -> str:
    """An imported cell: trimmed, with the apostrophe ``cell_out`` adds taken off again."""
    text = text.strip()
    if text.startswith("'"):
        rest = text[1:]
        if rest.startswith("'") or cell_safe(rest) != rest:
            return rest
    return text


def _rows(
    content: str | bytes, columns: Sequence[str], problems: _Problems
) -> list[tuple[int, dict[str, str]]]:
    """The file's data rows as (row number, {column: cell}); header and shape problems noted."""
    if isinstance(content, bytes):
        try:
            content = content.decode("utf-8-sig")
        except UnicodeDecodeError:
            problems.add(1, None, "the file is not UTF-8 text (save it as CSV UTF-8)")
            return []
    content = content.removeprefix("\ufeff")
    reader = csv.reader(io.StringIO(content, newline=""))
    header: list[str] | None = None
    rows: list[tuple[int, dict[str, str]]] = []
    try:
        for cells in reader:
            number = reader.line_num
            if not any(cell.strip() for cell in cells):
                continue
            if header is None:
                header = [cell.strip().lower() for cell in cells]
                missing = [c for c in columns if c not in header]
                unknown = [c for c in header if c not in columns]
                repeated = sorted({c for c in header if header.count(c) > 1})
                if missing or unknown or repeated:
                    what = "; ".join(
                        filter(
                            None,
                            [
                                f"missing {', '.join(missing)}" if missing else "",
                                f"unknown {', '.join(unknown)}" if unknown else "",
                                f"repeated {', '.join(repeated)}" if repeated else "",
                            ],
                        )
                    )
                    problems.add(number, None, f"the header must be {','.join(columns)} ({what})")
                    return []
                continue
            if len(cells) != len(header):
                problems.add(
                    number, None, f"{len(cells)} cells, but the header has {len(header)} columns"
                )
                continue
            nul = [name for name, cell in zip(header, cells, strict=True) if "\x00" in cell]
            for name in nul:
                problems.add(number, name, "contains a NUL character (not text)")
            if nul:
                continue
            rows.append(
                (number, {name: cell_in(cell) for name, cell in zip(header, cells, strict=True)})
            )
    except csv.Error as exc:
        problems.add(reader.line_num, None, f"not valid CSV: {exc}")
    if header is None:
        problems.add(1, None, f"the file is empty: the header must be {','.join(columns)}")
    return rows


def _checked(rows: Sequence[Any], progress: Progress | None) -> Iterator[Any]:
    for i, row in enumerate(rows, start=1):
        yield row
        if progress is not None and (i % PROGRESS_EVERY == 0 or i == len(rows)):
            progress(i, len(rows))


def _too_long(problems: _Problems, row: int, column: str, value: str, limit: int) -> bool:
    if len(value) > limit:
        problems.add(row, column, f"at most {limit} characters, got {len(value)}")
        return True
    return False


def _rep_ids() -> dict[str, int]:
    return dict(Rep.objects.annotate(key=Lower("email")).values_list("key", "id"))


@dataclass(frozen=True)
class Owners:
    """What a file's owners are resolved against: teams by name and reps by lower-cased
    e-mail, each to an id; ``where`` ends the "no such" messages (" in the draft")."""

    teams: Mapping[str, int]
    reps: Mapping[str, int]
    where: str = ""


def live_owners() -> Owners:
    """The live tables' teams and reps: what an import into the live tables resolves."""
    return Owners(teams=dict(Team.objects.values_list("name", "id")), reps=_rep_ids())


# --- Plans --------------------------------------------------------------------------------------


@dataclass
class _TerritoryEntry:
    name: str
    first_row: int
    countries: list[str] = field(default_factory=list)
    regions: list[str] = field(default_factory=list)
    postal_prefixes: list[str] = field(default_factory=list)
    team_id: int | None = None
    rep_id: int | None = None
    owner: tuple[str, str] | None = None  # ("team", name) or ("rep", e-mail), for messages
    owner_row: int = 0
    seen: dict[tuple[str, str], int] = field(default_factory=dict)  # (column, value) -> row
    bad_country: bool = False


@dataclass(frozen=True)
class TablePlan:
    """A checked file, ready to write: the entries, and how many data rows the file had."""

    table: Table
    rows: int
    entries: tuple[Any, ...]
    delete_missing: bool


@dataclass(frozen=True)
class TableReport:
    """What an import wrote."""

    table: Table
    rows: int
    created: int
    updated: int
    unchanged: int
    deleted: int

    def as_data(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "rows": self.rows,
            "created": self.created,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "deleted": self.deleted,
        }


def territories_plan(
    content: str | bytes,
    *,
    delete_missing: bool = False,
    progress: Progress | None = None,
    owners: Owners | None = None,
) -> TablePlan:
    """Check a territories CSV; raises TableErrors with every problem, row by row. Owners
    are resolved against ``owners`` (a draft's), by default the live tables'."""
    problems = _Problems()
    rows = _rows(content, TERRITORY_COLUMNS, problems)
    owners = live_owners() if owners is None else owners
    teams, reps = owners.teams, owners.reps
    entries: dict[str, _TerritoryEntry] = {}
    for number, cells in _checked(rows, progress):
        name = cells["territory"]
        if not name:
            problems.add(number, "territory", "required (the territory's name)")
            continue
        if _too_long(problems, number, "territory", name, 200):
            continue
        entry = entries.setdefault(name, _TerritoryEntry(name=name, first_row=number))
        country, region = cells["country"].upper(), cells["region"].upper()
        prefix = cells["postal_prefix"].upper()
        if not (country or region or prefix):
            problems.add(number, None, "give a country, a region or a postal prefix")
        for column, value, target in (
            ("country", country, entry.countries),
            ("region", region, entry.regions),
            ("postal_prefix", prefix, entry.postal_prefixes),
        ):
            if not value:
                continue
            if column == "country" and countries_errors([value]):
                problems.add(
                    number, column, f'unknown country code "{value}" (ISO 3166-1 alpha-2, e.g. DE)'
                )
                entry.bad_country = True
                continue
            limit = REGION_MAX_LENGTH if column == "region" else POSTAL_PREFIX_MAX_LENGTH
            if column != "country" and _too_long(problems, number, column, value, limit):
                continue
            earlier = entry.seen.get((column, value))
            if earlier is not None:
                problems.add(
                    number, column, f'{value} is already listed for "{name}" in row {earlier}'
                )
                continue
            entry.seen[(column, value)] = number
            target.append(value)
        team, rep = cells["team"], cells["rep"].lower()
        if team and rep:
            problems.add(number, "rep", "give a team or a rep, not both")
            continue
        owner = ("team", team) if team else ("rep", rep) if rep else None
        if owner is None:
            continue
        if entry.owner is not None:
            if owner != entry.owner:
                problems.add(
                    number,
                    owner[0],
                    f'"{name}" belongs to {entry.owner[0]} {entry.owner[1]} (row '
                    f"{entry.owner_row}); a territory has one owner",
                )
            continue
        if team and team not in teams:
            problems.add(number, "team", f'no team named "{team}"{owners.where}')
        elif rep and rep not in reps:
            problems.add(number, "rep", f"no rep with e-mail {rep}{owners.where}")
        entry.owner, entry.owner_row = owner, number
        entry.team_id = teams.get(team) if team else None
        entry.rep_id = reps.get(rep) if rep else None
    for entry in entries.values():
        if entry.owner is None:
            problems.add(entry.first_row, "team", f'"{entry.name}" has no team or rep on any row')
        if not entry.countries and not entry.bad_country:  # a bad code is reported already
            problems.add(entry.first_row, "country", f'"{entry.name}" lists no country')
    problems.raise_any()
    return TablePlan(
        table="territories",
        rows=len(rows),
        entries=tuple(entries.values()),
        delete_missing=delete_missing,
    )


@dataclass(frozen=True)
class _AccountEntry:
    domain: str
    name: str
    owner_id: int | None
    tier: str


def accounts_plan(
    content: str | bytes,
    *,
    delete_missing: bool = False,
    progress: Progress | None = None,
    owners: Owners | None = None,
) -> TablePlan:
    """Check an accounts CSV; raises TableErrors with every problem, row by row. Owners are
    resolved against ``owners`` (a draft's), by default the live tables'."""
    problems = _Problems()
    rows = _rows(content, ACCOUNT_COLUMNS, problems)
    where = owners.where if owners is not None else ""
    reps = owners.reps if owners is not None else _rep_ids()
    seen: dict[str, int] = {}
    entries: list[_AccountEntry] = []
    for number, cells in _checked(rows, progress):
        domain, owner = cells["domain"].lower(), cells["owner_email"].lower()
        ok = True
        if not domain:
            problems.add(number, "domain", "required")
            ok = False
        elif domain_errors(domain):
            problems.add(number, "domain", f'not a domain such as acme.com: "{domain}"')
            ok = False
        elif domain in seen:
            problems.add(number, "domain", f"{domain} is already in row {seen[domain]}")
            ok = False
        else:
            seen[domain] = number
        ok &= not _too_long(problems, number, "name", cells["name"], 200)
        ok &= not _too_long(problems, number, "tier", cells["tier"], 64)
        if owner and owner not in reps:
            problems.add(number, "owner_email", f"no rep with e-mail {owner}{where}")
            ok = False
        if ok:
            entries.append(
                _AccountEntry(
                    domain=domain, name=cells["name"], owner_id=reps.get(owner), tier=cells["tier"]
                )
            )
    problems.raise_any()
    return TablePlan(
        table="accounts", rows=len(rows), entries=tuple(entries), delete_missing=delete_missing
    )


# --- Writing ------------------------------------------------------------------------------------


def _delete(model: Any, ids: Sequence[int]) -> int:
    for start in range(0, len(ids), BATCH):
        model.objects.filter(pk__in=ids[start : start + BATCH]).delete()
    return len(ids)


def _upsert(model: Any, rows: list[Any], key: str, fields: Sequence[str]) -> None:
    """Insert new rows and update changed ones by their natural key, a batch per statement.

    An updated row keeps its id (a territory's id is its tie-break order) and created_at.
    """
    model.objects.bulk_create(
        rows,
        batch_size=BATCH,
        update_conflicts=True,
        unique_fields=[key],
        update_fields=[*fields, "updated_at"],
    )


def _apply_territories(plan: TablePlan) -> TableReport:
    stored: dict[str, dict[str, Any]] = {
        row["name"]: dict(row)
        for row in Territory.objects.values(
            "id", "name", "countries", "regions", "postal_prefixes", "team_id", "rep_id"
        )
    }
    now = timezone.now()
    upsert: list[Territory] = []
    created = 0
    for entry in plan.entries:
        values = {
            "countries": entry.countries,
            "regions": entry.regions,
            "postal_prefixes": entry.postal_prefixes,
            "team_id": entry.team_id,
            "rep_id": entry.rep_id,
        }
        old = stored.get(entry.name)
        if old is None or any(old[key] != value for key, value in values.items()):
            created += old is None
            upsert.append(Territory(name=entry.name, created_at=now, updated_at=now, **values))
    _upsert(Territory, upsert, "name", ["countries", "regions", "postal_prefixes", "team", "rep"])
    named = {entry.name for entry in plan.entries}
    deleted = (
        _delete(Territory, [row["id"] for name, row in stored.items() if name not in named])
        if plan.delete_missing
        else 0
    )
    return TableReport(
        table="territories",
        rows=plan.rows,
        created=created,
        updated=len(upsert) - created,
        unchanged=len(plan.entries) - len(upsert),
        deleted=deleted,
    )


def _apply_accounts(plan: TablePlan) -> TableReport:
    stored = {
        row[0]: row
        for row in Account.objects.values_list("domain", "name", "owner_id", "tier", "id")
    }
    now = timezone.now()
    upsert: list[Account] = []
    created = 0
    for entry in plan.entries:
        old = stored.get(entry.domain)
        if old is None or old[1:4] != (entry.name, entry.owner_id, entry.tier):
            created += old is None
            upsert.append(
                Account(
                    domain=entry.domain,
                    name=entry.name,
                    owner_id=entry.owner_id,
                    tier=entry.tier,
                    created_at=now,
                    updated_at=now,
                )
            )
    _upsert(Account, upsert, "domain", ["name", "owner", "tier"])
    named = {entry.domain for entry in plan.entries}
    deleted = (
        _delete(Account, [row[4] for domain, row in stored.items() if domain not in named])
        if plan.delete_missing
        else 0
    )
    return TableReport(
        table="accounts",
        rows=plan.rows,
        created=created,
        updated=len(upsert) - created,
        unchanged=len(plan.entries) - len(upsert),
        deleted=deleted,
    )


@transaction.atomic
def tables_apply(
    *,
    plan: TablePlan,
    actor: AbstractBaseUser | None = None,
    file_name: str = "",
    test_cases: bool = False,
    force: bool = False,
) -> TableReport:
    """Write a checked plan in bulk, in one transaction, with its ``config_imported`` event.

    Territory writes bump the routing configuration version (database triggers), so workers
    pick them up for the next lead. A configuration version too (``routing.drafts.live``),
    under the configuration lock: ConfigurationBusy when another publish, import or replay
    keeps it past ``LOCK_WAIT_SECONDS``. With ``test_cases`` (the admin's import), the saved
    test cases run against the configuration it leaves: TestCasesFailing, nothing written, when
    one fails, unless ``force`` (the version then names the cases).
    """
    # routing.drafts.live stands above this module (routing.drafts.services imports it).
    from routing.configuration import LOCK_WAIT_SECONDS
    from routing.drafts.live import config_live_change

    label = f"user:{actor.get_username()}" if actor is not None else "system"
    with config_live_change(
        actor=label,
        user=actor,
        what=f"a CSV import of {plan.table} {file_name}".strip()[:200],
        wait_seconds=LOCK_WAIT_SECONDS,
        test_cases=test_cases,
        force=force,
    ):
        report = _apply_territories(plan) if plan.table == "territories" else _apply_accounts(plan)
        event_record(
            type=EventType.CONFIG_IMPORTED,
            actor=label,
            data={
                **report.as_data(),
                "file": file_name[:200],
                "delete_missing": plan.delete_missing,
            },
        )
    return report


def tables_plan(
    *,
    table: Table,
    content: str | bytes,
    delete_missing: bool = False,
    progress: Progress | None = None,
    owners: Owners | None = None,
) -> TablePlan:
    """``territories_plan`` or ``accounts_plan``, by name."""
    check = territories_plan if table == "territories" else accounts_plan
    return check(content, delete_missing=delete_missing, progress=progress, owners=owners)


def tables_import(
    *,
    table: Table,
    content: str | bytes,
    actor: AbstractBaseUser | None = None,
    file_name: str = "",
    delete_missing: bool = False,
    test_cases: bool = False,
    force: bool = False,
) -> TableReport:
    """Check a whole CSV file and write it, or raise TableErrors and write nothing
    (``test_cases``, ``force``: see ``tables_apply``)."""
    plan = tables_plan(table=table, content=content, delete_missing=delete_missing)
    return tables_apply(
        plan=plan, actor=actor, file_name=file_name, test_cases=test_cases, force=force
    )


def csv_data_rows(content: str | bytes) -> int:
    """Roughly how many data rows a file has (its lines less the header), to choose a path."""
    if isinstance(content, bytes):
        return max(0, content.count(b"\n") + (not content.endswith(b"\n")) - 1)
    return max(0, content.count("\n") + (not content.endswith("\n")) - 1)


# --- Export -------------------------------------------------------------------------------------


class _Echo:
    def write(self, value: str) -> str:
        return value


def _lines(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(columns)
    for row in rows:
        yield writer.writerow([cell_out(value) for value in row])


def territories_export_lines() -> Iterator[str]:
    """The territories CSV (by id, their tie-break order): one entry per row, owner on each."""
    teams = dict(Team.objects.values_list("id", "name"))
    emails = dict(Rep.objects.values_list("id", "email"))

    def rows() -> Iterator[tuple[str, ...]]:
        for territory in Territory.objects.order_by("id").iterator(chunk_size=BATCH):
            team = teams.get(territory.team_id, "") if territory.team_id else ""
            rep = emails.get(territory.rep_id, "") if territory.rep_id else ""
            name = territory.name
            for country in territory.countries:
                yield (name, country, "", "", team, rep)
            for region in territory.regions:
                yield (name, "", region, "", team, rep)
            for prefix in territory.postal_prefixes:
                yield (name, "", "", prefix, team, rep)

    return _lines(TERRITORY_COLUMNS, rows())


def accounts_export_lines() -> Iterator[str]:
    """The accounts CSV, by domain."""
    emails = dict(Rep.objects.values_list("id", "email"))

    def rows() -> Iterator[tuple[str, ...]]:
        for account in Account.objects.order_by("domain").iterator(chunk_size=BATCH):
            owner = emails.get(account.owner_id, "") if account.owner_id else ""
            yield (account.domain, account.name, owner, account.tier)

    return _lines(ACCOUNT_COLUMNS, rows())
