"""Routing a lead with the live ruleset: gather the state, ask the engine, apply under locks.

- ``lead_facts(lead)``: what the engine knows of a stored lead (one query: the account match).
- ``live_config(version=None)``: the compiled ruleset, teams and territory index, cached per
  process and keyed by the ruleset and a cheap fingerprint of the configuration tables (one
  query per call), so a publish or an edit takes effect for the next lead without a restart.
- ``route_lead(lead=...)``: decides with a fresh snapshot of the reps (one query: their rows
  joined to their load counters, ``routing.loads``; no assignment is counted) and the teams'
  turns (one query), then applies the decision in one transaction: the team row locked while
  its turn is read and moved, the chosen rep's row locked while its caps are re-checked against
  its counter row, the assignment inserted (constraints forbid a second one) and the counters
  moved. The number of queries does not depend on the number of rules, reps, territories or
  open leads.
- ``simulate(lead_data=..., source_slug=..., version=...)``: the same decision, read-only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any, TypeVar, cast

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Model, QuerySet, TextField
from django.db.models.expressions import RawSQL
from django.utils import timezone

from leads.models import CANONICAL_COLUMNS, Lead, LeadStatus, Source
from leads.normalize import FLAG_FREE_EMAIL, FLAG_INVALID_EMAIL, is_free_email_domain, normalize
from leads.priority import priority_clean, tags_clean
from leads.services import lead_tags_set
from leads.sources import source_flatten
from routing.crm.facts import crm_account
from routing.engine import (
    AccountFacts,
    CompiledRuleset,
    Decision,
    LeadFacts,
    RepState,
    RotationState,
    RuleErrors,
    TeamSpec,
    TerritoryIndex,
    TerritorySpec,
    WorkingHours,
    compile_ruleset,
    decide,
    rep_is_eligible,
)
from routing.engine.ruleset import RepAction
from routing.engine.sla import sla_due_at
from routing.engine.types import STRATEGIES, Strategy
from routing.loads import (
    LOAD_COLUMNS,
    load_assigned,
    load_counts,
    load_from_row,
    load_locked,
    load_released,
    local_midnight,
)
from routing.models import (
    Account,
    Assignment,
    AssignmentKind,
    Rep,
    RepLoad,
    Rule,
    RuleSet,
    RuleSetStatus,
    Team,
    TeamMembership,
    Territory,
    ValueList,
)
from routing.timeoff.facts import TimeOffByRep, rep_time_off, time_off_facts

logger = logging.getLogger(__name__)

__all__ = [
    "LiveConfig",
    "RouteResult",
    "RoutingContention",
    "RulesetNotFound",
    "Simulation",
    "SourceNotFound",
    "account_for_domain",
    "assignment_first_touch",
    "clear_live_config_cache",
    "config_compile",
    "lead_facts",
    "live_config",
    "local_midnight",
    "route_lead",
    "simulate",
    "simulate_with",
    "sla_clocks_refresh",
]

# How many times route_lead re-decides under its locks before giving up (each retry means a
# concurrent worker changed a turn or filled a cap between the snapshot and the lock).
_MAX_ATTEMPTS = 8


class RulesetNotFound(LookupError):
    """No published ruleset (or no such version)."""


class SourceNotFound(LookupError):
    """A simulation named a source that does not exist."""


class RoutingContention(RuntimeError):
    """The decision kept changing under concurrent workers; the caller retries the lead."""


# --- Lead facts --------------------------------------------------------------------------------

_FACT_FIELDS = CANONICAL_COLUMNS  # exactly what the worker stored on the lead


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _domain_candidates(domain: str) -> list[str]:
    """``a.b.acme.com`` -> the domain and each parent with at least two labels."""
    labels = [label for label in domain.strip().strip(".").lower().split(".") if label]
    return [".".join(labels[i:]) for i in range(len(labels) - 1)]


def account_for_domain(
    domain: str | None, accounts: Mapping[str, AccountFacts] | None = None
) -> AccountFacts | None:
    """The account whose domain is ``domain`` or its nearest parent (one query, or none).

    ``accounts`` (domain -> account), when given, is looked in instead of the table: a
    configuration document's accounts (``routing.configuration``).
    """
    candidates = _domain_candidates(domain) if domain else []
    if not candidates:
        return None
    if accounts is not None:
        return next((accounts[c] for c in candidates if c in accounts), None)
    rows = list(
        Account.objects.filter(domain__in=candidates).values("domain", "name", "tier", "owner_id")
    )
    if not rows:
        return None
    best = max(rows, key=lambda row: len(row["domain"]))  # the most specific
    return AccountFacts(
        name=best["name"] or None,
        tier=best["tier"] or None,
        domain=best["domain"],
        owner_rep_id=best["owner_id"],
    )


def _facts(
    fields: Mapping[str, Any],
    custom: Mapping[str, Any],
    source: str | None,
    free: bool,
    accounts: Mapping[str, AccountFacts] | None = None,
) -> LeadFacts:
    clean = {
        name: _plain(value) for name, value in fields.items() if value is not None and value != ""
    }
    domain = clean.get("domain") or clean.get("email_domain")
    return LeadFacts(
        fields=clean,
        custom=dict(custom) if isinstance(custom, Mapping) else {},
        source=source,
        is_free_email=free,
        account=account_for_domain(domain if isinstance(domain, str) else None, accounts),
    )


def lead_facts(lead: Lead, *, accounts: Mapping[str, AccountFacts] | None = None) -> LeadFacts:
    """The engine's view of a stored (normalised) lead; one query for the account match.

    The source slug is read through ``lead.source`` (select it with the lead to save a query).
    A CRM company's owner found by the lead's CRM lookup is the account's owner. ``accounts``:
    see ``account_for_domain``.
    """
    email_domain = lead.email_domain or ""
    free = FLAG_FREE_EMAIL in (lead.flags or []) or (
        bool(email_domain) and is_free_email_domain(email_domain)
    )
    facts = _facts(
        {name: getattr(lead, name) for name in _FACT_FIELDS},
        lead.custom or {},
        lead.source.slug if lead.source_id is not None else None,
        free,
        accounts,
    )
    if lead.crm:
        # What a CRM lookup found (stored on the lead: replay reads the same answer).
        facts = replace(facts, account=crm_account(lead, facts.account))
    return facts


# --- One configuration version per lead ---------------------------------------------------------

# Each lead's routing transaction holds this advisory lock shared (taken by the statement that
# claims the lead, so it costs no round trip); a publish of the whole configuration holds it
# exclusively from before its first write to its commit (``routing.configuration``). So every
# statement a lead's decision reads (the live configuration, the reps, the turns) sees one
# configuration version: the one before the publish, or the one after it, never a mix.
DECIDE_LOCK = "routing:decide"
_M = TypeVar("_M", bound=Model)


def decide_lock_shared_sql() -> tuple[str, list[str]] | None:
    """The SQL expression that takes the decide lock shared (PostgreSQL), for a claim's select
    list; None on SQLite, which lets one writer at a time in any case."""
    if connection.vendor != "postgresql":
        return None
    return "pg_advisory_xact_lock_shared(hashtextextended(%s, 0))", [DECIDE_LOCK]


def decide_locked(queryset: QuerySet[_M]) -> QuerySet[_M]:
    """``queryset`` (a lead's row lock) whose statement also takes the decide lock shared, so
    that everything the rest of the transaction reads of the configuration is one version:
    every path that decides, reassigns or sends a lead to be routed again (the claim, a
    reassignment by hand or for a missed SLA, a rep's leads moved when they became
    unavailable, a re-route, an unassigned retry) locks its lead with it. Unchanged on SQLite.
    """
    lock = decide_lock_shared_sql()
    if lock is None:
        return queryset
    sql, params = lock
    locked = queryset.annotate(
        _decide_lock=RawSQL(sql, params, output_field=TextField())  # noqa: S611 - constant
    )
    return cast("QuerySet[_M]", locked)


# --- The live configuration, compiled and cached ------------------------------------------------


@dataclass(frozen=True, slots=True)
class LiveConfig:
    """A compiled ruleset with the teams and territories it routes to."""

    ruleset_id: int
    version: int
    status: str
    ruleset: CompiledRuleset
    teams: Mapping[int, TeamSpec]
    territories: TerritoryIndex
    rep_action_ignores_caps: Mapping[int, bool]  # rule id -> a rep action's ignore_caps
    broken_rules: tuple[str, ...] = ()  # rules skipped because they no longer compile
    # rep id -> every (team id, index in its members) the rep holds: the snapshot reads a
    # rep's turn and the members after it together (``_Reps``). Built once per configuration.
    rep_places: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)


_cache_lock = threading.Lock()
_cache: dict[tuple[Any, ...], LiveConfig] = {}
_CACHE_SIZE = 4


def clear_live_config_cache() -> None:
    """Forget every compiled configuration (tests; normally the fingerprint handles it)."""
    with _cache_lock:
        _cache.clear()


def _fingerprint(version: int | None) -> tuple[Any, ...] | None:
    """(ruleset id, version, status, configuration version) in one small query.

    The configuration version is bumped by database triggers on every change of what the
    compiled configuration holds (``routing.config_triggers``), so this costs the same whatever
    the size of the territory table.
    """
    sql = (
        "SELECT r.id, r.version, r.status, "
        "(SELECT c.version FROM routing_configversion c WHERE c.id = 1) "
        "FROM routing_ruleset r WHERE "
    )
    if version is None:
        sql += "r.status = %s"
        params: list[Any] = [RuleSetStatus.PUBLISHED.value]
    else:
        sql += "r.version = %s"
        params = [version]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return tuple(row) if row is not None else None


def _working_hours(data: Any) -> WorkingHours | None:
    if not isinstance(data, dict):
        return None
    try:
        start = time.fromisoformat(data["start"])
        end = time.fromisoformat(data["end"])
        days = frozenset(int(day) for day in data["days"])
    except (KeyError, TypeError, ValueError):
        return None
    return WorkingHours(days=days, start=start, end=end)


def _strategy(value: str) -> Strategy:
    for strategy in STRATEGIES:
        if strategy == value:
            return strategy
    return "round_robin"  # a check constraint keeps the column to the three strategies


def _compile_what_still_compiles(
    data: dict[str, Any],
    *,
    value_lists: Mapping[str, Any],
    known_teams: Mapping[str, int],
    known_reps: Mapping[str, int],
) -> tuple[CompiledRuleset, tuple[str, ...]]:
    """Compile the ruleset; if a rule no longer compiles, route with the others.

    A published version compiled when it was published, but a team, rep or value list it names
    may have been renamed or deleted since. Failing every lead for that would stop routing
    altogether; instead the broken rules are skipped (their leads fall through to later rules)
    and logged as errors on every compile.
    """
    refs: dict[str, Any] = {
        "value_lists": value_lists,
        "known_teams": known_teams,
        "known_reps": known_reps,
    }
    try:
        return compile_ruleset(data, **refs), ()
    except RuleErrors as whole:
        good: list[Any] = []
        broken: list[str] = []
        for rule in data["rules"]:
            try:
                compile_ruleset({**data, "rules": [rule]}, **refs)
            except RuleErrors as error:
                broken.append(f"{rule.get('name')!s}: {error}")
            else:
                good.append(rule)
        try:
            compiled = compile_ruleset({**data, "rules": good}, **refs)
        except RuleErrors:
            raise whole from None
        logger.error(
            "ruleset v%s: %d rule(s) no longer compile and are skipped until fixed: %s",
            data.get("version"),
            len(broken),
            "; ".join(broken),
        )
        return compiled, tuple(broken)


def _load_config(ruleset_id: int, version: int, status: str) -> LiveConfig:
    """Compile a ruleset against today's teams, reps, lists and territories (fixed queries)."""
    rules = list(Rule.objects.filter(ruleset_id=ruleset_id).order_by("priority"))
    name = RuleSet.objects.filter(pk=ruleset_id).values_list("name", flat=True).first() or ""
    teams = list(
        Team.objects.order_by("id").values(
            "id", "name", "strategy", "respect_working_hours", "sla_minutes"
        )
    )
    memberships: dict[int, list[tuple[int, int]]] = {}
    for team_id, rep_id, weight in TeamMembership.objects.order_by(
        "team_id", "position", "id"
    ).values_list("team_id", "rep_id", "weight"):
        memberships.setdefault(team_id, []).append((rep_id, weight))
    return config_compile(
        ruleset_id=ruleset_id,
        version=version,
        status=status,
        name=name,
        rules=[{"id": rule.id, **rule.to_data()} for rule in rules],
        teams=teams,
        memberships=memberships,
        rep_ids=dict(Rep.objects.values_list("email", "id")),
        value_lists=dict(ValueList.objects.values_list("name", "values")),
        territories=Territory.objects.values(
            "id", "name", "countries", "regions", "postal_prefixes", "team_id", "rep_id"
        ),
    )


def config_compile(
    *,
    ruleset_id: int,
    version: int,
    status: str,
    name: str,
    rules: Sequence[Mapping[str, Any]],
    teams: Sequence[Mapping[str, Any]],
    memberships: Mapping[int, Sequence[tuple[int, int]]],
    rep_ids: Mapping[str, int],
    value_lists: Mapping[str, Any],
    territories: Iterable[Mapping[str, Any]],
) -> LiveConfig:
    """A LiveConfig from plain rows: the tables' (``_load_config``) or a configuration
    document's (``routing.configuration``), so both decide with the same construction.

    ``rules`` in the rules-as-code shape, each with an ``id``; ``teams`` rows with ``id``,
    ``name``, ``strategy``, ``respect_working_hours`` and ``sla_minutes``; ``memberships``
    team id -> (rep id, weight) in rotation order; ``rep_ids`` e-mail -> id; ``territories``
    rows with ``id``, ``name``, ``countries``, ``regions``, ``postal_prefixes``, ``team_id``
    and ``rep_id``.
    """
    compiled, broken = _compile_what_still_compiles(
        {"name": name, "version": version, "rules": [dict(rule) for rule in rules]},
        value_lists=value_lists,
        known_teams={team["name"]: team["id"] for team in teams},
        known_reps=rep_ids,
    )
    team_specs = {
        team["id"]: TeamSpec(
            id=team["id"],
            name=team["name"],
            strategy=_strategy(team["strategy"]),
            respect_working_hours=team["respect_working_hours"],
            sla_minutes=team["sla_minutes"],
            members=tuple(memberships.get(team["id"], ())),
        )
        for team in teams
    }
    territory_index = TerritoryIndex(
        TerritorySpec(
            id=row["id"],
            name=row["name"],
            countries=tuple(row["countries"] or ()),
            regions=tuple(row["regions"] or ()),
            postal_prefixes=tuple(row["postal_prefixes"] or ()),
            team_id=row["team_id"],
            rep_id=row["rep_id"],
        )
        for row in territories
    )
    places: dict[int, tuple[tuple[int, int], ...]] = {}
    for team_id, spec in team_specs.items():
        for index, (rep_id, _weight) in enumerate(spec.members):
            places[rep_id] = (*places.get(rep_id, ()), (team_id, index))
    ignores = {
        rule.id: rule.action.ignore_caps
        for rule in compiled.rules
        if rule.id is not None and isinstance(rule.action, RepAction)
    }
    return LiveConfig(
        ruleset_id=ruleset_id,
        version=version,
        status=status,
        ruleset=compiled,
        teams=team_specs,
        territories=territory_index,
        rep_action_ignores_caps=ignores,
        broken_rules=broken,
        rep_places=places,
    )


def live_config(version: int | None = None) -> LiveConfig:
    """The published ruleset (or ``version``) compiled, from the cache when nothing changed.

    One query per call (the fingerprint); a miss compiles anew (a fixed handful of queries).
    Drafts are never cached (their rules may change without touching the fingerprint).
    Raises RulesetNotFound, or RuleErrors when the rules no longer compile.
    """
    stamp = _fingerprint(version)
    if stamp is None:
        raise RulesetNotFound(
            "No ruleset is published." if version is None else f"No ruleset version {version}."
        )
    ruleset_id, found_version, status = stamp[0], stamp[1], stamp[2]
    key = (connection.alias, *stamp)
    if status != RuleSetStatus.DRAFT:
        with _cache_lock:
            cached = _cache.get(key)
        if cached is not None:
            return cached
    config = _load_config(ruleset_id, found_version, status)
    if status != RuleSetStatus.DRAFT:
        with _cache_lock:
            if len(_cache) >= _CACHE_SIZE:
                _cache.clear()
            _cache[key] = config
    return config


# --- The reps' and teams' state ----------------------------------------------------------------


_REP_COLUMNS = (
    "id",
    "email",
    "name",
    "active",
    "out_of_office_until",
    "timezone",
    "working_hours",
    "max_open",
    "max_per_day",
    "last_assigned_at",
)


def _rep_state(row: Mapping[str, Any], open_count: int, assigned_today: int) -> RepState:
    return RepState(
        id=row["id"],
        email=row["email"],
        name=row["name"],
        active=row["active"],
        out_of_office_until=row["out_of_office_until"],
        timezone=row["timezone"] or "UTC",
        working_hours=_working_hours(row["working_hours"]),
        max_open=row["max_open"],
        max_per_day=row["max_per_day"],
        open_count=open_count,
        assigned_today=assigned_today,
        last_assigned_at=row["last_assigned_at"],
    )


@dataclass(slots=True)
class _Snapshot:
    """Every rep (``_snapshot``): for a batch, a replay, a configuration check."""

    reps: dict[int, RepState]
    rotation: dict[int, RotationState] = field(default_factory=dict)


@dataclass(slots=True)
class _DecisionSnapshot:
    """The reps one decision looks at, read on demand (``_decision_snapshot``)."""

    reps: MutableMapping[int, RepState]
    rotation: dict[int, RotationState] = field(default_factory=dict)
    time_off: Mapping[int, Any] = field(default_factory=dict)  # rep id -> RepTimeOff


_AnySnapshot = _Snapshot | _DecisionSnapshot


class _TeamMembers(Mapping[int, Iterable[int]]):
    """team id -> its members' rep ids, each team's worked out only when asked for (time off
    asks only for the teams a holiday calendar names)."""

    def __init__(self, config: LiveConfig) -> None:
        self._teams = config.teams

    def __getitem__(self, team_id: int) -> Iterable[int]:
        return [rep_id for rep_id, _weight in self._teams[team_id].members]

    def __iter__(self) -> Iterator[int]:
        return iter(self._teams)

    def __len__(self) -> int:
        return len(self._teams)


def _rotation() -> dict[int, RotationState]:
    return {
        team_id: RotationState.from_json(team_id, state)
        for team_id, state in Team.objects.order_by().values_list("id", "rotation_state")
    }


def _snapshot(config: LiveConfig, now: datetime) -> _Snapshot:
    """Every rep with its load counters (one query: a row a rep, whatever they hold), their
    time off (one query; two more when holiday calendars exist) and every team's turn (one
    query). A rep whose counters were kept in another time zone than theirs
    (just changed) has their day counted, one more query each (``routing.loads``).

    For a batch, a configuration check and the SLA sweep, which may read many reps; one
    decision reads only the reps it looks at (``_decision_snapshot``)."""
    reps = {}
    midnights: dict[str, datetime] = {}
    for row in Rep.objects.order_by().values(*_REP_COLUMNS, *LOAD_COLUMNS):
        zone_name = row["timezone"] or "UTC"
        load = load_from_row(row)
        open_count, today = load_counts(row["id"], zone_name, load, now, midnights)
        reps[row["id"]] = _rep_state(row, open_count, today)
    for rep_id, off in time_off_facts(now=now, team_members=_TeamMembers(config)).items():
        if rep_id in reps:
            reps[rep_id] = replace(reps[rep_id], absences=off.absences, holidays=off.holidays)
    return _Snapshot(reps=reps, rotation=_rotation())


# How many reps ``_Reps`` reads in one query: a rep and the members after it in its team's
# rotation, or a team's least loaded members.
REP_PAGE = 16


class _Reps(MutableMapping[int, RepState]):
    """The reps one decision looks at, read when it first looks at them, with their counters.

    A round robin's walk asks for the member after the turn: that member and the
    ``REP_PAGE - 1`` after it in each team the rep is in are read in one query, so a walk that
    finds an eligible member among them costs one query whatever the team's size. A least
    loaded team's members come from the database sorted by the strategy's key
    (``least_loaded_order``, PostgreSQL), a page at a time, so the walk stops at the first
    eligible one. Time off was read for every rep (one query, as the whole snapshot reads it).
    Iterating reads every rep. A rep set by the caller (its state under its lock, or after a
    batch's lead) replaces the one read and is ranked in the least-loaded order on that state,
    merged with the database's pages (``_least_loaded_merged``): still no read of every member.
    """

    def __init__(
        self,
        config: LiveConfig,
        now: datetime,
        time_off: Mapping[int, Any],
        extra: int = 0,
    ) -> None:
        self._config = config
        self._now = now
        self._time_off = time_off
        self._page_size = REP_PAGE + extra
        self._known: dict[int, RepState | None] = {}  # None: no such rep
        self._midnights: dict[str, datetime] = {}
        self._set: set[int] = set()  # reps the caller set (or deleted): ranked as set
        self._everyone = False
        # Per least-loaded team: its members as the database sorted them, the pages read so
        # far (a prefix of that order), and whether the last page was read.
        self._sorted: dict[int, tuple[list[tuple[tuple[Any, ...], int]], list[bool]]] = {}

    def _state(self, row: Mapping[str, Any]) -> RepState:
        zone_name = row["timezone"] or "UTC"
        load = load_from_row(row)
        open_count, today = load_counts(row["id"], zone_name, load, self._now, self._midnights)
        state = _rep_state(row, open_count, today)
        off = self._time_off.get(row["id"])
        if off is not None:
            state = replace(state, absences=off.absences, holidays=off.holidays)
        return state

    def _read(self, rep_ids: Iterable[int]) -> None:
        wanted = [rep_id for rep_id in dict.fromkeys(rep_ids) if rep_id not in self._known]
        if not wanted:
            return
        rows = Rep.objects.filter(pk__in=wanted).order_by().values(*_REP_COLUMNS, *LOAD_COLUMNS)
        for row in rows:
            self._known.setdefault(row["id"], self._state(row))
        for rep_id in wanted:
            self._known.setdefault(rep_id, None)

    def _page(self, rep_id: int) -> list[int]:
        """``rep_id`` and the members after it in each of its teams' rotation (wrapping)."""
        page = [rep_id]
        for team_id, index in self._config.rep_places.get(rep_id, ()):
            members = self._config.teams[team_id].members
            count = len(members)
            ahead = [
                members[(index + step) % count][0]
                for step in range(1, min(self._page_size, count))
                if members[(index + step) % count][0] not in self._known
            ]
            page += ahead
        return page

    def __getitem__(self, rep_id: int) -> RepState:
        if rep_id not in self._known and not self._everyone:
            self._read(self._page(rep_id))
        state = self._known.get(rep_id)
        if state is None:
            raise KeyError(rep_id)
        return state

    def __setitem__(self, rep_id: int, state: RepState) -> None:
        self._known[rep_id] = state
        self._set.add(rep_id)

    def __delitem__(self, rep_id: int) -> None:
        if self.get(rep_id) is None:
            raise KeyError(rep_id)
        self._known[rep_id] = None
        self._set.add(rep_id)

    def _read_everyone(self) -> None:
        if self._everyone:
            return
        for row in Rep.objects.order_by().values(*_REP_COLUMNS, *LOAD_COLUMNS):
            if row["id"] not in self._known:
                self._known[row["id"]] = self._state(row)
        self._everyone = True

    def __iter__(self) -> Iterator[int]:
        self._read_everyone()
        return iter([rep_id for rep_id, state in self._known.items() if state is not None])

    def __len__(self) -> int:
        self._read_everyone()
        return sum(1 for state in self._known.values() if state is not None)

    def least_loaded_order(self, team: TeamSpec) -> Iterable[int] | None:
        """``team``'s member indexes from the least loaded up (``LoadOrdered``)."""
        if connection.vendor != "postgresql":
            return self._least_loaded_in_memory(team)
        return self._least_loaded_merged(team)

    def _least_loaded_in_memory(self, team: TeamSpec) -> list[int]:
        self._read(rep_id for rep_id, _weight in team.members)
        return sorted(range(len(team.members)), key=lambda index: self._key(team, index))

    def _key(self, team: TeamSpec, index: int) -> tuple[Any, ...]:
        """The strategy's key of a member as known in memory."""
        rep = self._known.get(team.members[index][0])
        if rep is None:  # unknown: ineligible wherever it is; last, as listed
            return (2**62, True, _LAST, index)
        last = rep.last_assigned_at
        return (rep.open_count, last is not None, last or _NEVER, index)

    def _least_loaded_merged(self, team: TeamSpec) -> Iterator[int]:
        """The members sorted by the database (``_least_loaded_pages``, read a page at a time
        and kept for the next decision), merged with the members the caller set (a batch's
        reps after a lead, or as read under their locks), which are ranked on their state in
        memory: the order ``_least_loaded_in_memory`` gives, without reading every member."""
        places = self._config.rep_places
        own = sorted(
            self._key(team, index)
            for rep_id in self._set
            for team_id, index in places.get(rep_id, ())
            if team_id == team.id
        )
        mine = {key[-1] for key in own}
        rows, done = self._sorted.setdefault(team.id, ([], [False]))
        pages = self._least_loaded_pages(team, rows, done)
        given: set[int] = set()
        at = 0
        mine_at = 0
        while True:
            while at < len(rows) and rows[at][1] in mine:
                at += 1
            if at >= len(rows) and not done[0]:
                next(pages, None)
                continue
            db_key = rows[at][0] if at < len(rows) else None
            own_key = own[mine_at] if mine_at < len(own) else None
            if db_key is None and own_key is None:
                break
            if own_key is None or (db_key is not None and db_key < own_key):
                index = rows[at][1]
                at += 1
            else:
                index = own_key[-1]
                mine_at += 1
            if index not in given:
                given.add(index)
                yield index
        # Rows that moved between two pages (another worker changed them meanwhile) were
        # missed: every member once, as listed.
        for index in range(len(team.members)):
            if index not in given:
                yield index

    def _least_loaded_pages(
        self, team: TeamSpec, rows: list[tuple[tuple[Any, ...], int]], done: list[bool]
    ) -> Iterator[None]:
        """Read the next page of ``team``'s members sorted by the database on the strategy's
        key (the members as the configuration lists them, so indexes are the engine's) into
        ``rows``, a page each step. A member without a rep row comes last, as listed (the walk
        finds it unknown)."""
        ids = [rep_id for rep_id, _weight in team.members]
        columns = ", ".join(
            [f"r.{name}" for name in _REP_COLUMNS]
            + [f'l.{name.removeprefix("load__")} AS "{name}"' for name in LOAD_COLUMNS]
        )
        sql = (
            f"SELECT m.idx - 1 AS idx, {columns} "  # noqa: S608 - the model's own column names
            "FROM unnest(%s::bigint[]) WITH ORDINALITY AS m(rep_id, idx) "
            f"LEFT JOIN {Rep._meta.db_table} r ON r.id = m.rep_id "
            f"LEFT JOIN {RepLoad._meta.db_table} l ON l.rep_id = r.id "
            "ORDER BY r.id IS NULL, COALESCE(l.open_count, 0), r.last_assigned_at IS NOT NULL, "
            "r.last_assigned_at, m.idx LIMIT %s OFFSET %s"
        )
        page = self._page_size
        while not done[0]:
            with connection.cursor() as cursor:
                cursor.execute(sql, [ids, page, len(rows)])
                names = [column[0] for column in cursor.description]
                found = [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
            for row in found:
                index = row["idx"]
                rep_id = ids[index]
                if row["id"] is None:
                    key: tuple[Any, ...] = (2**62, True, _LAST, index)
                else:
                    last = row["last_assigned_at"]
                    key = (row["load__open_count"] or 0, last is not None, last or _NEVER, index)
                if rep_id not in self._known:
                    self._known[rep_id] = self._state(row) if row["id"] is not None else None
                rows.append((key, index))
            if len(found) < page or len(rows) >= len(ids):
                done[0] = True
            yield


_NEVER = datetime.min.replace(tzinfo=UTC)
_LAST = datetime.max.replace(tzinfo=UTC)


def _decision_snapshot(
    config: LiveConfig,
    now: datetime,
    *,
    extra: int = 0,
    again: _DecisionSnapshot | None = None,
) -> _DecisionSnapshot:
    """What one decision needs: the reps it looks at, read as it looks (``_Reps``: one query
    for a round robin whose turn or one of the next members is eligible, one for a least
    loaded team whose least loaded members include an eligible one), their time off (one
    query; two more when holiday calendars exist) and every team's turn (one query). Nothing
    here is read per member of a team. ``extra``: how many reps more than ``REP_PAGE`` a read
    takes (a batch reads as many more as it has leads, so its round robins read one page).
    ``again``: a snapshot whose time off and turns are taken as they are, the reps read anew."""
    if again is not None:
        time_off = again.time_off
        return _DecisionSnapshot(
            reps=_Reps(config, now, time_off, extra),
            rotation=dict(again.rotation),
            time_off=time_off,
        )
    places = config.rep_places
    time_off = TimeOffByRep(
        now=now, rep_teams=lambda rep_id: [team_id for team_id, _i in places.get(rep_id, ())]
    )
    return _DecisionSnapshot(
        reps=_Reps(config, now, time_off, extra), rotation=_rotation(), time_off=time_off
    )


def _decide(facts: LeadFacts, config: LiveConfig, snap: _AnySnapshot, now: datetime) -> Decision:
    return decide(
        facts, config.ruleset, snap.reps, config.teams, snap.rotation, config.territories, now
    )


# --- route_lead ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RouteResult:
    """What ``route_lead`` did: the decision, the lead's new status and the assignment."""

    decision: Decision
    status: str
    assignment: Assignment | None = None


class _Retry(Exception):
    """Roll back this attempt's savepoint (and its rep lock) and decide again."""


def _default_sla() -> int | None:
    value = getattr(settings, "DEFAULT_SLA_MINUTES", None)
    return value if isinstance(value, int) and value >= 1 else None


def _lock_team(team_id: int) -> RotationState:
    state = (
        Team.objects.select_for_update(no_key=True)
        .filter(pk=team_id)
        .values_list("rotation_state", flat=True)
        .first()
    )
    return RotationState.from_json(team_id, state)


def _lock_rep(config: LiveConfig, rep_id: int, now: datetime) -> RepState | None:
    """The rep's row locked, then its load counters read in a second statement.

    Two statements on purpose: under READ COMMITTED, a statement that waited for the lock sees
    the rep row as re-read after the wait, but a joined row from the snapshot taken before it;
    a worker that waited would miss the assignment just committed and exceed the cap. Every
    increment of the counters is made under this lock (``routing.loads``), so the second
    statement, which starts once the lock is held, sees every committed assignment to the rep.
    """
    row = Rep.objects.select_for_update(no_key=True).filter(pk=rep_id).values(*_REP_COLUMNS).first()
    if row is None:
        return None
    if row["max_open"] is None and row["max_per_day"] is None:
        # Under the lock the counts are only checked against caps (a least-loaded choice was
        # made on the counters read under the team's lock): without caps, nothing to read.
        return _rep_state(row, 0, 0)
    open_count, today = load_locked(rep_id, row["timezone"] or "UTC", now)
    return _rep_state(row, open_count, today)


# A full trace lists every rule considered: with thousands of rules that is megabytes per lead
# (measured in docs/benchmarks.md). Beyond this many entries, only the rules that matched are
# kept (the decision can be replayed from the lead's facts and the ruleset version).
STORED_TRACE_MAX_ENTRIES = 200


def stored_trace(decision: Decision, notes: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The trace to store with a decision: whole when small, else the matched rules.

    ``notes`` come first, as entries without a rule (e.g. "routed without enrichment").
    """
    head = [{"rule": None, "matched": False, "why": note} for note in notes]
    if len(decision.trace) <= STORED_TRACE_MAX_ENTRIES:
        return [*head, *(entry.to_json() for entry in decision.trace)]
    matched = [entry.to_json() for entry in decision.matched_trace()]
    skipped = len(decision.trace) - len(matched)
    return [
        *head,
        *matched,
        {"rule": None, "matched": False, "why": f"{skipped} other rules did not match"},
    ]


def _apply_owner(
    lead: Lead,
    decision: Decision,
    config: LiveConfig,
    snap: _AnySnapshot,
    now: datetime,
    notes: Sequence[str] = (),
    supersede: Assignment | None = None,
) -> Assignment:
    if decision.rep_id is None:
        raise ValueError("an owner decision without a rep")
    update = decision.rotation_update
    if update is not None:
        Team.objects.filter(pk=update.team_id).update(rotation_state=update.to_json())
    rep = snap.reps[decision.rep_id]
    team = config.teams.get(decision.team_id) if decision.team_id is not None else None
    sla = decision.sla_minutes or _default_sla()
    return assignment_create(
        lead=lead,
        rep_id=rep.id,
        rep_name=rep.name,
        team_id=team.id if team is not None else None,
        team_name=team.name if team is not None else "",
        rule_id=decision.rule_id,
        rule_name=decision.rule_name or "",
        ruleset_version=decision.ruleset_version,
        kind=AssignmentKind.INITIAL if supersede is None else AssignmentKind.REASSIGNMENT,
        supersede=supersede,
        reason=decision.reason,
        trace=stored_trace(decision, notes),
        sla_minutes=sla,
        sla_due=_sla_due(now, sla, rep, team),
        now=now,
        priority=decision.priority,
        tags=decision.tags,
    )


def assignment_sla_due(
    *, now: datetime, minutes: int | None, rep_id: int, team_id: int | None
) -> datetime | None:
    """The SLA due time of an assignment made outside a routing decision (a sticky duplicate,
    a reassignment): in the rep's working hours when the team respects them."""
    if not minutes:
        return None
    if team_id is not None and Team.objects.filter(pk=team_id, respect_working_hours=True).exists():
        row = Rep.objects.filter(pk=rep_id).values("working_hours", "timezone").first()
        if row is not None:
            hours = _working_hours(row["working_hours"])
            off = rep_time_off(rep_id=rep_id, now=now)
            return sla_due_at(
                now,
                minutes,
                hours,
                row["timezone"] or "UTC",
                holidays=off.holidays.keys(),
                absences=off.absences,
            )
    return now + timedelta(minutes=minutes)


def sla_clocks_refresh(
    *,
    rep_ids: Iterable[int],
    now: datetime | None = None,
    assignment_ids: Iterable[int] | None = None,
) -> int:
    """Work the running SLA clocks of ``rep_ids``' leads (only ``assignment_ids`` when given)
    out again from their assignment time, with the reps' working hours and time off as they
    are now; returns how many moved.

    A clock runs while its assignment is current, untouched, not breached and not yet due. Only
    a team that respects working hours pauses its clocks for time off (any other counts wall
    minutes, and its away rep's leads are re-routed instead), so only those are worked out
    again. Called when a rep's absences change (planned, changed, cancelled: by the admin, the
    roster API or an import) and, for holidays, by the SLA check before it calls a breach and
    by the SLA warning before it warns, so leave or a holiday planned after a lead was assigned
    pauses its clock (and moves its warning) as one known then did. The update re-checks the
    clock is still running, so a breach or first touch recorded meanwhile is never undone.
    """
    now = now or timezone.now()
    moved = 0
    running = Assignment.objects.all()
    if assignment_ids is not None:
        running = running.filter(pk__in=list(assignment_ids))
    for row in running.filter(
        rep_id__in=list(rep_ids),
        active=True,
        touched_at__isnull=True,
        sla_breached_at__isnull=True,
        sla_minutes__isnull=False,
        sla_due_at__gt=now,
        team__respect_working_hours=True,
    ).values("id", "assigned_at", "sla_minutes", "sla_due_at", "rep_id", "team_id"):
        due = assignment_sla_due(
            now=row["assigned_at"],
            minutes=row["sla_minutes"],
            rep_id=row["rep_id"],
            team_id=row["team_id"],
        )
        if due is not None and due != row["sla_due_at"]:
            moved += Assignment.objects.filter(
                pk=row["id"], active=True, touched_at__isnull=True, sla_breached_at__isnull=True
            ).update(sla_due_at=due)
    return moved


_COMPUTE: Any = object()  # assignment_create: work the SLA due time out from the rep and team


def assignment_create(
    *,
    lead: Lead,
    rep_id: int,
    rep_name: str,
    team_id: int | None,
    team_name: str,
    kind: str,
    reason: str,
    now: datetime,
    sla_minutes: int | None,
    sla_due: datetime | None = _COMPUTE,
    supersede: Assignment | None = None,
    rule_id: int | None = None,
    rule_name: str = "",
    ruleset_version: int | None = None,
    trace: list[dict[str, Any]] | None = None,
    priority: str | None = None,
    tags: Sequence[str] | None = None,
) -> Assignment:
    """Give ``lead`` to a rep: the one way an assignment is made (routing, sticky duplicates,
    manual and SLA reassignment). Call it in the transaction that holds the lead's lock.

    ``supersede`` (the lead's current assignment) stops being the active one; the rep's
    ``last_assigned_at`` moves to ``now``; names are kept as snapshot strings, so history reads
    right after renames. The SLA due time is computed in the rep's working hours when the team
    respects them, unless the caller passes one (``sla_due``) it already worked out.
    ``priority`` and ``tags`` are a routing decision's; without them (a duplicate, a
    reassignment) the assignment carries the lead's.

    The reps' load counters change in the same transaction (``routing.loads``): the rep's row
    is locked first (by the update of ``last_assigned_at``, unless the caller holds it), then
    the counter rows in rep id order.
    """
    zone_name = _rep_assigned_at(rep_id, now)
    released_rep_id: int | None = None
    if supersede is not None:
        # Untouched (read under the row lock the update takes, so a first touch committed
        # meanwhile is seen): its owner's open count goes down; touched, it was already.
        if Assignment.objects.filter(pk=supersede.pk, active=True, touched_at__isnull=True).update(
            active=False
        ):
            released_rep_id = supersede.rep_id
        else:
            Assignment.objects.filter(pk=supersede.pk).update(active=False)
        supersede.active = False
    if sla_due is _COMPUTE:
        sla_due = assignment_sla_due(now=now, minutes=sla_minutes, rep_id=rep_id, team_id=team_id)
    assignment = Assignment.objects.create(
        lead=lead,
        rep_id=rep_id,
        team_id=team_id,
        rule_id=rule_id,
        rule_name=rule_name[:200],
        rep_name=rep_name[:200],
        team_name=team_name[:200],
        ruleset_version=ruleset_version,
        kind=kind,
        supersedes=supersede,
        reason=reason,
        trace=trace or [],
        sla_minutes=sla_minutes,
        sla_due_at=sla_due,
        assigned_at=now,
        active=True,
        priority=priority_clean(lead.priority if priority is None else priority),
        tags=tags_clean((lead.tags or []) if tags is None else tags),
    )
    load_assigned(rep_id=rep_id, zone_name=zone_name, now=now, released_rep_id=released_rep_id)
    return assignment


def _rep_assigned_at(rep_id: int, now: datetime) -> str:
    """Move the rep's ``last_assigned_at`` to ``now`` (which locks the rep's row) and return
    the rep's time zone as read under that lock: one statement."""
    table = Rep._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET last_assigned_at = %s WHERE id = %s RETURNING timezone",  # noqa: S608
            [connection.ops.adapt_datetimefield_value(now), rep_id],
        )
        row = cursor.fetchone()
    return (row[0] if row is not None else None) or "UTC"


def assignment_first_touch(*, assignment: Assignment, at: datetime, source: str) -> bool:
    """Record the first touch of ``assignment`` at ``at`` (``source``: a ``TouchSource``): the
    one way a first touch is stored. False when it was touched or superseded meanwhile (the
    update re-reads the row under its lock), so two reports never count twice. The owner's
    open count goes down in the same transaction."""
    touched = Assignment.objects.filter(
        pk=assignment.pk, active=True, touched_at__isnull=True
    ).update(touched_at=at, touch_source=source)
    if not touched:
        return False
    assignment.touched_at = at
    assignment.touch_source = source
    load_released(assignment.rep_id)
    return True


def _sla_due(
    now: datetime, sla: int | None, rep: RepState, team: TeamSpec | None
) -> datetime | None:
    """The SLA's due time: in the rep's working hours when the team respects them."""
    if not sla:
        return None
    if team is not None and team.respect_working_hours:
        return sla_due_at(
            now,
            sla,
            rep.working_hours,
            rep.timezone,
            holidays=rep.holidays.keys(),
            absences=rep.absences,
        )
    return now + timedelta(minutes=sla)


def _try_owner(
    lead: Lead,
    decision: Decision,
    config: LiveConfig,
    snap: _AnySnapshot,
    now: datetime,
    notes: Sequence[str] = (),
    supersede: Assignment | None = None,
) -> Assignment:
    """Lock the chosen rep, re-check it with counts read under the lock, and assign.

    Runs inside a savepoint: ``_Retry`` rolls it back, which releases the rep's lock, so a
    worker never holds two reps' locks (no deadlock between reps).
    """
    if decision.rep_id is None:
        raise ValueError("an owner decision without a rep")
    fresh = _lock_rep(config, decision.rep_id, now)
    if fresh is None:
        raise _Retry
    seen = snap.reps.get(fresh.id)
    if seen is not None:  # time off is not locked: as the snapshot read it
        fresh = replace(fresh, absences=seen.absences, holidays=seen.holidays)
    snap.reps[fresh.id] = fresh
    team = config.teams.get(decision.team_id) if decision.team_id is not None else None
    ignore_caps = config.rep_action_ignores_caps.get(decision.rule_id or -1, False)
    eligible, why = rep_is_eligible(fresh, team, now, ignore_caps=ignore_caps)
    if not eligible:
        logger.info("route_lead: %s became %s under lock; deciding again", fresh.email, why)
        raise _Retry
    return _apply_owner(lead, decision, config, snap, now, notes, supersede)


def _set_status(lead: Lead, status: str, now: datetime) -> None:
    lead.status = status
    lead.processed_at = now
    lead.save(update_fields=["status", "processed_at"])


_STATUS = {"owner": LeadStatus.ASSIGNED, "excluded": LeadStatus.EXCLUDED}


def lead_unreachable_reason(lead: Lead) -> str | None:
    """Why nobody can contact this lead, or None: accepted (a lead is never lost at intake),
    but an invalid e-mail (``{"email": 12345}``) with no valid phone and no company with a name
    is junk a rep's queue and caps are not spent on (docs/revops.md, "How a lead is routed")."""
    if lead.email and FLAG_INVALID_EMAIL not in (lead.flags or []):
        return None
    if lead.phone:  # only a valid phone is kept in the field (an invalid one goes to custom)
        return None
    if lead.company and (lead.first_name or lead.last_name):
        return None
    return (
        "no valid e-mail or phone (and no company with a name): nobody can contact this lead, "
        "so it stays unassigned for review"
    )


def route_lead(
    *,
    lead: Lead,
    now: datetime | None = None,
    notes: Sequence[str] = (),
    supersede: Assignment | None = None,
) -> RouteResult:
    """Route one normalised lead with the live ruleset and apply the decision.

    Exactness under concurrency (PostgreSQL): a team's turn is read and moved under its row
    lock (taken before any rep lock), and the chosen rep's caps are checked with counts read
    under the rep's row lock, which every assigning worker takes; when either moved since the
    snapshot, the decision is made again inside the locks. The partial unique constraints on
    ``Assignment`` refuse a second initial assignment (IntegrityError). With no published
    ruleset the lead is ``unassigned``. Raises RuleErrors when the live rules no longer compile.
    """
    now = now or timezone.now()
    unreachable = lead_unreachable_reason(lead)
    if unreachable is not None:
        decision = Decision(outcome="nothing", reason=unreachable, trace=())
        if supersede is not None:
            return RouteResult(decision=decision, status=lead.status)
        with transaction.atomic():
            _set_status(lead, LeadStatus.UNASSIGNED, now)
        return RouteResult(decision=decision, status=LeadStatus.UNASSIGNED)
    try:
        config = live_config()
    except RulesetNotFound:
        decision = Decision(
            outcome="nothing", reason="no ruleset is published: the lead stays unassigned", trace=()
        )
        if supersede is not None:
            return RouteResult(decision=decision, status=lead.status)
        with transaction.atomic():
            _set_status(lead, LeadStatus.UNASSIGNED, now)
        return RouteResult(decision=decision, status=LeadStatus.UNASSIGNED)
    facts = lead_facts(lead)
    snap = _decision_snapshot(config, now)
    decision = _decide(facts, config, snap, now)
    with transaction.atomic():
        locked_teams: set[int] = set()
        for _attempt in range(_MAX_ATTEMPTS):
            if decision.outcome != "owner":
                break
            team_id = decision.team_id
            if team_id is not None and team_id not in locked_teams:
                turn = _lock_team(team_id)
                locked_teams.add(team_id)
                team = config.teams.get(team_id)
                least_loaded = team is not None and team.strategy == "least_loaded"
                # least_loaded chooses on counts, not a stored turn: read them again under the
                # team's lock, or two workers would both give the lead to the same "least
                # loaded" member.
                if least_loaded or turn != snap.rotation.get(
                    team_id, RotationState(team_id=team_id)
                ):
                    # Another worker took a turn since the snapshot: decide with the new one
                    # and fresh counts, now that nobody else can move this team.
                    snap = _decision_snapshot(config, now)
                    snap.rotation[team_id] = turn
                    decision = _decide(facts, config, snap, now)
                    continue
            try:
                with transaction.atomic():
                    assignment = _try_owner(lead, decision, config, snap, now, notes, supersede)
            except _Retry:
                # A cap filled meanwhile: decide again with fresh counts (the turns of the
                # teams this transaction has locked cannot have moved).
                snap = _decision_snapshot(config, now)
                decision = _decide(facts, config, snap, now)
                continue
            lead_tags_set(lead=lead, priority=decision.priority, tags=decision.tags)
            if supersede is None or lead.status != LeadStatus.DUPLICATE:
                _set_status(lead, LeadStatus.ASSIGNED, now)
            return RouteResult(decision=decision, status=LeadStatus.ASSIGNED, assignment=assignment)
        else:
            raise RoutingContention(
                f"lead {lead.pk}: no stable decision after {_MAX_ATTEMPTS} tries"
            )
        if supersede is not None:
            # Routing again a lead that has an owner: no one else now, so it stays theirs.
            return RouteResult(decision=decision, status=lead.status)
        status = _STATUS.get(decision.outcome, LeadStatus.UNASSIGNED)
        lead_tags_set(lead=lead, priority=decision.priority, tags=decision.tags)
        _set_status(lead, status, now)
        return RouteResult(decision=decision, status=status)


# --- simulate -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Simulation:
    """A read-only decision with the names the API shows."""

    decision: Decision
    rep: RepState | None
    team: TeamSpec | None
    sla_minutes: int | None


def simulate(
    *, lead_data: Mapping[str, Any], source_slug: str | None = None, version: int | None = None
) -> Simulation:
    """The decision the worker would make now for ``lead_data``; writes nothing, moves no turn.

    Raises RulesetNotFound, SourceNotFound, or RuleErrors when the rules no longer compile.
    """
    source: Source | None = None
    if source_slug is not None:
        source = Source.objects.filter(slug=source_slug).first()
        if source is None:
            raise SourceNotFound(f'No source "{source_slug}".')
    config = live_config(version)
    now = timezone.now()
    return simulate_with(
        lead_data=lead_data,
        source=source,
        config=config,
        snap=_decision_snapshot(config, now),
        now=now,
    )


def simulate_with(
    *,
    lead_data: Mapping[str, Any],
    source: Source | None,
    config: LiveConfig,
    snap: _AnySnapshot,
    now: datetime,
    accounts: Mapping[str, AccountFacts] | None = None,
) -> Simulation:
    """``simulate`` with the configuration, the reps' state and (optionally) the accounts given:
    a configuration document's (``routing.configuration``); ``source`` need not be saved."""
    field_map: Mapping[str, str] | None = None
    flat_data: Mapping[str, Any] = lead_data
    if source is not None:
        field_map = source.field_map or None
        # Read as the worker reads that source's leads: its kind, options and paths.
        flat_data = source_flatten(source, dict(lead_data)).record
    normalized = normalize(flat_data, field_map)
    # Exactly the facts the worker has: the stored columns (no `website`, no `external_id`)
    # and the same free-mail rule as lead_facts().
    fields = {name: normalized.fields.get(name) for name in _FACT_FIELDS}
    email_domain = fields.get("email_domain") or ""
    free = FLAG_FREE_EMAIL in normalized.flags or (
        isinstance(email_domain, str) and bool(email_domain) and is_free_email_domain(email_domain)
    )
    facts = _facts(
        fields, normalized.custom, source.slug if source is not None else None, free, accounts
    )
    decision = _decide(facts, config, snap, now)
    decision = replace(decision, rotation_update=None)
    rep = snap.reps.get(decision.rep_id) if decision.rep_id is not None else None
    team = config.teams.get(decision.team_id) if decision.team_id is not None else None
    sla = (decision.sla_minutes or _default_sla()) if decision.outcome == "owner" else None
    return Simulation(decision=decision, rep=rep, team=team, sla_minutes=sla)
