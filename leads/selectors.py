"""Read queries of the leads app."""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import django_filters
from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import (
    Case,
    Exists,
    IntegerField,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Value,
    When,
)
from django_filters.fields import IsoDateTimeField

from leads.models import CANONICAL_COLUMNS, Lead, LeadStatus, LeadTag, Source
from leads.priority import TAG_MAX_LENGTH, priority_clean

_SLUG = re.compile(r"[-a-zA-Z0-9_]{1,64}")
_source_cache: dict[str, tuple[float, Source]] = {}


def source_for_intake(*, slug: str) -> Source | None:
    """The active source behind an intake URL, or None.

    Kept in this process for ``SOURCE_CACHE_SECONDS`` (a query saved on every intake request),
    so a token rotation or deactivation takes up to that long to reach every web process.
    Unknown slugs are not cached.
    """
    if not _SLUG.fullmatch(slug):
        return None  # also keeps NUL and other bytes PostgreSQL refuses out of the query
    ttl = settings.SOURCE_CACHE_SECONDS
    now = time.monotonic()
    if ttl > 0:
        cached = _source_cache.get(slug)
        if cached is not None and cached[0] > now:
            return cached[1]
    source = Source.objects.filter(slug=slug, active=True).first()
    if source is not None and ttl > 0:
        if len(_source_cache) > 10_000:
            _source_cache.clear()
        _source_cache[slug] = (now + ttl, source)
    else:
        _source_cache.pop(slug, None)
    return source


def lead_list() -> QuerySet[Lead]:
    """Leads newest first, with what their API document needs."""
    from audit.models import Event
    from routing.models import Assignment  # routing depends on leads, not the reverse

    current = Assignment.objects.filter(active=True).select_related("rep")
    timeline = Event.objects.order_by("seq")
    return (
        Lead.objects.select_related("source")
        .prefetch_related(
            Prefetch("assignments", queryset=current, to_attr="current_assignments"),
            Prefetch("events", queryset=timeline, to_attr="timeline"),
        )
        .order_by("-received_at", "-id")
    )


def lead_list_for(user: Any) -> QuerySet[Lead]:
    """``lead_list()`` limited to what ``user`` may see (HISTORY_SCOPE_TO_MANAGED_TEAMS)."""
    from audit.selectors import managed_team_ids
    from routing.models import Assignment

    leads = lead_list()
    teams = managed_team_ids(user)
    if teams is None:
        return leads
    owned = Assignment.objects.filter(lead=OuterRef("pk"), active=True, team_id__in=teams)
    return leads.filter(Exists(owned))


def lead_get(*, lead_id: str | uuid.UUID, user: Any = None) -> Lead | None:
    """One lead (with what its document needs); None when absent or not visible to ``user``."""
    try:
        lead_uuid = uuid.UUID(str(lead_id))
    except ValueError:
        return None
    leads = lead_list() if user is None else lead_list_for(user)
    return leads.filter(id=lead_uuid).first()


def lead_fields(lead: Lead) -> dict[str, Any]:
    """The canonical fields that have a value, plus ``custom``."""
    out: dict[str, Any] = {}
    for name in CANONICAL_COLUMNS:
        value = getattr(lead, name)
        if value is None or value == "":
            continue
        if name == "annual_revenue":
            value = float(value)
        out[name] = value
    out["custom"] = lead.custom
    return out


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _assignment_document(assignment: Any) -> dict[str, Any] | None:
    """The current owner as api.md shows it (names as they were when assigned)."""
    if assignment is None:
        return None
    return {
        "rep": {
            "id": assignment.rep_id,
            "email": assignment.rep.email,
            "name": assignment.rep_name or assignment.rep.name,
        },
        "team": assignment.team_name or None,
        "rule": assignment.rule_name or None,
        "ruleset_version": assignment.ruleset_version,
        "reason": assignment.reason,
        "assigned_at": _iso(assignment.assigned_at),
        "sla_due_at": _iso(assignment.sla_due_at),
        "touched_at": _iso(assignment.touched_at),
        "priority": assignment.priority or None,
        "tags": list(assignment.tags or []),
    }


def _event_document(event: Any) -> dict[str, Any]:
    """One timeline entry as api.md shows it (names as they were at the time)."""
    return {
        "type": event.type,
        "at": event.at.isoformat(),
        "actor": event.actor,
        "rep": {"id": event.rep_id, "name": event.rep_name} if event.rep_id is not None else None,
        "team": event.team_name or None,
        "rule": event.rule_name or None,
        "ruleset_version": event.ruleset_version,
        "data": event.data,
    }


def _trace(assignment: Any, timeline: list[Any]) -> list[Any]:
    """The decision's trace: the current owner's, else the last excluded/unassigned decision's."""
    if assignment is not None:
        return list(assignment.trace)
    for event in reversed(timeline):
        if event.type in ("excluded", "unassigned"):
            return list(event.trace)
    return []


def lead_document(lead: Lead) -> dict[str, Any]:
    """A lead as api.md's ``GET /api/v1/leads/<id>/`` shows it."""
    current = getattr(lead, "current_assignments", None)
    if current is None:  # a lead not loaded through lead_list()
        current = list(lead.assignments.filter(active=True).select_related("rep"))
    assignment = current[0] if current else None
    timeline = getattr(lead, "timeline", None)
    if timeline is None:
        timeline = list(lead.events.order_by("seq"))
    return {
        "id": str(lead.id),
        "status": lead.status,
        "source": lead.source.slug,
        "lane": lead.lane,
        "received_at": lead.received_at.isoformat(),
        "processed_at": lead.processed_at.isoformat() if lead.processed_at else None,
        # When its person was erased (routing/erasure.py): its fields say "erased person".
        "erased_at": _iso(lead.erased_at),
        "fields": lead_fields(lead),
        "flags": list(lead.flags or []),
        "priority": lead.priority or None,
        "tags": list(lead.tags or []),
        "duplicate_of": str(lead.duplicate_of_id) if lead.duplicate_of_id else None,
        "assignment": _assignment_document(assignment),
        "trace": _trace(assignment, timeline),
        "events": [_event_document(event) for event in timeline],
        "idempotency_key": lead.idempotency_key,
        "attempts": lead.attempts,
        "last_error": lead.last_error,
        "unassigned_retries": lead.unassigned_retries,
        "next_retry_at": (
            lead.unassigned_retry_at.isoformat()
            if lead.unassigned_retry_at and lead.status == LeadStatus.UNASSIGNED
            else None
        ),
    }


class UTCDateTimeField(IsoDateTimeField):
    """An ISO 8601 timestamp, converted to UTC.

    PostgreSQL refuses UTC offsets beyond ±15:59 that Python accepts (a 500 found by the
    schema fuzzing); converting first also catches instants outside Python's range.
    """

    def clean(self, value: Any) -> datetime | None:
        cleaned = super().clean(value)
        if cleaned is None:
            return None
        try:
            return cleaned.astimezone(UTC)
        except OverflowError:
            raise ValidationError("This timestamp is out of range.", code="invalid") from None


class UTCDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UTCDateTimeField


class EmailFilter(django_filters.CharFilter):
    """An e-mail address; anything else is an invalid filter (400)."""

    field_class = forms.EmailField


LEAD_ORDERINGS = (
    ("-received", "newest first (the default)"),
    ("received", "oldest first"),
    ("priority", "high priorities first (HIGH_PRIORITIES), then by priority, newest first"),
    ("-priority", "no or low priority first, newest first"),
)


def lead_tagged(tag: str) -> Exists:
    """The condition "this lead has ``tag``" (exact), as a semi-join on LeadTag."""
    return Exists(LeadTag.objects.filter(lead=OuterRef("pk"), tag=tag.strip()[:TAG_MAX_LENGTH]))


def priority_rank() -> Case:
    """0 for a high priority (``HIGH_PRIORITIES``, any case), 1 for any other, 2 for none."""
    high = Q(pk__in=[])
    for name in settings.HIGH_PRIORITIES:
        if priority_clean(name):
            high |= Q(priority__iexact=priority_clean(name))
    return Case(
        When(priority="", then=Value(2)),
        When(high, then=Value(0)),
        default=Value(1),
        output_field=IntegerField(),
    )


def lead_ordering(value: str) -> tuple[Any, ...]:
    """The ``order_by`` of an ``?ordering=`` value (LEAD_ORDERINGS)."""
    if value == "received":
        return ("received_at", "id")
    if value == "priority":
        return (priority_rank().asc(), "priority", "-received_at", "-id")
    if value == "-priority":
        return (priority_rank().desc(), "-priority", "-received_at", "-id")
    return ("-received_at", "-id")


class LeadFilter(django_filters.FilterSet):
    """The list endpoint's filters (api.md)."""

    status = django_filters.ChoiceFilter(choices=LeadStatus.choices)
    source = django_filters.CharFilter(field_name="source__slug")
    rep = EmailFilter(method="by_rep")
    since = UTCDateTimeFilter(field_name="received_at", lookup_expr="gte")
    until = UTCDateTimeFilter(field_name="received_at", lookup_expr="lt")
    q = django_filters.CharFilter(method="search")
    priority = django_filters.CharFilter(method="by_priority")
    tag = django_filters.CharFilter(method="by_tag")
    ordering = django_filters.ChoiceFilter(choices=LEAD_ORDERINGS, method="order")

    class Meta:
        model = Lead
        fields: list[str] = []

    def by_priority(self, queryset: QuerySet[Lead], name: str, value: str) -> QuerySet[Lead]:
        """Leads a tag rule gave this priority, exactly as the rule names it (lead_priority_idx);
        ``?priority=none`` for leads without one."""
        if value.strip().lower() == "none":
            return queryset.filter(priority="")
        return queryset.filter(priority=priority_clean(value))

    def by_tag(self, queryset: QuerySet[Lead], name: str, value: str) -> QuerySet[Lead]:
        """Leads with this tag: a semi-join on LeadTag's (tag, lead) index, on every database."""
        return queryset.filter(lead_tagged(value))

    def order(self, queryset: QuerySet[Lead], name: str, value: str) -> QuerySet[Lead]:
        return queryset.order_by(*lead_ordering(value))

    def by_rep(self, queryset: QuerySet[Lead], name: str, value: str) -> QuerySet[Lead]:
        """Leads whose current owner is the rep with this e-mail (case-insensitive)."""
        return queryset.filter(
            assignments__active=True, assignments__rep__email__iexact=value
        ).distinct()

    def search(self, queryset: QuerySet[Lead], name: str, value: str) -> QuerySet[Lead]:
        value = value.strip()[:200]
        if not value:
            return queryset
        return queryset.filter(
            Q(email__icontains=value)
            | Q(company__icontains=value)
            | Q(first_name__icontains=value)
            | Q(last_name__icontains=value)
        )
