"""Subject access (issue 21): everything LeadRouter holds about one person, as one JSON document.

``person_export`` finds the person as erasure does (routing.erasure.person_identify: the e-mail
and phone given, their keys' lookup hashes, the raw payloads of leads not yet normalised, and
every e-mail those leads hold) and gathers, per lead: its fields, the payload as received, custom
values, enrichment, CRM and fetch results, every assignment (rep, team, rule, when, SLA, first
touch), every audit event in the words of the lead page (opened: the sealed parts read in
clear, or "erased person" once the person is erased), every delivery (channel, status, when,
the body sent); and the refused inbox rows that hold the e-mail or phone. An erased person
exports as what remains: the decisions, with "erased person" where their data was.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from django.utils import timezone

from audit.models import Event
from audit.selectors import decision_sentence, timeline_entry
from leads.models import Lead, RefusedPayload
from routing.delivery.models import Delivery
from routing.erasure import (
    ErasureRefused,
    is_erased,
    person_identifiers_check,
    person_identify,
    refused_ids_holding,
)
from routing.models import Assignment

logger = logging.getLogger(__name__)

FORMAT = "leadrouter.subject-access/1"
LEAD_FIELDS = (
    "first_name",
    "last_name",
    "email",
    "phone",
    "company",
    "title",
    "country",
    "city",
    "postal_code",
)


class SubjectAccessRefused(ValueError):
    """The request names no person (no e-mail and no phone)."""


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _assignment(assignment: Assignment) -> dict[str, Any]:
    return {
        "assigned_at": _when(assignment.assigned_at),
        "rep": assignment.rep_name,
        "team": assignment.team_name,
        "rule": assignment.rule_name,
        "ruleset_version": assignment.ruleset_version,
        "kind": assignment.kind,
        "reason": assignment.reason,
        "current_owner": assignment.active,
        "priority": assignment.priority,
        "tags": list(assignment.tags or []),
        "sla_due_at": _when(assignment.sla_due_at),
        "sla_breached_at": _when(assignment.sla_breached_at),
        "first_touch_at": _when(assignment.touched_at),
    }


def _event(event: Event) -> dict[str, Any]:
    entry = timeline_entry(event)
    words = entry.label
    if entry.who:
        words += f": {entry.who}"
    if entry.detail:
        words += f" ({entry.detail})"
    out = {"at": _when(event.at), "type": event.type, "by": event.actor, "words": words}
    sentence = decision_sentence(event)
    if sentence:
        out["decision"] = sentence
    return out


def _delivery(delivery: Delivery) -> dict[str, Any]:
    return {
        "channel": delivery.channel,
        "event": delivery.event,
        "status": delivery.status,
        "created_at": _when(delivery.created_at),
        "delivered_at": _when(delivery.delivered_at),
        "attempts": delivery.attempts,
        "recipient": delivery.recipient,
        "body": delivery.payload,
    }


def _refused(row: RefusedPayload) -> dict[str, Any]:
    body = bytes(row.body or b"")
    try:
        text: Any = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", errors="replace")
    return {
        "received_at": _when(row.received_at),
        "source": row.source.slug,
        "refused_because": row.reason,
        "status_code": row.status_code,
        "body": text,
    }


def _lead(lead: Lead) -> dict[str, Any]:
    assignments = Assignment.objects.filter(lead=lead).order_by("assigned_at", "pk")
    deliveries = Delivery.objects.filter(assignment__lead=lead).order_by("created_at", "pk")
    events = Event.objects.filter(chain=str(lead.pk)).order_by("seq")
    return {
        "id": str(lead.pk),
        "erased": is_erased(lead),
        "source": lead.source.slug,
        "received_at": _when(lead.received_at),
        "status": lead.status,
        "fields": {name: getattr(lead, name, "") for name in LEAD_FIELDS},
        "custom": lead.custom,
        "as_received": lead.raw_payload,
        "enrichment": lead.enrichment,
        "crm": lead.crm,
        "fetched": lead.fetch,
        "assignments": [_assignment(a) for a in assignments],
        "events": [_event(e) for e in events],
        "deliveries": [_delivery(d) for d in deliveries],
    }


def person_export(
    *, email: str = "", phone: str = "", actor: str = "", lead_ids: list[Any] | None = None
) -> dict[str, Any]:
    """Everything held about the person with this e-mail or phone, or of these leads (see the
    module's words). Logged (who asked, how much was found; nothing personal)."""
    if not email.strip() and not phone.strip() and not lead_ids:
        raise SubjectAccessRefused("name the person: an e-mail or a phone")
    if not lead_ids:  # typed by someone: a whole e-mail or phone, never a fragment
        try:
            email, phone = person_identifiers_check(email, phone)
        except ErasureRefused as error:
            raise SubjectAccessRefused(str(error)) from None
    leads, emails, phones = person_identify(email=email, phone=phone, lead_ids=lead_ids)
    refused = RefusedPayload.objects.filter(pk__in=refused_ids_holding(emails, phones))
    document: dict[str, Any] = {
        "format": FORMAT,
        "generated_at": _when(timezone.now()),
        "requested_by": actor,
        "person": {"emails": sorted(emails), "phones": sorted(phones)},
        "leads": [
            _lead(lead)
            for lead in Lead.objects.filter(pk__in=[x.pk for x in leads])
            .select_related("source")
            .order_by("received_at", "pk")
        ],
        "refused_payloads": [_refused(r) for r in refused.select_related("source")],
    }
    document["found"] = bool(document["leads"] or document["refused_payloads"])
    logger.info(
        "subject access export by %s: %d lead(s), %d refused payload(s)",
        actor or "unknown",
        len(document["leads"]),
        len(document["refused_payloads"]),
    )
    return document
