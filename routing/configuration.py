"""The whole routing configuration as one document (the rules-as-code file): import it safely,
and check it without writing anything.

- ``configuration_import``: the path of ``manage.py routing_import``. Serialised with every
  other import and publish (the loser is told why); validates the whole file; upserts it; with
  ``prune`` deletes what the file no longer names (refusing what live leads and rules need);
  with ``publish`` runs every saved test case against the resulting configuration and refuses
  unless they pass or ``force`` (a forced publish records the failing cases in the audit log).
  All or nothing, with one ``config_imported`` audit event.
- ``configuration_check``: the path of ``manage.py routing_check`` (a CI job). Validates the
  file, builds the engine's configuration from the document (the tables overlaid with the file,
  as an import would leave them) without writing anything, runs the test cases (the file's and
  the saved ones it keeps) against it, and decides the last N leads with both the published
  configuration and the file's, listing every lead whose decision differs.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from itertools import count
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from audit.models import EventType
from audit.services import event_record
from leads.models import Lead, Source
from routing.decisions import (
    DECIDE_LOCK,
    LiveConfig,
    RulesetNotFound,
    _Snapshot,
    _snapshot,
    _working_hours,
    clear_live_config_cache,
    config_compile,
    live_config,
    simulate_with,
)
from routing.engine import AccountFacts, RepState, RuleErrors
from routing.models import (
    Account,
    ExpectedStatus,
    Rep,
    RoutingTestCase,
    RuleSetStatus,
    Team,
    TeamMembership,
    Territory,
    ValueList,
)
from routing.rules_io import (
    PUBLISH_LOCK,
    ConfigurationBusy,
    Counts,
    ImportResult,
    _Plan,
    configuration_reading,
    rules_apply,
    rules_plan,
    rules_prune,
    ruleset_publish,
)
from routing.selectors import ruleset_published
from routing.timeoff.state_history import ReplayRepStates
from routing.versions import (
    CaseResult,
    Outcome,
    TestCasesFailing,
    _after,
    _release,
    _replayed_leads,
    earliest_arrival,
    outcome_changes,
    outcome_of,
    replay_lead_ids,
    test_cases_run,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    Actor = AbstractBaseUser | None

CHECK_LEADS_DEFAULT = 500
CHECK_ROWS_KEPT = 1000  # changed leads listed by a check; every change is counted


LOCK_WAIT_SECONDS = 10.0  # how long a change made in the admin waits for another in flight
_LOCK_POLL_SECONDS = 0.05


def _try_publish_lock(cursor: Any) -> bool:
    cursor.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", [PUBLISH_LOCK])
    row = cursor.fetchone()
    return bool(row and row[0])


def configuration_lock(*, wait_seconds: float = 0.0) -> None:
    """Take the publish lock (PostgreSQL) or refuse with ConfigurationBusy: of two imports or
    publishes at once, or a publish during a replay (which holds it shared,
    ``routing.rules_io.configuration_reading``), the second is told why and writes nothing.
    It is tried, never queued for: ``wait_seconds`` (a change made in the admin) tries again
    until then, so that a publish of a few seconds is waited for while a long replay is not.
    (SQLite lets one writer at a time in any case.)

    Leads keep being routed meanwhile, with the configuration as committed: the publish's
    writes are invisible to them until it commits. It takes the decide lock exclusively only
    for that, with ``decide_lock_exclusive`` as its last statement."""
    if connection.vendor != "postgresql":
        return
    deadline = time.monotonic() + wait_seconds
    with connection.cursor() as cursor:
        while not _try_publish_lock(cursor):
            if time.monotonic() >= deadline:
                raise ConfigurationBusy(
                    "Another import or publish of the routing configuration, or a replay of "
                    "it, is in progress; nothing was written. Try again when it has finished."
                )
            time.sleep(_LOCK_POLL_SECONDS)


_DEADLOCK = "40P01"
_SWAP_ATTEMPTS = 20


def decide_lock_exclusive() -> None:
    """The decide lock, exclusively (``routing.decisions.DECIDE_LOCK``): the last statement of
    a publish, after every write and check (PostgreSQL). It waits for the leads being decided
    now (each holds it shared from its claim), and the next ones wait for the commit that
    follows at once: no lead is decided by a mix of two versions, and leads wait only for the
    swap, never for a publish's preparation (a 20,000-row table is written and checked before).

    A lead already holding it shared may be waiting for a row the publish wrote (a team's or a
    rep's): the database ends one of the two as a deadlock. When that is this statement, it
    is rolled back alone (a savepoint) and tried again; the lead, ended or timed out
    (``lock_timeout``), is routed again by its worker."""
    if connection.vendor != "postgresql":
        return
    for attempt in range(_SWAP_ATTEMPTS):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [DECIDE_LOCK]
                )
            return
        except OperationalError as exc:
            code = getattr(exc.__cause__, "sqlstate", None)
            if code != _DEADLOCK or attempt == _SWAP_ATTEMPTS - 1:
                raise


# --- Import -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigurationImport:
    """What ``configuration_import`` did."""

    result: ImportResult
    counts: Counts  # section -> {"created", "updated", "deleted"}
    published: bool  # this import published (a new version, or the same one checked again)
    test_results: tuple[CaseResult, ...] = ()
    failing: tuple[str, ...] = ()  # test cases that failed and were published over (--force)


def _merge(into: Counts, more: Counts) -> Counts:
    for section, tally in more.items():
        mine = into.setdefault(section, {"created": 0, "updated": 0, "deleted": 0})
        for key, number in tally.items():
            mine[key] = mine.get(key, 0) + number
    return into


def _actor_label(actor: Actor) -> str:
    return f"user:{actor.get_username()}" if actor is not None else "system"


@transaction.atomic(durable=True)
def configuration_import(
    *,
    data: Any,
    publish: bool = False,
    prune: bool = False,
    force: bool = False,
    actor: Actor = None,
    file_name: str = "",
) -> ConfigurationImport:
    """Import a whole configuration document, all or nothing (see the module docstring).

    Raises ConfigurationBusy (another import or publish is running), RulesFileErrors (every
    problem with its path in the file; PruneRefused for what cannot be deleted), TestCasesFailing
    (``publish`` without ``force`` while a saved test case fails) or RuleErrors; nothing is
    written then.
    """
    try:
        return _configuration_import(
            data=data, publish=publish, prune=prune, force=force, actor=actor, file_name=file_name
        )
    except BaseException:
        # Configurations compiled inside the rolled-back transaction carry a configuration
        # version number that a later, real change will take again: forget them.
        clear_live_config_cache()
        raise


def _configuration_import(
    *, data: Any, publish: bool, prune: bool, force: bool, actor: Actor, file_name: str
) -> ConfigurationImport:
    # routing.drafts.live records versions of the configuration, which it imports from here.
    from routing.drafts.live import config_live_baseline, config_live_version_record
    from routing.drafts.models import ConfigSnapshotKind

    configuration_lock()
    config_live_baseline(actor=_actor_label(actor))
    imported = configuration_apply_plan(
        plan=rules_plan(data, prune=prune),
        publish=publish,
        force=force,
        actor=actor,
        file_name=file_name,
    )
    # Published or not, an import changes the tables that route: a configuration version
    # (routing.drafts), when it changed what the latest version holds.
    config_live_version_record(
        actor=_actor_label(actor),
        user=actor,
        kind=ConfigSnapshotKind.IMPORT,
        what=f"routing_import{' --publish' if publish else ''} {file_name}".strip()[:200],
        failing_test_cases=imported.failing,
    )
    decide_lock_exclusive()  # the swap: the last statement before the commit
    return imported


def plan_touches_claimed_rows(plan: _Plan) -> bool:
    """Whether importing ``plan`` updates or deletes a team's or a rep's row: the rows each
    lead's routing locks (a team's turn, a rep's caps) while it holds the decide lock shared.
    Such a publish takes the decide lock before its first write (``decide_lock_exclusive``),
    else a lead waiting for one of those rows and the publish waiting for the lead would
    deadlock; any other (territories, accounts, lists, rules, new teams and reps) only for its
    final swap."""
    teams = {team.name: team for team in Team.objects.all()}
    for entry in plan.sections["teams"]:
        team = teams.get(entry.key)
        if team is not None and any(
            getattr(team, name) != value for name, value in entry.fields.items()
        ):
            return True
    reps = {rep.email.lower(): rep for rep in Rep.objects.all()}
    for entry in plan.sections["reps"]:
        rep = reps.get(entry.key.lower())
        if rep is not None and any(
            getattr(rep, name) != value for name, value in entry.fields.items()
        ):
            return True
    if plan.prune:
        if "teams" in plan.present and set(teams) - {e.key for e in plan.sections["teams"]}:
            return True
        named = {e.key.lower() for e in plan.sections["reps"]}
        if "reps" in plan.present and set(reps) - named:
            return True
    return False


def configuration_apply_plan(
    *, plan: _Plan, publish: bool, force: bool, actor: Actor, file_name: str
) -> ConfigurationImport:
    """``configuration_import``'s writes for a checked plan, in the caller's transaction,
    which holds ``configuration_lock``. Prunes when the plan was made with ``prune``."""
    if plan_touches_claimed_rows(plan):
        decide_lock_exclusive()  # before the first write: see plan_touches_claimed_rows
    prune = plan.prune
    before = ruleset_published()
    result = rules_apply(plan=plan, actor=actor)
    counts = _merge({}, result.counts)
    if prune:
        live_rules = (
            plan.rules
            if publish
            else [rule.to_data() for rule in before.rules.all()]
            if before is not None
            else []
        )
        _merge(counts, rules_prune(plan=plan, live_rules=live_rules))
    ruleset = result.ruleset
    results: tuple[CaseResult, ...] = ()
    failing: tuple[str, ...] = ()
    if publish:
        # The tables changed with the import whether or not the ruleset did: the saved test
        # cases run against the whole resulting configuration on every publish.
        results = tuple(test_cases_run(ruleset=ruleset))
        failing = tuple(r.case.name for r in results if not r.passed)
        if failing and not force:
            raise TestCasesFailing(results)
        if ruleset.status == RuleSetStatus.DRAFT:
            ruleset = ruleset_publish(
                ruleset=ruleset,
                actor=actor,
                note="Published by routing_import" + (" --force" if failing else ""),
                failing_cases=failing,
            )
    event_record(
        type=EventType.CONFIG_IMPORTED,
        actor=_actor_label(actor),
        ruleset_version=ruleset.version,
        data={
            "file": file_name[:200],
            "document": True,
            "counts": counts,
            "ruleset_version": ruleset.version,
            "ruleset_created": result.created,
            "published": publish,
            "prune": prune,
            "test_cases_run": len(results),
            **({"forced": True, "failing_test_cases": list(failing)} if failing else {}),
        },
    )
    return ConfigurationImport(
        result=replace(result, ruleset=ruleset),
        counts=counts,
        published=publish,
        test_results=results,
        failing=failing,
    )


# --- The configuration a document describes, in memory ------------------------------------------


@dataclass(frozen=True)
class DocumentCase:
    """A test case as the document (overlaid on the saved ones) has it, by natural keys."""

    name: str
    lead: Any
    source: str | None
    expected_status: str
    expected_rep: str | None  # e-mail
    expected_team: str | None


@dataclass
class DocumentConfig:
    """The engine's configuration built from a document, plus what a decision reads beside it:
    the reps' design (caps, hours, time zone; live state stays the database's unless the file
    sets it), the accounts, the sources and the test cases."""

    config: LiveConfig
    reps: dict[int, dict[str, Any]]  # id -> rep row (new reps have ids no table row has)
    accounts: dict[str, AccountFacts]
    sources: dict[str, Source]  # slug -> an unsaved copy with the file's settings
    cases: list[DocumentCase]

    def snapshot(self, now: datetime) -> _Snapshot:
        """Today's load counters and turns, with the document's reps' design laid over them."""
        snap = _snapshot(self.config, now)
        reps: dict[int, RepState] = {}
        for rep_id, row in self.reps.items():
            state = snap.reps.get(rep_id) or RepState(id=rep_id, email=row["email"], name="")
            reps[rep_id] = replace(
                state,
                email=row["email"],
                name=row["name"],
                active=row["active"],
                out_of_office_until=row["out_of_office_until"],
                timezone=row["timezone"] or "UTC",
                working_hours=_working_hours(row["working_hours"]),
                max_open=row["max_open"],
                max_per_day=row["max_per_day"],
            )
        snap.reps = reps
        return snap


_REP_FIELDS = (
    "id",
    "email",
    "name",
    "active",
    "out_of_office_until",
    "timezone",
    "working_hours",
    "max_open",
    "max_per_day",
)
_REP_DEFAULTS = {
    "active": True,
    "out_of_office_until": None,
    "timezone": "UTC",
    "working_hours": None,
    "max_open": None,
    "max_per_day": None,
}


def _kept(plan: _Plan, section: str, rows: dict[str, Any]) -> dict[str, Any]:
    """The stored rows an import of ``plan`` keeps: all, or only those it names (prune)."""
    if not (plan.prune and section in plan.present):
        return rows
    named = {e.key.lower() if section == "reps" else e.key for e in plan.sections[section]}
    return {key: row for key, row in rows.items() if key in named}


def document_config(plan: _Plan) -> DocumentConfig:
    """The configuration importing ``plan`` would leave, built in memory; writes nothing.

    Rows keep their table ids (so today's turns and load counters apply); new rows get ids
    above every stored one, in file order, as an import would create them.
    """
    fresh = count(
        max(
            [0]
            + [
                model.objects.order_by("-id").values_list("id", flat=True).first() or 0
                for model in (Rep, Team, Territory)
            ]
        )
        + 1
    )
    # Reps
    reps = _kept(
        plan,
        "reps",
        {row["email"].lower(): row for row in Rep.objects.values(*_REP_FIELDS)},
    )
    for entry in plan.sections["reps"]:
        row = reps.get(entry.key.lower())
        if row is None:
            row = reps[entry.key.lower()] = {"id": next(fresh), **_REP_DEFAULTS}
        row.update(entry.fields)
    rep_ids = {key: row["id"] for key, row in reps.items()}
    # Teams and their members
    teams = _kept(
        plan,
        "teams",
        {
            row["name"]: row
            for row in Team.objects.values(
                "id", "name", "strategy", "respect_working_hours", "sla_minutes"
            )
        },
    )
    stored_members: dict[int, list[tuple[int, int]]] = {}
    for team_id, rep_id, weight in TeamMembership.objects.order_by(
        "team_id", "position", "id"
    ).values_list("team_id", "rep_id", "weight"):
        stored_members.setdefault(team_id, []).append((rep_id, weight))
    members: dict[int, list[tuple[int, int]]] = {}
    live_rep_ids = set(rep_ids.values())
    for row in teams.values():
        members[row["id"]] = [m for m in stored_members.get(row["id"], []) if m[0] in live_rep_ids]
    for entry in plan.sections["teams"]:
        row = teams.get(entry.key)
        if row is None:
            row = teams[entry.key] = {
                "id": next(fresh),
                "name": entry.key,
                "strategy": "round_robin",
                "respect_working_hours": False,
                "sla_minutes": None,
            }
            members[row["id"]] = []
        row.update(entry.fields)
        if "members" in entry.refs:
            members[row["id"]] = [
                (rep_ids[email.lower()], weight) for email, weight in entry.refs["members"]
            ]
    team_ids = {name: row["id"] for name, row in teams.items()}
    # Territories
    territories = _kept(
        plan,
        "territories",
        {
            row["name"]: row
            for row in Territory.objects.values(
                "id", "name", "countries", "regions", "postal_prefixes", "team_id", "rep_id"
            )
        },
    )
    for entry in plan.sections["territories"]:
        row = territories.get(entry.key)
        if row is None:
            row = territories[entry.key] = {
                "id": next(fresh),
                "name": entry.key,
                "regions": [],
                "postal_prefixes": [],
            }
        row.update(entry.fields)
        if "team" in entry.refs:
            row.update(team_id=team_ids[entry.refs["team"]], rep_id=None)
        elif "rep" in entry.refs:
            row.update(team_id=None, rep_id=rep_ids[entry.refs["rep"].lower()])
    # Value lists
    value_lists = _kept(plan, "value_lists", dict(ValueList.objects.values_list("name", "values")))
    for entry in plan.sections["value_lists"]:
        value_lists[entry.key] = entry.fields.get("values", value_lists.get(entry.key, []))
    # Accounts
    accounts = _kept(
        plan,
        "accounts",
        {
            row["domain"]: row
            for row in Account.objects.values("domain", "name", "tier", "owner_id")
        },
    )
    for entry in plan.sections["accounts"]:
        row = accounts.setdefault(
            entry.key, {"domain": entry.key, "name": "", "tier": "", "owner_id": None}
        )
        row.update(entry.fields)
        if "owner" in entry.refs:
            owner = entry.refs["owner"]
            row["owner_id"] = None if owner is None else rep_ids[owner.lower()]
    # Sources (unsaved copies: a test case reads a lead as its source would)
    sources = _kept(plan, "sources", {s.slug: s for s in Source.objects.all()})
    for entry in plan.sections["sources"]:
        source = sources.get(entry.key) or Source(slug=entry.key)
        for name, value in entry.fields.items():
            if name != "token":
                setattr(source, name, value)
        sources[entry.key] = source
    # Test cases, by natural keys
    emails = {row["id"]: row["email"] for row in reps.values()}
    names = {row["id"]: name for name, row in teams.items()}
    stored_cases = {
        case.name: DocumentCase(
            name=case.name,
            lead=case.lead,
            source=case.source.slug if case.source is not None else None,
            expected_status=case.expected_status,
            expected_rep=emails.get(case.expected_rep_id) if case.expected_rep_id else None,
            expected_team=names.get(case.expected_team_id) if case.expected_team_id else None,
        )
        for case in RoutingTestCase.objects.select_related("source")
    }
    cases = _kept(plan, "test_cases", stored_cases)
    for entry in plan.sections["test_cases"]:
        old = cases.get(entry.key)
        values = {
            "source": old.source if old else None,
            "expected_rep": old.expected_rep if old else None,
            "expected_team": old.expected_team if old else None,
            **entry.fields,
            **entry.refs,
        }
        cases[entry.key] = DocumentCase(
            name=entry.key,
            lead=values.get("lead", old.lead if old else {}),
            source=values["source"],
            expected_status=values.get(
                "expected_status", old.expected_status if old else ExpectedStatus.ASSIGNED
            ),
            expected_rep=values["expected_rep"],
            expected_team=values["expected_team"],
        )
    published = ruleset_published()
    config = config_compile(
        ruleset_id=0,
        version=(published.version if published is not None else 0),
        status="file",
        name=plan.ruleset_name,
        rules=[
            {"id": -(i + 1), **_rule_data(rule)}  # negative: no stored rule has such an id
            for i, rule in enumerate(plan.rules)
        ],
        teams=sorted(teams.values(), key=lambda row: row["id"]),
        memberships=members,
        rep_ids={row["email"]: row["id"] for row in reps.values()},
        value_lists=value_lists,
        territories=sorted(territories.values(), key=lambda row: row["id"]),
    )
    return DocumentConfig(
        config=config,
        reps={row["id"]: row for row in reps.values()},
        accounts={
            domain: AccountFacts(
                name=row["name"] or None,
                tier=row["tier"] or None,
                domain=domain,
                owner_rep_id=row["owner_id"],
            )
            for domain, row in accounts.items()
        },
        sources=sources,
        cases=sorted(cases.values(), key=lambda case: case.name),
    )


def _rule_data(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A rule in its stored shape (``rules_plan``) back in the file's shape."""
    return {key: value for key, value in rule.items() if value is not None}


# --- Checking a document ------------------------------------------------------------------------


@dataclass(frozen=True)
class DocumentCaseResult:
    """One test case run against the document's configuration."""

    case: DocumentCase
    outcome: Outcome
    passed: bool
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiffRow:
    """A lead the file's configuration would decide otherwise than the published one."""

    lead: Lead
    before: Outcome
    after: Outcome
    changed: tuple[str, ...]  # "owner", "team", "status"


@dataclass(frozen=True)
class ConfigurationCheck:
    """What ``routing_check`` reports: the test cases, and the decision diff over past leads."""

    published_version: int | None
    results: tuple[DocumentCaseResult, ...]
    considered: int = 0
    changed: int = 0
    rows: tuple[DiffRow, ...] = ()  # newest first, at most CHECK_ROWS_KEPT
    per_rep: tuple[tuple[str, int, int], ...] = ()  # (rep, published, file), most moved first
    at: datetime = field(default_factory=timezone.now)

    @property
    def failing(self) -> tuple[DocumentCaseResult, ...]:
        return tuple(result for result in self.results if not result.passed)


def _case_problems(case: DocumentCase, outcome: Outcome) -> tuple[str, ...]:
    if outcome.error:
        return (outcome.error,)
    problems = []
    if outcome.status != case.expected_status:
        problems.append(f"status is {outcome.status}, expected {case.expected_status}")
    if case.expected_rep is not None and outcome.rep.casefold() != case.expected_rep.casefold():
        problems.append(f"owner is {outcome.owner_label}, expected {case.expected_rep}")
    if case.expected_team is not None and outcome.team != case.expected_team:
        problems.append(f"team is {outcome.team or '—'}, expected {case.expected_team}")
    return tuple(problems)


def document_cases_run(document: DocumentConfig, now: datetime) -> list[DocumentCaseResult]:
    """Every test case of the document against its configuration; writes nothing."""
    results = []
    snap = document.snapshot(now)  # simulations move no turn and count no load: one will do
    for case in document.cases:
        if not isinstance(case.lead, dict):
            outcome = Outcome(status="", error="The lead must be a JSON object.")
        else:
            simulation = simulate_with(
                lead_data=case.lead,
                source=document.sources.get(case.source) if case.source else None,
                config=document.config,
                snap=snap,
                now=now,
                accounts=document.accounts,
            )
            outcome = outcome_of(simulation)
        problems = _case_problems(case, outcome)
        results.append(
            DocumentCaseResult(case=case, outcome=outcome, passed=not problems, problems=problems)
        )
    return results


def configuration_check(
    *, data: Any, prune: bool = False, leads: int = CHECK_LEADS_DEFAULT
) -> ConfigurationCheck:
    """Validate a document, run its test cases and diff its decisions against the published
    configuration over the last ``leads`` processed leads; reads only.

    Raises RulesFileErrors (every problem with its path), ConfigurationBusy (a publish or
    import under way). With ``prune``, the file is checked
    (and its configuration built) as ``routing_import --prune`` would take it.
    """
    return configuration_check_plan(plan=rules_plan(data, prune=prune), leads=leads)


def configuration_check_plan(
    *,
    plan: _Plan,
    leads: int = CHECK_LEADS_DEFAULT,
    progress: Callable[[int, int], None] | None = None,
) -> ConfigurationCheck:
    """``configuration_check`` of a checked plan (a draft's, ``routing.drafts``); reads only.
    Raises ConfigurationBusy while a publish or import is under way (and refuses one that
    starts while it reads: ``routing.rules_io.configuration_reading``). ``progress`` is told
    (leads decided, leads in all) after each batch, for a background job."""
    with configuration_reading():
        return _configuration_check_plan(plan=plan, leads=leads, progress=progress)


def _configuration_check_plan(
    *, plan: _Plan, leads: int, progress: Callable[[int, int], None] | None = None
) -> ConfigurationCheck:
    document = document_config(plan)
    now = timezone.now()
    results = tuple(document_cases_run(document, now))
    try:
        published = live_config()
    except (RulesetNotFound, RuleErrors):
        return ConfigurationCheck(published_version=None, results=results)
    limit = max(0, min(leads, settings.REPLAY_MAX_LEADS))
    ids = replay_lead_ids(limit) if limit else []
    snap_published = _snapshot(published, now)
    snap_file = document.snapshot(now)
    past = ReplayRepStates(since=earliest_arrival(ids))
    rows: list[DiffRow] = []
    changed = considered = 0
    before_counts: Counter[str] = Counter()
    after_counts: Counter[str] = Counter()
    for start in range(0, len(ids), 500):
        for lead in _replayed_leads(ids[start : start + 500]):
            considered += 1
            assigned = lead.active_assignments  # type: ignore[attr-defined]  # prefetched
            active = assigned[0] if assigned else None
            _release(snap_published, active, now)
            _release(snap_file, active, now)
            at = now + timedelta(microseconds=considered)
            # Each rep as they were when the lead arrived (active, away, on leave).
            replaced = past.apply(snap_published.reps, lead.received_at, at)
            before = _after(published, lead, snap_published, at)
            past.restore(snap_published.reps, replaced)
            replaced = past.apply(snap_file.reps, lead.received_at, at)
            after = _after(document.config, lead, snap_file, at, accounts=document.accounts)
            past.restore(snap_file.reps, replaced)
            if before.rep:
                before_counts[before.owner_label] += 1
            if after.rep:
                after_counts[after.owner_label] += 1
            what = outcome_changes(before, after)
            if what:
                changed += 1
                rows.append(DiffRow(lead=lead, before=before, after=after, changed=what))
        if progress is not None:
            progress(considered, len(ids))
    per_rep = sorted(
        (
            (rep, before_counts[rep], after_counts[rep])
            for rep in set(before_counts) | set(after_counts)
            if before_counts[rep] != after_counts[rep]
        ),
        key=lambda row: (-abs(row[2] - row[1]), row[0]),
    )
    return ConfigurationCheck(
        published_version=published.version,
        results=results,
        considered=considered,
        changed=changed,
        rows=tuple(reversed(rows[-CHECK_ROWS_KEPT:])),
        per_rep=tuple(per_rep),
    )


__all__ = [
    "ConfigurationBusy",
    "ConfigurationCheck",
    "ConfigurationImport",
    "DocumentConfig",
    "configuration_check",
    "configuration_import",
    "document_config",
]
