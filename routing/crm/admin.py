"""Admin for CRM connections (write-only secret, test, roster sync) and the roster mirror."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from audit.config_changes import AuditedConfigAdmin
from routing.crm.base import HUBSPOT, SALESFORCE, CrmError
from routing.crm.models import CrmConnection, CrmOwner, SalesforceAuthFlow
from routing.crm.secrets import secret_hint, secret_seal


def _https_urls(field: Any, **kwargs: Any) -> Any:
    """Form fields as the model says, a URL typed without a scheme taken as https."""
    if isinstance(field, models.URLField):
        kwargs.setdefault("assume_scheme", "https")
    return field.formfield(**kwargs)


# What says where the credential goes and whose it is.
_WHERE_AND_WHO = ("kind", "base_url", "auth_flow", "client_id", "username")


class CrmConnectionForm(forms.ModelForm):
    new_secret = forms.CharField(
        required=False,
        label="Credential",
        strip=True,
        max_length=20_000,
        widget=forms.PasswordInput(render_value=False),
        help_text="HubSpot: the private app's access token. Salesforce: the connected app's "
        "consumer secret (client credentials) or the PEM private key (JWT bearer). Stored "
        "encrypted and never shown again; leave blank to keep the current one, enter a new one "
        "to rotate it.",
    )

    class Meta:
        model = CrmConnection
        formfield_callback = _https_urls
        fields = (
            "kind",
            "name",
            "active",
            "base_url",
            "auth_flow",
            "client_id",
            "username",
            "api_version",
            "person_object",
            "external_id_field",
            "lookup_enabled",
            "honour_crm_owner",
            "writeback_enabled",
            "touches_enabled",
            "rate_per_minute",
            "burst",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        secret = data.get("new_secret") or ""
        has_secret = bool(secret) or bool(self.instance.pk and self.instance.secret_encrypted)
        if not has_secret:
            self.add_error("new_secret", "Enter the credential LeadRouter authenticates with.")
        moved = [name for name in _WHERE_AND_WHO if name in self.changed_data]
        if self.instance.pk and moved and not secret:
            # The stored credential is only ever sent where it was entered for: pointing a
            # connection elsewhere (or at another app) takes the credential typed again.
            self.add_error(
                "new_secret",
                "Changing "
                + ", ".join(str(self.fields[name].label or name) for name in moved)
                + " needs the credential entered again: the stored one is never sent to a new "
                "address or app.",
            )
        kind = data.get("kind")
        flow = data.get("auth_flow")
        jwt = kind == SALESFORCE and flow == SalesforceAuthFlow.JWT_BEARER
        if secret and jwt and "PRIVATE KEY" not in secret:
            self.add_error("new_secret", "The JWT bearer flow needs the PEM private key.")
        if secret and kind == HUBSPOT and (len(secret) < 20 or " " in secret):
            self.add_error("new_secret", "That does not look like a private app access token.")
        return data

    def save(self, commit: bool = True) -> CrmConnection:
        secret = self.cleaned_data.get("new_secret")
        if secret:
            self.instance.secret_encrypted = secret_seal(secret)
            self.instance.secret_hint = secret_hint(secret)
            self.instance.secret_changed_at = timezone.now()
        saved: CrmConnection = super().save(commit=commit)
        return saved


@admin.register(CrmConnection)
class CrmConnectionAdmin(AuditedConfigAdmin, admin.ModelAdmin):
    form = CrmConnectionForm
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    list_display = ("name", "kind", "active", "health", "secret_hint", "roster_synced_at")
    list_filter = ("kind", "active")
    readonly_fields = (
        "secret_hint",
        "secret_changed_at",
        "health",
        "last_ok_at",
        "last_error",
        "last_error_at",
        "roster_synced_at",
        "touches_cursor",
        "created_at",
        "updated_at",
    )
    fieldsets = (
        (None, {"fields": ("kind", "name", "active", "base_url")}),
        (
            "Credential",
            {
                "fields": (
                    "new_secret",
                    "secret_hint",
                    "secret_changed_at",
                    "auth_flow",
                    "client_id",
                    "username",
                )
            },
        ),
        (
            "What it does",
            {
                "fields": (
                    "lookup_enabled",
                    "honour_crm_owner",
                    "writeback_enabled",
                    "touches_enabled",
                    "person_object",
                    "external_id_field",
                    "api_version",
                )
            },
        ),
        ("Pace", {"fields": ("rate_per_minute", "burst")}),
        (
            "Health",
            {
                "fields": (
                    "health",
                    "last_ok_at",
                    "last_error",
                    "last_error_at",
                    "roster_synced_at",
                    "touches_cursor",
                )
            },
        ),
    )
    actions = ("test_connection", "sync_roster")

    @admin.display(description="health")
    def health(self, obj: CrmConnection) -> str:
        if obj.last_error_at and (obj.last_ok_at is None or obj.last_error_at > obj.last_ok_at):
            return format_html(
                '<span style="color:#b00">failing since {}: {}</span>',
                timezone.localtime(obj.problem_since or obj.last_error_at).strftime("%H:%M:%S"),
                obj.last_error[:200],
            )
        if obj.last_ok_at:
            return "answering"
        return "not called yet"

    def save_model(self, request: HttpRequest, obj: CrmConnection, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        from routing.crm.lookup import clear_connection_cache

        clear_connection_cache()

    @admin.action(
        description="Test the selected connections (one call each)", permissions=["change"]
    )
    def test_connection(self, request: HttpRequest, queryset: QuerySet[CrmConnection]) -> None:
        from routing.crm.connections import crm_client
        from routing.crm.health import crm_record_error, crm_record_ok

        for connection in queryset:
            try:
                said = crm_client(connection).check()
            except CrmError as exc:
                crm_record_error(connection, exc)
                self.message_user(request, f"{connection.name}: {exc}", messages.ERROR)
                continue
            crm_record_ok(connection)
            self.message_user(request, f"{connection.name}: {said}", messages.SUCCESS)

    @admin.action(
        description="Sync the roster now (owners mapped to reps by e-mail)", permissions=["change"]
    )
    def sync_roster(self, request: HttpRequest, queryset: QuerySet[CrmConnection]) -> None:
        from routing.crm.roster import crm_roster_sync

        for connection in queryset:
            try:
                report = crm_roster_sync(connection)
            except CrmError as exc:
                self.message_user(request, f"{connection.name}: {exc}", messages.ERROR)
                continue
            level = messages.WARNING if report.deactivated_in_crm else messages.SUCCESS
            self.message_user(request, f"{connection.name}: {report.summary()}", level)


class DeactivatedInCrmFilter(admin.SimpleListFilter):
    title = "attention"
    parameter_name = "attention"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("deactivated", "Active rep, deactivated in the CRM"),
            ("unmapped", "Active in the CRM, no rep"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[CrmOwner]) -> QuerySet[CrmOwner]:
        if self.value() == "deactivated":
            return queryset.filter(active_in_crm=False, rep__active=True)
        if self.value() == "unmapped":
            return queryset.filter(active_in_crm=True, rep__isnull=True)
        return queryset


@admin.register(CrmOwner)
class CrmOwnerAdmin(AuditedConfigAdmin, admin.ModelAdmin):
    list_display = ("email", "name", "kind", "owner_id", "active_in_crm", "rep", "flag")
    list_filter = ("kind", "active_in_crm", DeactivatedInCrmFilter)
    search_fields = ("email", "name", "owner_id", "rep__email")
    readonly_fields = ("kind", "owner_id", "email", "name", "active_in_crm", "synced_at")
    fields = ("kind", "owner_id", "email", "name", "active_in_crm", "rep", "synced_at")
    raw_id_fields = ("rep",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # rows come from the roster sync

    @admin.display(description="attention")
    def flag(self, obj: CrmOwner) -> str:
        if not obj.active_in_crm and obj.rep_id is not None and obj.rep and obj.rep.active:
            return "rep active, deactivated in the CRM"
        if obj.active_in_crm and obj.rep_id is None:
            return "no rep"
        return ""
