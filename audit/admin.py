"""The audit log in the admin: read-only (the database refuses changes anyway)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.models import Event


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("at", "type", "lead", "actor", "rep_name", "team_name", "rule_name")
    list_filter = ("type",)
    search_fields = ("chain", "actor", "rep_name", "team_name", "rule_name")
    date_hierarchy = "at"
    show_full_result_count = False
    ordering = ("-at", "-id")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Event._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
