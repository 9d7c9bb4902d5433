"""Admin for the routing configuration. Declarative; changes of state go through services.

Only draft rulesets and their rules can be edited; published and archived versions are shown
read-only. Publishing and copying (the start of a rollback) are actions on the ruleset list.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from routing.engine import RuleErrors
from routing.models import (
    Account,
    QueueHeartbeat,
    Rep,
    Rule,
    RuleSet,
    RuleSetStatus,
    Team,
    TeamMembership,
    Territory,
    ValueList,
)
from routing.rules_io import ruleset_add_draft, ruleset_copy, ruleset_publish
from routing.selectors import names_in_use


class RefuseDeletingWhatRulesUse:
    """Admin mixin: no deleting a team, rep or list that a draft or published rule names."""

    in_use_kind = ""

    def _users(self, obj: Any) -> list[str]:
        key = obj.email.strip().lower() if self.in_use_kind == "reps" else obj.name
        return list(getattr(names_in_use(), self.in_use_kind).get(key, []))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed: bool = super().has_delete_permission(request, obj)  # type: ignore[misc]
        return allowed and (obj is None or not self._users(obj))


@admin.register(Rep)
class RepAdmin(RefuseDeletingWhatRulesUse, admin.ModelAdmin):
    in_use_kind = "reps"
    list_display = (
        "email",
        "name",
        "active",
        "out_of_office_until",
        "timezone",
        "max_open",
        "max_per_day",
        "last_assigned_at",
    )
    list_filter = ("active", "timezone")
    search_fields = ("email", "name")
    autocomplete_fields = ("user",)
    readonly_fields = ("last_assigned_at", "created_at", "updated_at")


class TeamMembershipInline(admin.TabularInline):
    model = TeamMembership
    fields = ("position", "rep", "weight")
    ordering = ("position", "id")
    autocomplete_fields = ("rep",)
    extra = 0


@admin.register(Team)
class TeamAdmin(RefuseDeletingWhatRulesUse, admin.ModelAdmin):
    in_use_kind = "teams"
    list_display = ("name", "strategy", "respect_working_hours", "sla_minutes", "member_count")
    list_filter = ("strategy", "respect_working_hours")
    search_fields = ("name",)
    autocomplete_fields = ("manager",)
    readonly_fields = ("rotation_state", "created_at", "updated_at")
    inlines = (TeamMembershipInline,)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Team]:
        return super().get_queryset(request).annotate(member_count=Count("memberships"))

    @admin.display(description="members", ordering="member_count")
    def member_count(self, obj: Team) -> int:
        return obj.member_count  # type: ignore[attr-defined]  # annotated in get_queryset


@admin.register(Territory)
class TerritoryAdmin(admin.ModelAdmin):
    list_display = ("name", "countries", "regions", "team", "rep")
    list_select_related = ("team", "rep")
    list_filter = ("team",)
    search_fields = ("name", "team__name", "rep__email")
    autocomplete_fields = ("team", "rep")
    readonly_fields = ("created_at", "updated_at")


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = ("domain", "name", "owner", "tier")
    list_select_related = ("owner",)
    list_filter = ("tier",)
    search_fields = ("domain", "name", "owner__email")
    autocomplete_fields = ("owner",)
    readonly_fields = ("created_at", "updated_at")


@admin.register(ValueList)
class ValueListAdmin(RefuseDeletingWhatRulesUse, admin.ModelAdmin):
    in_use_kind = "value_lists"
    list_display = ("name", "updated_at")
    search_fields = ("name",)
    readonly_fields = ("created_at", "updated_at")


def _editable(ruleset: RuleSet | None) -> bool:
    return ruleset is None or ruleset.is_editable


class RuleInline(admin.TabularInline):
    model = Rule
    fields = ("priority", "name", "when", "action", "sla_minutes", "on_sla_breach", "active")
    ordering = ("priority",)
    extra = 0

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _editable(obj) and super().has_add_permission(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _editable(obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _editable(obj) and super().has_delete_permission(request, obj)


@admin.register(RuleSet)
class RuleSetAdmin(admin.ModelAdmin):
    list_display = ("version", "name", "status", "created_at", "created_by", "published_at")
    list_display_links = ("version", "name")
    list_filter = ("status",)
    search_fields = ("name", "note")
    readonly_fields = (
        "version",
        "status",
        "created_by",
        "created_at",
        "published_at",
        "published_by",
    )
    fields = ("name", "note", *readonly_fields)
    inlines = (RuleInline,)
    actions = ("publish", "copy_to_draft")

    def has_change_permission(self, request: HttpRequest, obj: RuleSet | None = None) -> bool:
        return _editable(obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: RuleSet | None = None) -> bool:
        return _editable(obj) and super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # it would skip the per-version check below
        return actions

    def save_model(self, request: HttpRequest, obj: RuleSet, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
        else:
            ruleset_add_draft(ruleset=obj, actor=request.user)  # type: ignore[arg-type]

    @admin.action(description="Publish the selected draft (archives the live version)")
    def publish(self, request: HttpRequest, queryset: QuerySet[RuleSet]) -> None:
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one draft to publish.", messages.ERROR)
            return
        ruleset = queryset.get()
        try:
            published = ruleset_publish(ruleset=ruleset, actor=request.user)  # type: ignore[arg-type]
        except RuleErrors as exc:
            self.message_user(request, f"Not published: {exc}", messages.ERROR)
            return
        self.message_user(request, f"Version {published.version} is live.", messages.SUCCESS)

    @admin.action(description="Copy to a new draft (to edit, or to roll back to)")
    def copy_to_draft(self, request: HttpRequest, queryset: QuerySet[RuleSet]) -> None:
        for ruleset in queryset.order_by("version"):
            copy = ruleset_copy(ruleset=ruleset, actor=request.user)  # type: ignore[arg-type]
            self.message_user(
                request,
                f"Version {ruleset.version} copied to draft version {copy.version}.",
                messages.SUCCESS,
            )


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    list_display = ("name", "priority", "ruleset", "active", "sla_minutes", "on_sla_breach")
    list_select_related = ("ruleset",)
    list_filter = ("ruleset__status", "active", "on_sla_breach")
    search_fields = ("name",)
    ordering = ("-ruleset__version", "priority")

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # it would skip the per-rule check below
        return actions

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "ruleset":
            kwargs["queryset"] = RuleSet.objects.filter(status=RuleSetStatus.DRAFT)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def has_change_permission(self, request: HttpRequest, obj: Rule | None = None) -> bool:
        return (obj is None or _editable(obj.ruleset)) and super().has_change_permission(
            request, obj
        )

    def has_delete_permission(self, request: HttpRequest, obj: Rule | None = None) -> bool:
        return (obj is None or _editable(obj.ruleset)) and super().has_delete_permission(
            request, obj
        )


@admin.register(QueueHeartbeat)
class QueueHeartbeatAdmin(admin.ModelAdmin):
    list_display = ("queue", "last_seen_at", "worker")
    readonly_fields = ("queue", "last_seen_at", "worker")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


from routing.delivery import admin as delivery_admin  # noqa: E402,F401
