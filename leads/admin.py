"""Admin for sources (token shown once, rotation) and leads (read-only)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from leads.models import Lead, Source
from leads.services import source_set_hmac_secret, source_set_token


def _overlap() -> timedelta:
    return timedelta(hours=settings.SOURCE_TOKEN_OVERLAP_HOURS)


@admin.register(Source)
class SourceAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "active", "auth_mode", "token_hint", "rate_limit_per_minute")
    list_filter = ("active", "auth_mode")
    search_fields = ("slug", "name")
    readonly_fields = (
        "token_hint",
        "previous_token_valid_until",
        "previous_hmac_valid_until",
        "created_at",
        "updated_at",
    )
    fields = (
        "slug",
        "name",
        "active",
        "auth_mode",
        "allow_query_token",
        "field_map",
        "rate_limit_per_minute",
        *readonly_fields,
    )
    actions = ("rotate_token", "rotate_hmac_secret")

    def save_model(self, request: HttpRequest, obj: Source, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if not change:
            token = source_set_token(source=obj)
            messages.warning(
                request,
                f"Token for {obj.slug}: {token} — copy it now, it is not shown again.",
            )
        if obj.requires_signature and not obj.hmac_secret:
            secret = source_set_hmac_secret(source=obj)
            messages.warning(
                request,
                f"HMAC secret for {obj.slug}: {secret} — copy it now, it is not shown again.",
            )

    @admin.action(
        description="Rotate token (the old one keeps working for the overlap period)",
        permissions=["change"],
    )
    def rotate_token(self, request: HttpRequest, queryset: QuerySet[Source]) -> None:
        for source in queryset:
            token = source_set_token(source=source, overlap=_overlap())
            messages.warning(
                request,
                f"New token for {source.slug}: {token} — copy it now, it is not shown again. "
                "The old token works until "
                f"{source.previous_token_valid_until:%Y-%m-%d %H:%M} UTC.",
            )

    @admin.action(
        description="Rotate HMAC secret (the old one keeps working for the overlap)",
        permissions=["change"],
    )
    def rotate_hmac_secret(self, request: HttpRequest, queryset: QuerySet[Source]) -> None:
        for source in queryset:
            secret = source_set_hmac_secret(source=source, overlap=_overlap())
            messages.warning(
                request,
                f"New HMAC secret for {source.slug}: {secret} — "
                "copy it now, it is not shown again.",
            )


@admin.register(Lead)
class LeadAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "email",
        "company",
        "country",
        "source",
        "status",
        "enrichment_status",
        "received_at",
        "last_error",
    )
    # Enrichment status, attempts, next try and what each provider got (`enrichment`) show
    # read-only on the lead's page with every other field.
    list_filter = ("status", "enrichment_status", "source")
    search_fields = ("email", "company", "last_name")
    list_select_related = ("source",)
    date_hierarchy = "received_at"
    show_full_result_count = False
    actions = ("reroute",)

    @admin.action(description="Re-route (unassigned or failed leads)", permissions=["reroute"])
    def reroute(self, request: HttpRequest, queryset: QuerySet[Lead]) -> None:
        from routing.services import LeadActionError, lead_reroute  # routing builds on leads

        if not request.user.has_perm("leads.reroute_lead"):
            messages.error(request, "You may not re-route leads.")
            return
        done, refused = 0, []
        for lead in queryset.only("id"):
            try:
                lead_reroute(lead_id=lead.pk, actor=f"user:{request.user.get_username()}")
                done += 1
            except LeadActionError as error:
                refused.append(f"{lead.pk}: {error.message}")
        if done:
            messages.success(request, f"{done} lead(s) sent through routing again.")
        for line in refused[:20]:
            messages.warning(request, line)

    def has_reroute_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("leads.reroute_lead")

    def get_readonly_fields(self, request: HttpRequest, obj: Lead | None = None) -> list[str]:
        return [f.name for f in Lead._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Lead | None = None) -> bool:
        return False
