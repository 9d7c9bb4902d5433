"""The JSON documents of the configuration API that a background job also stores: a version, a
draft's check, a publish's result, and a refusal in the API's error shape (``config.errors``).

The configuration API answers with them, and a publish, rollback or test run by a worker
(``routing.admin_jobs``) stores them as its result or error, so that the job's result is what
the synchronous call answered. ``json_ready`` turns one into what the API renders (dates as
DRF writes them), fit for a JSONField.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rest_framework.utils.encoders import JSONEncoder

from routing.configuration import ConfigurationBusy, ConfigurationCheck
from routing.drafts.services import ConfigPublish, DraftRefused, DraftStale
from routing.engine import RuleErrors
from routing.rules_io import PruneRefused
from routing.versions import TestCasesFailing

if TYPE_CHECKING:
    from routing.drafts.diff import RowChange
    from routing.drafts.models import ConfigSnapshot
    from routing.versions import Outcome

# What a publish, rollback or check refuses with (each becomes a ``Refusal``).
REFUSALS = (DraftRefused, ConfigurationBusy, TestCasesFailing, RuleErrors)


def json_ready(document: Any) -> Any:
    """``document`` as the API renders it (datetimes in ISO 8601): plain JSON."""
    return json.loads(json.dumps(document, cls=JSONEncoder))


def version_document(snapshot: ConfigSnapshot, *, whole: bool = True) -> dict[str, Any]:
    """A configuration version as the API shows it."""
    data: dict[str, Any] = {
        "number": snapshot.number,
        "kind": snapshot.kind,
        "ruleset_version": snapshot.ruleset_version,
        "published_at": snapshot.published_at,
        "published_by": snapshot.published_by,
        "note": snapshot.note,
        "rolled_back_to": snapshot.rolled_back_to,
        "failing_test_cases": snapshot.failing_test_cases,
    }
    if whole:
        data["document"] = snapshot.document
    return data


def changes_document(changes: list[RowChange]) -> list[dict[str, Any]]:
    return [change.to_json() for change in changes]


def publish_document(result: ConfigPublish) -> dict[str, Any]:
    """What a publish or rollback did, as the API shows it."""
    return {
        "version": version_document(result.snapshot, whole=False),
        "changes": changes_document(result.changes),
        "failing_test_cases": list(result.failing),
        "source_tokens": result.source_tokens,
    }


def _outcome(outcome: Outcome) -> dict[str, Any]:
    return {
        "status": outcome.status,
        "rep": outcome.rep or None,
        "team": outcome.team or None,
        "rule": outcome.rule or None,
        "reason": outcome.reason,
        **({"error": outcome.error} if outcome.error else {}),
    }


def check_document(check: ConfigurationCheck) -> dict[str, Any]:
    """A draft's test run as the API shows it."""
    return {
        "test_cases": [
            {
                "name": result.case.name,
                "passed": result.passed,
                "problems": list(result.problems),
                "outcome": _outcome(result.outcome),
            }
            for result in check.results
        ],
        "failing": len(check.failing),
        "replay": (
            None
            if check.published_version is None
            else {
                "published_ruleset_version": check.published_version,
                "considered": check.considered,
                "changed": check.changed,
                "leads": [
                    {
                        "lead": str(row.lead.pk),
                        "changed": list(row.changed),
                        "published": _outcome(row.before),
                        "draft": _outcome(row.after),
                    }
                    for row in check.rows[:100]
                ],
                "per_rep": [
                    {"rep": rep, "published": before, "draft": after}
                    for rep, before, after in check.per_rep
                ],
            }
        ),
    }


@dataclass(frozen=True)
class Refusal:
    """A refused publish, rollback or check in the API's error shape, and its HTTP status."""

    status: int
    code: str
    message: str
    fields: dict[str, list[str]] | None = None

    def as_error(self) -> dict[str, Any]:
        """The ``error`` object of api.md's error document."""
        return {
            "code": self.code,
            "message": self.message,
            **({"fields": self.fields} if self.fields else {}),
        }

    def in_words(self) -> str:
        """The message, and each field's problems, for a person (the admin's job page)."""
        details = "; ".join(
            f"{field}: {', '.join(problems)}" for field, problems in (self.fields or {}).items()
        )
        return f"{self.message} {details}" if details else self.message


def refusal_of(exc: Exception) -> Refusal:
    """A service's refusal (one of ``REFUSALS``) in the API's error shape; anything else is
    raised again."""
    if isinstance(exc, DraftStale):
        return Refusal(
            exc.status,
            exc.code,
            exc.message,
            {"published_since": [change.words for change in exc.changes[:50]]},
        )
    if isinstance(exc, DraftRefused):
        return Refusal(exc.status, exc.code, exc.message)
    if isinstance(exc, ConfigurationBusy):
        return Refusal(409, "configuration_busy", str(exc))
    if isinstance(exc, TestCasesFailing):
        return Refusal(
            422,
            "test_cases_failing",
            f"{exc} Nothing was published; publish with force to publish over them.",
            {
                f"test_cases.{result.case.name}": list(result.problems) or ["failed"]
                for result in exc.results
                if not result.passed
            },
        )
    if isinstance(exc, RuleErrors):
        fields: dict[str, list[str]] = {}
        for error in exc.errors:
            fields.setdefault(error.path or "non_field_errors", []).append(error.message)
        if isinstance(exc, PruneRefused):
            return Refusal(
                409,
                "prune_refused",
                "Rows the draft removes are still needed; nothing was written.",
                fields,
            )
        return Refusal(
            400, "invalid_document", "The configuration is invalid; nothing was written.", fields
        )
    raise exc
