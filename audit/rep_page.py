"""The rep's own page: their open leads with SLA countdowns, and their planned time off.

Everything here is read through the rep (``Assignment.rep``, ``RepAbsence.rep``), never by a
lead or absence id alone, so nothing of another rep's can reach the page.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F

from audit.selectors import sla_state
from routing.models import Assignment, Rep
from routing.timeoff.models import RepAbsence

# The most leads the page lists in each table (a rep with more has a bigger problem than paging).
PAGE_LIMIT = 200
TOUCHED_SHOWN_DAYS = 7


@dataclass(frozen=True)
class RepLeadRow:
    lead_id: uuid.UUID
    who: str
    email: str
    phone: str
    company: str
    priority: str
    tags: tuple[str, ...]
    reason: str
    assigned_at: datetime
    sla_due_at: datetime | None
    sla_state: str  # "open", "breached", "met", "none"
    sla_label: str
    touched_at: datetime | None


@dataclass(frozen=True)
class RepPage:
    rep: Rep
    waiting: list[RepLeadRow]
    touched: list[RepLeadRow]
    absences: list[RepAbsence]
    now: datetime


def _row(assignment: Assignment, now: datetime) -> RepLeadRow:
    lead = assignment.lead
    sla = sla_state(assignment, now=now)
    return RepLeadRow(
        lead_id=lead.pk,
        who=lead.full_name or lead.email or lead.phone or "—",
        email=lead.email,
        phone=lead.phone,
        company=lead.company,
        priority=assignment.priority or lead.priority or "",
        tags=tuple(assignment.tags or lead.tags or ()),
        reason=assignment.reason,
        assigned_at=assignment.assigned_at,
        sla_due_at=assignment.sla_due_at,
        sla_state=sla.state,
        sla_label=sla.label,
        touched_at=assignment.touched_at,
    )


def rep_page_read(*, rep: Rep, now: datetime) -> RepPage:
    """The rep's current leads (waiting for a first touch, soonest SLA first; touched in the
    last week) and their absences that have not ended."""
    mine = Assignment.objects.filter(rep=rep, active=True).select_related("lead")
    waiting = mine.filter(touched_at__isnull=True).order_by(
        F("sla_due_at").asc(nulls_last=True), "assigned_at", "pk"
    )[:PAGE_LIMIT]
    touched = mine.filter(touched_at__gte=now - timedelta(days=TOUCHED_SHOWN_DAYS)).order_by(
        "-touched_at", "-pk"
    )[:PAGE_LIMIT]
    absences = RepAbsence.objects.filter(rep=rep, ends_at__gt=now).order_by("starts_at", "pk")
    return RepPage(
        rep=rep,
        waiting=[_row(a, now) for a in waiting],
        touched=[_row(a, now) for a in touched],
        absences=list(absences),
        now=now,
    )
