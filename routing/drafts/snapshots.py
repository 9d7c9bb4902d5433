"""The published configuration as one document, and the numbered snapshots of it.

Lower than ``routing.configuration`` (which records a snapshot when ``routing_import --publish``
changed the configuration) and ``routing.drafts.services``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from django.db.models import Max
from django.utils import timezone

from routing.drafts.models import ConfigSnapshot
from routing.models import Rep
from routing.rules_io import rules_export

# A rep's live state and planned time off are facts about people, kept live (the roster API,
# the admin), never part of a configuration version: a rollback must not bring back who was
# away a month ago.
LIVE_REP_KEYS = ("active", "out_of_office_until", "absences")


def configuration_document() -> dict[str, Any]:
    """The published configuration as a rules-as-code document, without reps' live state.

    Raises RuleSet.DoesNotExist when nothing is published.
    """
    document = rules_export()
    for rep in document["reps"]:
        for key in LIVE_REP_KEYS:
            rep.pop(key, None)
    return document


def document_digest(document: Mapping[str, Any]) -> str:
    """SHA-256 of the document in a canonical JSON form (keys sorted)."""
    text = json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()


def config_snapshot_latest() -> ConfigSnapshot | None:
    """The newest configuration version, if any."""
    return ConfigSnapshot.objects.order_by("-number").first()


def config_snapshot_record(
    *,
    kind: str,
    document: Mapping[str, Any],
    ruleset_version: int,
    actor: str,
    note: str = "",
    rolled_back_to: int | None = None,
    failing_test_cases: Sequence[str] = (),
) -> ConfigSnapshot:
    """Store the next numbered snapshot. Call it holding the configuration lock
    (``routing.configuration.configuration_lock``), which serialises the numbering."""
    latest = ConfigSnapshot.objects.aggregate(latest=Max("number"))["latest"] or 0
    return ConfigSnapshot.objects.create(
        number=latest + 1,
        kind=kind,
        document=dict(document),
        digest=document_digest(document),
        ruleset_version=ruleset_version,
        published_at=timezone.now(),
        published_by=actor[:200],
        note=note,
        rolled_back_to=rolled_back_to,
        failing_test_cases=list(failing_test_cases),
        rep_ids={email.lower(): pk for pk, email in Rep.objects.values_list("pk", "email")},
    )
