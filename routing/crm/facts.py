"""What routing reads from a finished CRM lookup (``lead.crm``): no calls, no writes.

``crm_person_owner`` (an owner who already has the person in a CRM), ``crm_account`` (a CRM
company's owner feeding account ownership) and ``crm_trace_notes`` (the trace's lines). The
pipeline, replay and the lead page read the same stored answer, so a decision can be explained
and replayed without asking the CRM again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from routing.crm.models import CrmKind
from routing.engine import AccountFacts

logger = logging.getLogger(__name__)


def crm_entries(crm: Any) -> list[tuple[str, dict[str, Any]]]:
    """A lead's lookup results by kind, by connection age (the first connection's owner wins)."""
    record = crm if isinstance(crm, dict) else {}
    entries = [
        (kind, entry)
        for kind, entry in record.items()
        if not kind.startswith("_") and isinstance(entry, dict)
    ]
    return sorted(entries, key=lambda item: (item[1].get("connection") or 0, item[0]))


def crm_label(kind: str) -> str:
    """HubSpot, Salesforce (or the kind as stored)."""
    try:
        return str(CrmKind(kind).label)
    except ValueError:
        return kind


@dataclass(frozen=True)
class CrmOwnerFound:
    """A person already owned in a CRM by someone who maps to a rep."""

    kind: str
    rep_id: int
    rep_name: str
    person: dict[str, Any]

    @property
    def reason(self) -> str:
        obj = self.person.get("object") or "record"
        return (
            f"already owned in {crm_label(self.kind)} by {self.rep_name} "
            f"({obj} {self.person.get('id')})"
        )


def crm_person_owner(lead: Any, *, log: bool = False) -> tuple[CrmOwnerFound | None, list[str]]:
    """The first CRM owner of this lead's person who is a rep, and notes on the others.

    ``log``: the pipeline's call (not replay's) logs an owner who is no rep, at INFO with the
    lead id: the lead is routed by the rules, and a missing roster link shows in the logs."""
    notes: list[str] = []
    for kind, entry in crm_entries(lead.crm):
        if entry.get("status") != "done" or not entry.get("honour_owner", True):
            continue
        person = entry.get("person")
        owner = entry.get("person_owner")
        if not isinstance(person, dict) or not isinstance(owner, dict):
            continue
        if owner.get("rep_id") is None:
            if owner.get("owner_id"):
                note = (
                    f"{crm_label(kind)}: {person.get('object')} {person.get('id')} is owned by "
                    f"{owner.get('owner_email') or owner.get('owner_id')}, who is no rep"
                )
                notes.append(note)
                if log:
                    logger.info(
                        "lead %s: %s: routed by the rules",
                        lead.pk,
                        note,
                        extra={"lead_id": str(lead.pk)},
                    )
            continue
        if owner.get("active_in_crm") is False:
            notes.append(
                f"{crm_label(kind)}: {person.get('object')} {person.get('id')} is owned by "
                f"{owner.get('rep_name') or owner.get('owner_email')}, whose "
                f"{crm_label(kind)} user is deactivated: routed by the rules"
            )
            continue
        return (
            CrmOwnerFound(
                kind=kind,
                rep_id=int(owner["rep_id"]),
                rep_name=str(owner.get("rep_name") or ""),
                person=person,
            ),
            notes,
        )
    return None, notes


def crm_account(lead: Any, local: AccountFacts | None) -> AccountFacts | None:
    """The account facts with what the CRM said: a CRM company's owner (a rep) is the owner.

    Live CRM state wins over an account typed in or imported; the local account keeps its
    tier (the CRM has none in our terms). Without a local account the CRM company is one.
    """
    for _kind, entry in crm_entries(lead.crm):
        if entry.get("status") != "done":
            continue
        company = entry.get("company")
        if not isinstance(company, dict):
            continue
        owner = entry.get("company_owner") if isinstance(entry.get("company_owner"), dict) else {}
        rep_id = owner.get("rep_id") if isinstance(owner, dict) else None
        if isinstance(owner, dict) and owner.get("active_in_crm") is False:
            rep_id = None  # the owner's CRM user is deactivated: not an owner to route to
        if local is not None:
            if rep_id is None:
                return local
            return AccountFacts(
                name=local.name, tier=local.tier, domain=local.domain, owner_rep_id=int(rep_id)
            )
        return AccountFacts(
            name=str(company.get("name") or "") or None,
            tier=None,
            domain=str(company.get("domain") or "") or None,
            owner_rep_id=int(rep_id) if rep_id is not None else None,
        )
    return local


def crm_trace_notes(lead: Any) -> list[str]:
    """Lines for the routing trace: what each CRM said, or that it was routed without it."""
    notes: list[str] = []
    for kind, entry in crm_entries(lead.crm):
        label = crm_label(kind)
        if entry.get("status") == "failed":
            notes.append(
                f"{label} unavailable for this lead: {entry.get('reason') or 'unknown'}; "
                "routed without it"
            )
            continue
        if entry.get("status") != "done":
            continue
        notes.append(f"{label}: {entry.get('summary') or 'looked up'}")
    return notes
