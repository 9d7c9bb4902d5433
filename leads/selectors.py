"""Read queries of the leads app."""

from __future__ import annotations

import uuid
from typing import Any

import django_filters
from django.db.models import Q, QuerySet

from leads.models import Lead, LeadStatus, Source
from leads.normalize import CANONICAL_FIELDS

_LEAD_COLUMNS = {f.name for f in Lead._meta.get_fields()}
LEAD_FIELD_NAMES = tuple(name for name in CANONICAL_FIELDS if name in _LEAD_COLUMNS)


def source_for_intake(*, slug: str) -> Source | None:
    """The active source behind an intake URL, or None."""
    if len(slug) > 64:
        return None
    return Source.objects.filter(slug=slug, active=True).first()


def lead_list() -> QuerySet[Lead]:
    """Leads newest first, with what their API document needs."""
    return Lead.objects.select_related("source").order_by("-received_at", "-id")


def lead_get(*, lead_id: str | uuid.UUID) -> Lead | None:
    try:
        lead_uuid = uuid.UUID(str(lead_id))
    except ValueError:
        return None
    return lead_list().filter(id=lead_uuid).first()


def lead_fields(lead: Lead) -> dict[str, Any]:
    """The canonical fields that have a value, plus ``custom``."""
    out: dict[str, Any] = {}
    for name in LEAD_FIELD_NAMES:
        value = getattr(lead, name)
        if value is None or value == "":
            continue
        if name == "annual_revenue":
            value = float(value)
        out[name] = value
    out["custom"] = lead.custom
    return out


def lead_document(lead: Lead) -> dict[str, Any]:
    """A lead as api.md's ``GET /api/v1/leads/<id>/`` shows it."""
    return {
        "id": str(lead.id),
        "status": lead.status,
        "source": lead.source.slug,
        "received_at": lead.received_at.isoformat(),
        "processed_at": lead.processed_at.isoformat() if lead.processed_at else None,
        "fields": lead_fields(lead),
        "flags": list(lead.flags or []),
        "duplicate_of": str(lead.duplicate_of_id) if lead.duplicate_of_id else None,
        "assignment": None,
        "trace": [],
        "events": [],
        "idempotency_key": lead.idempotency_key,
        "attempts": lead.attempts,
        "last_error": lead.last_error,
    }


class LeadFilter(django_filters.FilterSet):
    """The list endpoint's filters (api.md)."""

    status = django_filters.ChoiceFilter(choices=LeadStatus.choices)
    source = django_filters.CharFilter(field_name="source__slug")
    since = django_filters.IsoDateTimeFilter(field_name="received_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="received_at", lookup_expr="lt")
    q = django_filters.CharFilter(method="search")

    class Meta:
        model = Lead
        fields: list[str] = []

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
