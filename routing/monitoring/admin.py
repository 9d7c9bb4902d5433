"""Admin for alerts and SLA breaches: read-only lists (the checks open and resolve them)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from routing.monitoring.models import Alert, SlaBreach, SlaCheckFailure


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Alert)
class AlertAdmin(_ReadOnly):
    list_display = (
        "id",
        "kind",
        "subject",
        "status",
        "message",
        "opened_at",
        "last_seen_at",
        "resolved_at",
    )
    list_filter = ("status", "kind", "opened_at")
    search_fields = ("subject", "message")
    date_hierarchy = "opened_at"
    readonly_fields = (
        "kind",
        "subject",
        "status",
        "message",
        "data",
        "opened_at",
        "last_seen_at",
        "resolved_at",
    )


@admin.register(SlaBreach)
class SlaBreachAdmin(_ReadOnly):
    list_display = ("id", "lead", "assignment", "breached_at", "action", "reassigned_to", "note")
    list_filter = ("action", "breached_at")
    list_select_related = ("assignment", "reassigned_to")
    search_fields = ("lead__email", "lead__id")
    readonly_fields = ("assignment", "lead", "breached_at", "action", "reassigned_to", "note")


@admin.register(SlaCheckFailure)
class SlaCheckFailureAdmin(_ReadOnly):
    list_display = ("assignment", "failures", "first_failed_at", "last_failed_at", "retry_at")
    readonly_fields = (
        "assignment",
        "failures",
        "first_failed_at",
        "last_failed_at",
        "retry_at",
        "last_error",
    )
