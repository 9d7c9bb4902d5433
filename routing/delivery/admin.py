"""Admin for delivery: webhook endpoints, and the read-only outbox with its attempt log."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from audit.config_changes import (
    AuditedConfigAdmin,
    actor_of,
    config_change_record,
    config_changes_record,
    values_of,
)
from config.json_input import BoundedJsonAdmin
from routing.delivery.models import (
    Delivery,
    DeliveryAttempt,
    DeliveryEvent,
    WebhookEndpoint,
)
from routing.delivery.services import deliveries_retry, endpoint_send_test


class WebhookEndpointForm(forms.ModelForm):
    # A URL typed without a scheme is https (Django 6's default, named here so it doesn't change
    # on upgrade); the model field's validators (no private addresses) still run on save.
    url = forms.URLField(
        max_length=2000,
        assume_scheme="https",
        help_text=WebhookEndpoint._meta.get_field("url").help_text,
    )
    events = forms.MultipleChoiceField(
        choices=DeliveryEvent.choices,
        widget=forms.CheckboxSelectMultiple,
        initial=list(DeliveryEvent.values),
    )

    class Meta:
        model = WebhookEndpoint
        fields = ("name", "url", "active", "events")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(AuditedConfigAdmin, BoundedJsonAdmin, admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ("name", "url", "active", "events", "secret_masked", "disabled_at")
    list_filter = ("active",)
    search_fields = ("name", "url")
    readonly_fields = ("secret", "disabled_at", "disabled_reason", "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "url", "active", "events")}),
        (
            "Signing",
            {
                "fields": ("secret",),
                "description": "Receivers verify webhook-signature with this secret "
                "(Standard Webhooks). It is generated when the endpoint is created.",
            },
        ),
        ("State", {"fields": ("disabled_at", "disabled_reason", "created_at", "updated_at")}),
    )

    actions = ("send_test",)

    @admin.action(
        description="Send a signed test message to the selected endpoints", permissions=["change"]
    )
    def send_test(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset[:10]:
            result = endpoint_send_test(endpoint=endpoint)
            config_change_record(
                actor=actor_of(request), obj=endpoint, action="send_test", extra={"result": result}
            )
            self.message_user(request, result)

    @admin.display(description="secret")
    def secret_masked(self, obj: WebhookEndpoint) -> str:
        return obj.secret[:10] + "…"


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    fields = ("number", "at", "outcome", "status_code", "duration_ms", "error", "response_excerpt")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("number",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = (
        "message_id",
        "channel",
        "recipient",
        "event",
        "status",
        "attempts",
        "last_status_code",
        "next_attempt_at",
        "created_at",
    )
    list_filter = ("status", "channel", "event", "endpoint")
    list_select_related = ("endpoint",)
    search_fields = ("message_id", "recipient", "assignment__lead__id")
    date_hierarchy = "created_at"
    inlines = (DeliveryAttemptInline,)
    actions = ("retry_now",)
    readonly_fields = (
        "channel",
        "endpoint",
        "recipient",
        "assignment",
        "event",
        "message_id",
        "payload",
        "status",
        "attempts",
        "next_attempt_at",
        "give_up_at",
        "dispatched_at",
        "last_status_code",
        "last_error",
        "delivered_at",
        "created_at",
        "updated_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(
        description="Retry the selected failed or waiting deliveries now", permissions=["change"]
    )
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        chosen = list(queryset)
        before = {delivery.pk: values_of(delivery) for delivery in chosen}
        count = deliveries_retry(delivery_ids=[delivery.pk for delivery in chosen])
        config_changes_record(
            actor=actor_of(request), objects=chosen, action="retry_now", before=before
        )
        skipped = queryset.count() - count
        self.message_user(request, f"{count} delivery(ies) queued for a new attempt.")
        if skipped:
            self.message_user(
                request,
                f"{skipped} skipped: delivered, cancelled, or to a disabled endpoint.",
                messages.WARNING,
            )
