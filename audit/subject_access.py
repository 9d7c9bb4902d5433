"""Subject access (issue 21): everything LeadRouter holds about one person, as one JSON document.

``person_export`` finds the person as erasure does (routing.erasure.person_identify: the e-mail
and phone given, their keys' lookup hashes, the raw payloads of leads not yet normalised, and
every e-mail those leads hold) and gathers, per lead: every column of the lead (through the
model, so none is forgotten), the payload as received, custom values, enrichment, CRM and fetch
results, every assignment (rep, team, rule, when, SLA, first touch, its trace), every audit event
in the words of the lead page with its data and trace opened (the sealed parts read in clear, or
"erased person" once the person is erased), every delivery (channel, status, when, the body
sent, each attempt's error and response excerpt), the admin's change log lines about it; and the
refused inbox rows that hold the e-mail or phone. An erased person
exports as what remains: the decisions, with "erased person" where their data was.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Prefetch
from django.utils import timezone

from audit.models import Event
from audit.selectors import decision_sentence, timeline_entry
from leads.models import Lead, RefusedPayload
from routing.delivery.models import Delivery, DeliveryAttempt
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
# Lead columns exported under names of their own (not in ``fields``), or not the person's: the
# key's id (internal) and the source (``source``, its slug).
_LEAD_ELSEWHERE = frozenset(
    {"id", "source", "raw_payload", "custom", "enrichment", "crm", "fetch", "person_key"}
)


class SubjectAccessRefused(ValueError):
    """The request names no person (no e-mail and no phone)."""


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _plain(value: Any) -> Any:
    """A column's value as JSON: times in ISO 8601, decimals and ids as strings."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    return value


def _lead_fields(lead: Lead) -> dict[str, Any]:
    """Every column of the lead (going through the model, so a column added later is exported
    too), but those exported under names of their own."""
    out: dict[str, Any] = {}
    for field in Lead._meta.concrete_fields:
        if field.name in _LEAD_ELSEWHERE:
            continue
        name = field.attname if field.is_relation else field.name
        out[name] = _plain(getattr(lead, field.attname))
    return out


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
        "sla_minutes": assignment.sla_minutes,
        "sla_due_at": _when(assignment.sla_due_at),
        "sla_breached_at": _when(assignment.sla_breached_at),
        "first_touch_at": _when(assignment.touched_at),
        "first_touch_by": assignment.touch_source,
        "trace": assignment.trace,
    }


def _event(event: Event) -> dict[str, Any]:
    entry = timeline_entry(event)
    words = entry.label
    if entry.who:
        words += f": {entry.who}"
    if entry.detail:
        words += f" ({entry.detail})"
    out = {
        "at": _when(event.at),
        "type": event.type,
        "by": event.actor,
        "words": words,
        "rep": event.rep_name,
        "team": event.team_name,
        "rule": event.rule_name,
        "ruleset_version": event.ruleset_version,
        # Opened: the sealed parts in clear (or "erased person" once the person is erased).
        "data": event.data,
        "trace": event.trace,
    }
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
        "last_error": delivery.last_error,
        "attempt_log": [
            {
                "number": attempt.number,
                "at": _when(attempt.at),
                "outcome": attempt.outcome,
                "status_code": attempt.status_code,
                "error": attempt.error,
                "response_excerpt": attempt.response_excerpt,
            }
            for attempt in delivery.attempt_log.all()
        ],
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


def _admin_log(lead: Lead) -> list[dict[str, Any]]:
    """The admin's change log lines about the lead (they name it by its e-mail)."""
    from django.contrib.admin.models import LogEntry
    from django.contrib.contenttypes.models import ContentType

    lines = LogEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(Lead), object_id=str(lead.pk)
    ).order_by("action_time", "pk")
    return [
        {
            "at": _when(line.action_time),
            "action": line.get_action_flag_display(),
            "object": line.object_repr,
            "change": line.get_change_message(),
        }
        for line in lines
    ]


def _lead(lead: Lead) -> dict[str, Any]:
    assignments = Assignment.objects.filter(lead=lead).order_by("assigned_at", "pk")
    deliveries = (
        Delivery.objects.filter(assignment__lead=lead)
        .prefetch_related(Prefetch("attempt_log", DeliveryAttempt.objects.order_by("number")))
        .order_by("created_at", "pk")
    )
    events = Event.objects.filter(chain=str(lead.pk)).order_by("seq")
    return {
        "id": str(lead.pk),
        "erased": is_erased(lead),
        "source": lead.source.slug,
        "received_at": _when(lead.received_at),
        "status": lead.status,
        "fields": _lead_fields(lead),
        "custom": lead.custom,
        "as_received": lead.raw_payload,
        "enrichment": lead.enrichment,
        "crm": lead.crm,
        "fetched": lead.fetch,
        "assignments": [_assignment(a) for a in assignments],
        "events": [_event(e) for e in events],
        "deliveries": [_delivery(d) for d in deliveries],
        "admin_log": _admin_log(lead),
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
