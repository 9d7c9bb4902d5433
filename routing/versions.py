"""Working on ruleset versions: reorder rules, compare versions, replay, test cases, roll back.

Writes are services (``rule_move``, ``rules_reorder``, ``ruleset_new_draft``,
``ruleset_publish_checked``, ``ruleset_rollback``); the rest only reads: ``ruleset_diff``,
``ruleset_replay`` and ``test_cases_run`` decide with the same engine and the same
configuration as the worker (``routing.decisions``) but write nothing and move no turn.
"""

from __future__ import annotations

import difflib
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Max, Min, Prefetch
from django.utils import timezone

from leads.models import Lead, LeadStatus

# _snapshot/_decide: decisions' own read of today's reps and turns, and its decide call; a
# replay must see exactly what the worker would (a public name for them would be better).
from routing.crm.facts import crm_person_owner
from routing.decisions import (
    LiveConfig,
    RulesetNotFound,
    Simulation,
    SourceNotFound,
    _decide,
    _Snapshot,
    _snapshot,
    lead_facts,
    live_config,
    local_midnight,
    simulate,
)
from routing.engine import (
    AccountFacts,
    RepState,
    RotationState,
    RuleErrors,
    TeamSpec,
    choose_member,
)
from routing.engine.describe import describe_action, describe_condition
from routing.models import (
    Assignment,
    ExpectedStatus,
    Rep,
    RoutingTestCase,
    Rule,
    RuleSet,
    RuleSetStatus,
    Team,
    TeamMembership,
)
from routing.rules_io import configuration_reading, ruleset_copy, ruleset_publish
from routing.selectors import ruleset_published
from routing.timeoff.availability import rep_unavailable_reason
from routing.timeoff.state_history import ReplayRepStates

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    Actor = AbstractBaseUser | None

PRIORITY_STEP = 10
REPLAY_DEFAULT = 500
REPLAY_CHUNK = 500  # leads read (and progress reported) at a time
REPLAY_ROWS_KEPT = 5000  # changed leads listed; every change is counted

_OUTCOME_STATUS = {
    "owner": LeadStatus.ASSIGNED,
    "excluded": LeadStatus.EXCLUDED,
    "nothing": LeadStatus.UNASSIGNED,
}
_PROCESSED = (LeadStatus.ASSIGNED, LeadStatus.EXCLUDED, LeadStatus.UNASSIGNED)


def _refuse_unless_draft(ruleset: RuleSet) -> None:
    if ruleset.status != RuleSetStatus.DRAFT:
        raise ValidationError(
            f"Version {ruleset.version} is {ruleset.get_status_display().lower()}: "
            "only drafts can change. Start a new draft from it."
        )


# --- Reordering ---------------------------------------------------------------------------------


def _lock_draft(ruleset_id: int) -> RuleSet:
    ruleset = RuleSet.objects.select_for_update().get(pk=ruleset_id)
    _refuse_unless_draft(ruleset)
    return ruleset


def _set_priorities(rules: Sequence[Rule], priorities: Sequence[int]) -> None:
    """Give ``rules`` their new priorities without ever breaking the unique constraint.

    The constraint is not deferrable, so the rules first move out of the way to numbers above
    every current and every new priority, then take their new ones.
    """
    ruleset_id = rules[0].ruleset_id
    top = Rule.objects.filter(ruleset_id=ruleset_id).aggregate(top=Max("priority"))["top"] or 0
    parking = max(top, *priorities) + 1
    for offset, rule in enumerate(rules):
        Rule.objects.filter(pk=rule.pk).update(priority=parking + offset)
    for rule, priority in zip(rules, priorities, strict=True):
        Rule.objects.filter(pk=rule.pk).update(priority=priority)
        rule.priority = priority


@transaction.atomic
def rule_move(*, rule: Rule, direction: Literal["up", "down"]) -> Rule:
    """Swap a draft rule's priority with its neighbour's (up = runs earlier); no-op at an end."""
    _lock_draft(rule.ruleset_id)
    rule.refresh_from_db(fields=["priority"])
    siblings = Rule.objects.filter(ruleset_id=rule.ruleset_id).exclude(pk=rule.pk)
    neighbour = (
        siblings.filter(priority__lt=rule.priority).order_by("-priority").first()
        if direction == "up"
        else siblings.filter(priority__gt=rule.priority).order_by("priority").first()
    )
    if neighbour is not None:
        _set_priorities([rule, neighbour], [neighbour.priority, rule.priority])
    return rule


@transaction.atomic
def rules_reorder(*, ruleset: RuleSet, rule_ids: Sequence[int]) -> list[Rule]:
    """Put a draft's rules in the order of ``rule_ids`` (all of them), numbered 10, 20, ...

    Raises ValidationError when ``rule_ids`` is not exactly the ruleset's rules.
    """
    _lock_draft(ruleset.pk)
    rules = {rule.pk: rule for rule in Rule.objects.filter(ruleset=ruleset)}
    if sorted(rule_ids) != sorted(rules) or len(set(rule_ids)) != len(rule_ids):
        raise ValidationError("The new order must list every rule of the draft exactly once.")
    ordered = [rules[rule_id] for rule_id in rule_ids]
    if ordered:
        _set_priorities(ordered, [(i + 1) * PRIORITY_STEP for i in range(len(ordered))])
    return ordered


# A last rule without a condition whose action always decides is the ruleset's catch-all.
CATCH_ALL_ACTIONS = frozenset({"team", "rep", "exclude"})


def rule_next_priority(*, ruleset: RuleSet) -> int:
    """The priority a rule added to ``ruleset`` gets: last, or just before the catch-all.

    The catch-all is a last rule without a condition that gives the lead to a team or a rep,
    or excludes it: a rule after it would never decide. Without room below it (priorities
    one apart), the new rule goes last after all (move it up).
    """
    rules = list(Rule.objects.filter(ruleset=ruleset).order_by("-priority")[:2])
    if not rules:
        return PRIORITY_STEP
    last, below = rules[0], rules[1:]
    kind = last.action.get("type") if isinstance(last.action, dict) else None
    if last.when or kind not in CATCH_ALL_ACTIONS:
        return last.priority + PRIORITY_STEP
    floor = below[0].priority if below else None
    if floor is None or last.priority - PRIORITY_STEP > floor:
        return last.priority - PRIORITY_STEP
    if last.priority - floor > 1:
        return (last.priority + floor) // 2
    return last.priority + PRIORITY_STEP


def rule_first_priority(*, ruleset: RuleSet) -> int:
    """A priority that runs before every rule of ``ruleset``."""
    low = Rule.objects.filter(ruleset=ruleset).aggregate(low=Min("priority"))["low"]
    return PRIORITY_STEP if low is None else low - PRIORITY_STEP


# --- New drafts, publish, roll back -------------------------------------------------------------


@transaction.atomic
def ruleset_new_draft(*, ruleset: RuleSet | None = None, actor: Actor = None) -> RuleSet:
    """A new draft copied from ``ruleset`` (default: the published version)."""
    origin = ruleset or ruleset_published()
    if origin is None:
        raise ValidationError("No version is published yet: add a new ruleset instead.")
    return ruleset_copy(ruleset=origin, actor=actor)


class TestCasesFailing(Exception):
    """Publishing was refused: saved test cases fail and nobody confirmed."""

    __test__ = False  # not a pytest class

    def __init__(self, results: Sequence[CaseResult]) -> None:
        self.results = tuple(results)
        failing = [r.case.name for r in results if not r.passed]
        super().__init__(f"{len(failing)} saved test case(s) fail: {', '.join(failing)}")


@transaction.atomic
def ruleset_publish_checked(
    *, ruleset: RuleSet, actor: Actor = None, note: str = "", confirm_failing: bool = False
) -> RuleSet:
    """Publish a draft after running the saved test cases against it.

    Raises TestCasesFailing when a case fails and ``confirm_failing`` is false, and RuleErrors
    when the draft does not compile (``ruleset_publish``). ``note``, when given, is added to the
    version's note. A configuration version too (``routing.drafts.live``), under the
    configuration lock: ConfigurationBusy when another publish, import or replay keeps it
    past ``LOCK_WAIT_SECONDS``.
    """
    # The cases run before the configuration lock: leads are not kept waiting meanwhile.
    results = test_cases_run(ruleset=ruleset)
    if any(not result.passed for result in results) and not confirm_failing:
        raise TestCasesFailing(results)
    with _live_change(actor, f"the publish of ruleset version {ruleset.version}"):
        return ruleset_publish(ruleset=ruleset, actor=actor, note=note)


@transaction.atomic
def ruleset_rollback(*, ruleset: RuleSet, actor: Actor = None, note: str = "") -> RuleSet:
    """Republish an archived version as a new version (a copy), in one transaction.

    Only an archived version: a draft is published with ``ruleset_publish_checked``, which runs
    the saved test cases first. A configuration version too, as there.
    """
    with _live_change(actor, f"the rollback to ruleset version {ruleset.version}"):
        status = RuleSet.objects.filter(pk=ruleset.pk).values_list("status", flat=True).first()
        if status != RuleSetStatus.ARCHIVED:
            raise ValidationError(
                f"Version {ruleset.version} is {status or 'deleted'}: only an archived version "
                "can be rolled back to (publish a draft with Publish…)."
            )
        copy = ruleset_copy(ruleset=ruleset, actor=actor)
        copy.note = f"Rollback to version {ruleset.version}" + (f": {note.strip()}" if note else "")
        RuleSet.objects.filter(pk=copy.pk).update(note=copy.note)
        return ruleset_publish(ruleset=copy, actor=actor)


def _live_change(actor: Actor, what: str) -> Any:
    # routing.drafts.live stands above this module (it imports routing.configuration).
    from routing.configuration import LOCK_WAIT_SECONDS
    from routing.drafts.live import config_live_change

    label = f"user:{actor.get_username()}" if actor is not None else "system"
    return config_live_change(actor=label, user=actor, what=what, wait_seconds=LOCK_WAIT_SECONDS)


# --- Diff ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RuleChange:
    """A rule present in both versions whose settings differ: each change in words."""

    name: str
    changes: tuple[tuple[str, str, str], ...]  # (what, before, after)


@dataclass(frozen=True, slots=True)
class RulesetDiff:
    """What changed from version ``old`` to version ``new``; rules are matched by name."""

    old: RuleSet
    new: RuleSet
    added: tuple[Rule, ...]
    removed: tuple[Rule, ...]
    changed: tuple[RuleChange, ...]
    reordered: tuple[str, ...]  # rules that now run at another place relative to the others
    renamed_ruleset: tuple[str, str] | None = None

    @property
    def is_empty(self) -> bool:
        return not (
            self.added or self.removed or self.changed or self.reordered or self.renamed_ruleset
        )


def _rule_words(rule: Rule) -> dict[str, str]:
    return {
        "condition": describe_condition(rule.when),
        "action": describe_action(rule.action),
        "SLA": f"{rule.sla_minutes} min" if rule.sla_minutes else "team default",
        "on SLA breach": rule.get_on_sla_breach_display(),
        "active": "yes" if rule.active else "no",
    }


def _rule_raw(rule: Rule) -> dict[str, Any]:
    return {
        "condition": rule.when,
        "action": rule.action,
        "SLA": rule.sla_minutes,
        "on SLA breach": rule.on_sla_breach,
        "active": rule.active,
    }


def ruleset_diff(*, old: RuleSet, new: RuleSet) -> RulesetDiff:
    """Rules added, removed, changed and reordered between two versions (two queries)."""
    old_rules = list(old.rules.order_by("priority"))
    new_rules = list(new.rules.order_by("priority"))
    old_by_name = {rule.name: rule for rule in old_rules}
    new_by_name = {rule.name: rule for rule in new_rules}
    changed: list[RuleChange] = []
    for rule in new_rules:
        before = old_by_name.get(rule.name)
        if before is None:
            continue
        raw_before, raw_after = _rule_raw(before), _rule_raw(rule)
        words_before, words_after = _rule_words(before), _rule_words(rule)
        changes = tuple(
            (what, words_before[what], words_after[what])
            for what in raw_after
            if raw_before[what] != raw_after[what]
        )
        if changes:
            changed.append(RuleChange(name=rule.name, changes=changes))
    common_old = [rule.name for rule in old_rules if rule.name in new_by_name]
    common_new = [rule.name for rule in new_rules if rule.name in old_by_name]
    matcher = difflib.SequenceMatcher(a=common_old, b=common_new, autojunk=False)
    kept = {
        name
        for block in matcher.get_matching_blocks()
        for name in common_new[block.b :][: block.size]
    }
    return RulesetDiff(
        old=old,
        new=new,
        added=tuple(rule for rule in new_rules if rule.name not in old_by_name),
        removed=tuple(rule for rule in old_rules if rule.name not in new_by_name),
        changed=tuple(changed),
        reordered=tuple(name for name in common_new if name not in kept),
        renamed_ruleset=(old.name, new.name) if old.name != new.name else None,
    )


# --- Test cases ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision reduced to what RevOps compare: status, owner, team, rule, reason."""

    status: str
    rep: str = ""  # e-mail
    rep_name: str = ""
    team: str = ""
    rule: str = ""
    reason: str = ""
    sla_minutes: int | None = None
    trace: tuple[str, ...] = ()
    error: str = ""

    @property
    def owner_label(self) -> str:
        return f"{self.rep_name} <{self.rep}>" if self.rep else "—"


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One saved test case run against one version."""

    case: RoutingTestCase
    outcome: Outcome
    passed: bool
    problems: tuple[str, ...] = ()


def trace_words(entries: Iterable[Any]) -> tuple[str, ...]:
    """Trace entries in plain words: "✓ Germany (20): assigned to ...", "✗ Hot (10): ..."."""
    lines = []
    for entry in entries:
        mark = "→" if entry.decided else ("✓" if entry.matched else "✗")
        lines.append(f"{mark} {entry.rule_name} ({entry.priority}): {entry.why}")
    return tuple(lines)


def outcome_simulated(
    *, lead_data: Any, source_slug: str | None = None, version: int | None = None
) -> Outcome:
    """The simulated outcome of ``lead_data`` against ``version`` (default: the published one).

    Errors (no such version, unknown source, rules that do not compile) become ``error``.
    """
    if not isinstance(lead_data, dict):
        return Outcome(status="", error="The lead must be a JSON object.")
    try:
        simulation = simulate(lead_data=lead_data, source_slug=source_slug, version=version)
    except (RulesetNotFound, SourceNotFound) as exc:
        return Outcome(status="", error=str(exc))
    except RuleErrors as exc:
        return Outcome(status="", error=f"The rules do not compile: {exc}")
    return outcome_of(simulation)


def outcome_changes(before: Outcome, after: Outcome) -> tuple[str, ...]:
    """What differs between two decisions of one lead: "owner", "team", "status" (in that order)."""
    return tuple(
        what
        for what, a, b in (
            ("owner", before.rep.casefold(), after.rep.casefold()),
            ("team", before.team, after.team),
            ("status", before.status, after.status),
        )
        if a != b
    )


def outcome_of(simulation: Simulation) -> Outcome:
    """A simulated decision as the Outcome RevOps compare."""
    decision = simulation.decision
    return Outcome(
        status=_OUTCOME_STATUS.get(decision.outcome, LeadStatus.UNASSIGNED),
        rep=simulation.rep.email if simulation.rep else "",
        rep_name=simulation.rep.name if simulation.rep else "",
        team=simulation.team.name if simulation.team else "",
        rule=decision.rule_name or "",
        reason=decision.reason,
        sla_minutes=simulation.sla_minutes,
        trace=trace_words(decision.trace),
    )


def _check(case: RoutingTestCase, outcome: Outcome) -> tuple[str, ...]:
    if outcome.error:
        return (outcome.error,)
    problems = []
    if outcome.status != case.expected_status:
        problems.append(f"status is {outcome.status}, expected {case.expected_status}")
    rep, team = case.expected_rep, case.expected_team
    if rep is not None and outcome.rep.casefold() != rep.email.casefold():
        problems.append(f"owner is {outcome.owner_label}, expected {rep}")
    if team is not None and outcome.team != team.name:
        problems.append(f"team is {outcome.team or '—'}, expected {team.name}")
    return tuple(problems)


def test_cases_run(*, ruleset: RuleSet) -> list[CaseResult]:
    """Run every saved test case against ``ruleset``; writes nothing, moves no turn."""
    cases = RoutingTestCase.objects.select_related("source", "expected_rep", "expected_team")
    results = []
    for case in cases:
        outcome = outcome_simulated(
            lead_data=case.lead,
            source_slug=case.source.slug if case.source else None,
            version=ruleset.version,
        )
        problems = _check(case, outcome)
        results.append(
            CaseResult(case=case, outcome=outcome, passed=not problems, problems=problems)
        )
    return results


test_cases_run.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


# --- Replay -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayRow:
    """A lead whose routing would change under the replayed version."""

    lead: Lead
    before: Outcome
    after: Outcome
    changed: tuple[str, ...]  # "owner", "team", "status"


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """A version replayed over the last processed leads: what would change, and per rep.

    ``changed`` counts every lead that would change; ``rows`` lists the newest of them (at most
    ``REPLAY_ROWS_KEPT``), newest first.
    """

    ruleset: RuleSet
    considered: int
    rows: tuple[ReplayRow, ...]
    per_rep: tuple[tuple[str, int, int, str], ...]  # (rep, before, after, "+3"), most moved first
    changed: int = 0
    at: datetime = field(default_factory=timezone.now)


ReplayProgress = Callable[[int, int], None]  # (leads decided so far, leads in all)


def _before(lead: Lead, active: Assignment | None) -> Outcome:
    if active is None:
        return Outcome(status=lead.status)
    return Outcome(
        status=lead.status,
        rep=active.rep.email,
        rep_name=active.rep.name,
        team=active.team.name if active.team else active.team_name,
        rule=active.rule_name,
        reason=active.reason,
    )


def _crm_owner_after(config: LiveConfig, lead: Lead, snap: Any, now: datetime) -> Outcome | None:
    """A lead its CRM lookup found owned by a rep who can take it now (active, not away) goes
    to that rep, as routing does (from the stored answer: a replay never calls the CRM)."""
    if not lead.crm:
        return None
    found, _notes = crm_person_owner(lead)
    if found is None or rep_unavailable_reason(rep_id=found.rep_id, now=now, reps=snap.reps):
        return None
    rep = snap.reps[found.rep_id]
    # The rep's first team, as routing picks it for a lead owned in the CRM.
    teams = [
        spec
        for team_id, spec in sorted(config.teams.items())
        if any(member == rep.id for member, _weight in spec.members)
    ]
    return Outcome(
        status=LeadStatus.ASSIGNED,
        rep=rep.email,
        rep_name=rep.name,
        team=teams[0].name if teams else "",
        rule="",
        reason=found.reason,
    )


def _after(
    config: LiveConfig,
    lead: Lead,
    snap: Any,
    now: datetime,
    accounts: Mapping[str, AccountFacts] | None = None,
) -> Outcome:
    owned = _crm_owner_after(config, lead, snap, now)
    if owned is not None:
        return owned
    decision = _decide(lead_facts(lead, accounts=accounts), config, snap, now)
    if decision.rotation_update is not None:
        # Carry turns forward in memory, as routing these leads one after another would.
        snap.rotation[decision.rotation_update.team_id] = decision.rotation_update
    decision = replace(decision, rotation_update=None)
    rep = snap.reps.get(decision.rep_id) if decision.rep_id is not None else None
    if rep is not None:
        # And the rep's load: the next lead sees this one among their open and today's leads
        # (caps and least_loaded depend on it; without this, one least-loaded rep took them all).
        snap.reps[rep.id] = replace(
            rep,
            open_count=rep.open_count + 1,
            assigned_today=rep.assigned_today + 1,
            last_assigned_at=now,
        )
    team = config.teams.get(decision.team_id) if decision.team_id is not None else None
    return Outcome(
        status=_OUTCOME_STATUS.get(decision.outcome, LeadStatus.UNASSIGNED),
        rep=rep.email if rep else "",
        rep_name=rep.name if rep else "",
        team=team.name if team else "",
        rule=decision.rule_name or "",
        reason=decision.reason,
    )


def _release(snap: _Snapshot, active: Assignment | None, now: datetime) -> None:
    """Take a replayed lead's own assignment off its holder's load before it is decided again:
    routed anew, the lead would not be among its holder's open leads (nor today's, if it was
    assigned today). Without this a rep at their cap "lost" every lead they hold on a replay of
    unchanged rules. Counts that were not read (no cap, not least-loaded) stay at 0."""
    if active is None or active.rep_id is None:
        return
    rep = snap.reps.get(active.rep_id)
    if rep is None:
        return
    open_count = rep.open_count
    if active.touched_at is None:
        open_count = max(0, open_count - 1)
    assigned_today = rep.assigned_today
    if active.assigned_at >= local_midnight(now, rep.timezone):
        assigned_today = max(0, assigned_today - 1)
    snap.reps[rep.id] = replace(rep, open_count=open_count, assigned_today=assigned_today)


def _replayed_leads(ids: Sequence[Any]) -> list[Lead]:
    """The leads of ``ids`` with their source and current assignment, in the order of ``ids``."""
    leads = (
        Lead.objects.filter(pk__in=ids)
        .select_related("source")
        .prefetch_related(
            Prefetch(
                "assignments",
                queryset=Assignment.objects.filter(active=True).select_related("rep", "team"),
                to_attr="active_assignments",
            )
        )
    )
    by_id = {lead.pk: lead for lead in leads}
    return [by_id[pk] for pk in ids if pk in by_id]


def replay_lead_ids(limit: int) -> list[Any]:
    """The ids of the last ``limit`` processed leads, oldest first (turns rotate in arrival
    order)."""
    ids = list(
        Lead.objects.filter(status__in=_PROCESSED, processed_at__isnull=False)
        .order_by("-processed_at", "-received_at")
        .values_list("pk", flat=True)[:limit]
    )
    ids.reverse()
    return ids


def earliest_arrival(ids: Sequence[Any]) -> datetime | None:
    """When the first of these leads arrived (None for none)."""
    found = [
        Lead.objects.filter(pk__in=ids[start : start + REPLAY_CHUNK]).aggregate(
            first=Min("received_at")
        )["first"]
        for start in range(0, len(ids), REPLAY_CHUNK)
    ]
    return min((moment for moment in found if moment is not None), default=None)


def ruleset_replay(
    *,
    ruleset: RuleSet,
    limit: int = REPLAY_DEFAULT,
    progress: ReplayProgress | None = None,
) -> ReplayResult:
    """Decide the last ``limit`` processed leads with ``ruleset`` and today's reps (each rep's
    live state as it was when the lead arrived: ``routing.timeoff.state_history``); read-only.

    Turns move in memory from one lead to the next (as if they were routed now, oldest first)
    and are never written. At most ``REPLAY_MAX_LEADS`` (a setting) leads; they are read
    ``REPLAY_CHUNK`` at a time, and ``progress`` is called after each chunk. Raises RuleErrors
    when the version does not compile, and ConfigurationBusy when a publish or import of the
    configuration is under way (or starts: it is refused while the replay reads).
    """
    with configuration_reading():
        return _ruleset_replay(ruleset=ruleset, limit=limit, progress=progress)


def _ruleset_replay(
    *, ruleset: RuleSet, limit: int, progress: ReplayProgress | None
) -> ReplayResult:
    limit = max(1, min(limit, settings.REPLAY_MAX_LEADS))
    config = live_config(ruleset.version)
    now = timezone.now()
    snap = _snapshot(config, now)
    ids = replay_lead_ids(limit)
    past = ReplayRepStates(since=earliest_arrival(ids))
    rows: deque[ReplayRow] = deque(maxlen=REPLAY_ROWS_KEPT)  # the newest changes
    changed_count = considered = 0
    before_counts: Counter[str] = Counter()
    after_counts: Counter[str] = Counter()
    for start in range(0, len(ids), REPLAY_CHUNK):
        for lead in _replayed_leads(ids[start : start + REPLAY_CHUNK]):
            considered += 1
            assigned = lead.active_assignments  # type: ignore[attr-defined]  # prefetched
            active = assigned[0] if assigned else None
            before = _before(lead, active)
            _release(snap, active, now)
            # A microsecond apart per lead, so "assigned least recently" orders the replayed
            # assignments as routing them one after another would; each rep as they were when
            # the lead arrived (active, away, on leave), not as they are now.
            at = now + timedelta(microseconds=considered)
            replaced = past.apply(snap.reps, lead.received_at, at)
            after = _after(config, lead, snap, at)
            past.restore(snap.reps, replaced)
            if before.rep:
                before_counts[before.owner_label] += 1
            if after.rep:
                after_counts[after.owner_label] += 1
            changed = outcome_changes(before, after)
            if changed:
                changed_count += 1
                rows.append(ReplayRow(lead=lead, before=before, after=after, changed=changed))
        if progress is not None:
            progress(min(start + REPLAY_CHUNK, len(ids)), len(ids))
    reps = set(before_counts) | set(after_counts)
    per_rep = sorted(
        (
            (
                rep,
                before_counts[rep],
                after_counts[rep],
                f"{after_counts[rep] - before_counts[rep]:+d}",
            )
            for rep in reps
        ),
        key=lambda row: (-abs(row[2] - row[1]), row[0]),
    )
    return ReplayResult(
        ruleset=ruleset,
        considered=considered,
        rows=tuple(reversed(rows)),  # newest first on the page
        per_rep=tuple(per_rep),
        changed=changed_count,
    )


def _outcome_data(outcome: Outcome) -> dict[str, Any]:
    return {
        "status": outcome.status,
        "owner": outcome.owner_label,
        "team": outcome.team,
        "rule": outcome.rule,
    }


def replay_result_data(result: ReplayResult) -> dict[str, Any]:
    """A replay's result as plain JSON: what the replay page shows, kept by a background run."""
    return {
        "ruleset_version": result.ruleset.version,
        "considered": result.considered,
        "changed": result.changed,
        "at": result.at.isoformat(),
        "per_rep": [list(row) for row in result.per_rep],
        "rows": [
            {
                "lead_id": str(row.lead.pk),
                "email": row.lead.email,
                "company": row.lead.company,
                "country": row.lead.country,
                "changed": list(row.changed),
                "before": _outcome_data(row.before),
                "after": _outcome_data(row.after),
            }
            for row in result.rows
        ],
    }


# --- Rotation state, for people -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NextUp:
    """Who gets the team's next lead, and the members passed over (and why)."""

    rep: str  # "Ana <ana@example.com>", or "" when nobody is eligible
    skipped: tuple[str, ...]
    why: str


def team_next_up(*, team: Team) -> NextUp:
    """Who the team's strategy would pick for the next lead now; reads only.

    With a published version, eligibility (out of office, caps, working hours) counts as when
    routing; without one, only the turn is known and every active member counts as eligible.
    """

    now = timezone.now()
    try:
        config = live_config()
    except (RulesetNotFound, RuleErrors):
        config = None
    if config is not None and team.pk in config.teams:
        snap = _snapshot(config, now)
        spec = config.teams[team.pk]
        reps = snap.reps
        state = snap.rotation.get(team.pk)
    else:
        members = list(team.memberships.select_related("rep").order_by("position", "id"))
        spec = TeamSpec(
            id=team.pk,
            name=team.name,
            strategy=team.strategy,  # type: ignore[arg-type]  # a check constraint holds it
            members=tuple((m.rep_id, m.weight) for m in members),
        )
        reps = {
            m.rep_id: RepState(id=m.rep_id, email=m.rep.email, name=m.rep.name, active=m.rep.active)
            for m in members
        }
        state = RotationState.from_json(team.pk, team.rotation_state)
    choice = choose_member(spec, reps, state, now)
    rep = reps.get(choice.rep_id) if choice.rep_id is not None else None
    return NextUp(
        rep=f"{rep.name} <{rep.email}>" if rep is not None else "",
        skipped=choice.skipped,
        why=choice.why,
    )


@transaction.atomic
def team_memberships_renumber(*, team: Team, membership_ids: Sequence[int]) -> None:
    """Number a team's members 0, 1, 2, ... in the order of ``membership_ids``.

    Members not listed keep their relative order after the listed ones. The positions move out
    of the way first, since the unique (team, position) constraint is deferred only on
    PostgreSQL.
    """
    memberships = list(TeamMembership.objects.select_for_update().filter(team=team))
    rank = {pk: i for i, pk in enumerate(membership_ids)}
    ordered = sorted(memberships, key=lambda m: (rank.get(m.pk, len(rank)), m.position, m.pk))
    top = max((m.position for m in memberships), default=0) + 1
    TeamMembership.objects.filter(team=team).update(position=F("position") + top)
    for position, membership in enumerate(ordered):
        TeamMembership.objects.filter(pk=membership.pk).update(position=position)


@transaction.atomic
def reps_set_out_of_office(*, reps: Iterable[Rep], until: datetime) -> int:
    """Mark reps out of office until ``until``; returns how many changed."""
    ids = [rep.pk for rep in reps]
    return Rep.objects.filter(pk__in=ids).update(
        out_of_office_until=until, updated_at=timezone.now()
    )


@transaction.atomic
def reps_deactivate(*, reps: Iterable[Rep]) -> int:
    """Deactivate reps: they get no new leads (their open leads stay theirs until reassigned)."""
    ids = [rep.pk for rep in reps]
    return Rep.objects.filter(pk__in=ids, active=True).update(
        active=False, updated_at=timezone.now()
    )


def expected_status_of(outcome: str) -> str:
    """The test-case status a decision outcome corresponds to."""
    return str(_OUTCOME_STATUS.get(outcome, ExpectedStatus.UNASSIGNED))
