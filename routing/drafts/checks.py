"""A draft's check in words: its test cases (pass or fail, and the decision's trace) and the
replay of recent leads, each changed lead said as "lead X: Ana → Bo because …", naming the
draft's row changes the two decisions went through. Plain JSON: what the admin's check page
shows and what a background replay job keeps (``routing.admin_jobs``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from leads.models import Lead
from routing.configuration import ConfigurationCheck
from routing.drafts.diff import RowChange
from routing.drafts.models import ConfigDraft
from routing.drafts.services import draft_check, draft_diff
from routing.versions import Outcome

_BECAUSE_SHOWN = 3
_UNRELATED = frozenset({"test_cases"})  # a test case never decides a lead


def _who(outcome: Outcome) -> str:
    if outcome.error:
        return "an error"
    if outcome.rep:
        return outcome.rep_name or outcome.rep
    if outcome.team:
        return f"team {outcome.team}, nobody eligible"
    return outcome.status or "—"


def _outcome_data(outcome: Outcome) -> dict[str, Any]:
    return {
        "status": outcome.status,
        "owner": outcome.owner_label,
        "team": outcome.team,
        "rule": outcome.rule,
        "reason": outcome.reason,
        "trace": list(outcome.trace),
        "error": outcome.error,
    }


def _involved(lead: Lead, before: Outcome, after: Outcome, changes: list[RowChange]) -> list[str]:
    """The draft's row changes the two decisions name (a rule, team, territory, rep or value
    list in their reasons and traces, as a whole name: "AE" is not named by "Israel"; the
    lead's own account by its domain)."""
    said = " ".join(
        [
            before.reason,
            after.reason,
            before.rule,
            after.rule,
            before.team,
            after.team,
            before.rep,
            after.rep,
            *before.trace,
            *after.trace,
        ]
    ).casefold()
    domain = (lead.email_domain or lead.email.rpartition("@")[2]).casefold()
    found = []
    for change in changes:
        key = str(change.key).casefold()
        if change.section in _UNRELATED or not key:
            continue
        named = re.search(rf"(?<!\w){re.escape(key)}(?!\w)", said) is not None
        if (key == domain) if change.section == "accounts" else named:
            found.append(change.words)
    return found


def decision_change_words(
    *, lead: Lead, before: Outcome, after: Outcome, changes: list[RowChange]
) -> str:
    """One changed lead in words: "lead ana@acme.com: Ana → Bo because Territory "Bavaria":
    team EMEA SDR → DACH AE"; without a row change to name, the draft's own reason."""
    found = _involved(lead, before, after, changes)
    because = "; ".join(found[:_BECAUSE_SHOWN])
    if len(found) > _BECAUSE_SHOWN:
        because += f" and {len(found) - _BECAUSE_SHOWN} more"
    if not because:
        because = f"with the draft: {after.error or after.reason or after.status}"
    return f"lead {lead.email or lead.pk}: {_who(before)} → {_who(after)} because {because}"


def draft_check_data(*, check: ConfigurationCheck, changes: list[RowChange]) -> dict[str, Any]:
    """A draft's check as plain JSON: test cases with their traces, and the replay's changed
    leads in words (``changes``: what the draft changes against the published configuration)."""
    return {
        "at": check.at.isoformat(),
        "failing": len(check.failing),
        "test_cases": [
            {
                "name": result.case.name,
                "passed": result.passed,
                "problems": list(result.problems),
                "expected": {
                    "status": result.case.expected_status,
                    "rep": result.case.expected_rep,
                    "team": result.case.expected_team,
                },
                "outcome": _outcome_data(result.outcome),
            }
            for result in check.results
        ],
        "replay": (
            None
            if check.published_version is None
            else {
                "published_ruleset_version": check.published_version,
                "considered": check.considered,
                "changed": check.changed,
                "rows": [
                    {
                        "lead_id": str(row.lead.pk),
                        "words": decision_change_words(
                            lead=row.lead, before=row.before, after=row.after, changes=changes
                        ),
                        "changed": list(row.changed),
                        "before": _outcome_data(row.before),
                        "after": _outcome_data(row.after),
                    }
                    for row in check.rows
                ],
                "per_rep": [
                    [rep, before, after, after - before] for rep, before, after in check.per_rep
                ],
            }
        ),
    }


def draft_check_report(
    *, draft: ConfigDraft, leads: int, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """``draft_check`` of the draft (its test cases; with ``leads``, a replay of that many) as
    ``draft_check_data`` has it, the changed leads said with the draft's row changes; reads
    only. Raises RulesFileErrors (the draft is invalid against the tables now) and
    ConfigurationBusy (a publish or import under way)."""
    check = draft_check(draft=draft, leads=leads, progress=progress)
    changes = draft_diff(draft=draft).changes if check.published_version is not None else []
    data = draft_check_data(check=check, changes=changes)
    if not leads:
        data["replay"] = None  # the test cases only
    return data
