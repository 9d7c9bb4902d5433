"""Admin for delivery: webhook endpoints, and the read-only outbox with its attempt log."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from audit.config_changes import (
    AuditedConfigAdmin,
    actor_of,
    config_change_record,
    config_changes_record,
    values_of,
)
from config.json_input import BoundedJsonAdmin
from routing.crm.secrets import secret_hint, secret_seal
from routing.delivery.models import (
    SLACK_BOT_TOKEN_PREFIX,
    WEBHOOK_EVENTS,
    Delivery,
    DeliveryAttempt,
    DeliveryEvent,
    NoticeEvent,
    NotificationChannel,
    NotificationKind,
    WebhookEndpoint,
    url_errors,
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
        choices=[(value, DeliveryEvent(value).label) for value in WEBHOOK_EVENTS],
        widget=forms.CheckboxSelectMultiple,
        initial=list(WEBHOOK_EVENTS),
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


class NotificationChannelForm(forms.ModelForm):
    new_secret = forms.CharField(
        required=False,
        label="Webhook URL or bot token",
        strip=True,
        max_length=2000,
        widget=forms.PasswordInput(render_value=False),
        help_text="Slack or Teams incoming webhook: its URL. Slack bot: the bot token (xoxb-…, "
        "scopes chat:write and users:read.email). Stored encrypted and never shown again; "
        "leave blank to keep the current one, enter a new one to replace it.",
    )
    events = forms.MultipleChoiceField(
        choices=NoticeEvent.choices,
        widget=forms.CheckboxSelectMultiple,
        initial=list(NoticeEvent.values),
    )

    class Meta:
        model = NotificationChannel
        fields = ("name", "kind", "rep", "team", "events", "active")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        secret = data.get("new_secret") or ""
        if not secret and not (self.instance.pk and self.instance.secret_encrypted):
            self.add_error("new_secret", "Enter the webhook URL or the bot token.")
        if self.instance.pk and "kind" in self.changed_data and not secret:
            self.add_error("new_secret", "Changing the kind needs the URL or token entered again.")
        kind = data.get("kind")
        if secret and kind == NotificationKind.SLACK_BOT:
            if not secret.startswith(SLACK_BOT_TOKEN_PREFIX) or " " in secret:
                self.add_error("new_secret", "A Slack bot token starts with xoxb-.")
        elif secret:
            problems = url_errors(secret)
            if not secret.startswith(("https://", "http://")):
                problems = ["Enter the webhook's https:// URL.", *problems]
            for problem in problems:
                self.add_error("new_secret", problem)
        return data

    def save(self, commit: bool = True) -> NotificationChannel:
        secret = self.cleaned_data.get("new_secret")
        if secret:
            self.instance.secret_encrypted = secret_seal(secret)
            self.instance.secret_hint = secret_hint(secret)
            self.instance.secret_changed_at = timezone.now()
        saved: NotificationChannel = super().save(commit=commit)
        return saved


@admin.register(NotificationChannel)
class NotificationChannelAdmin(AuditedConfigAdmin, BoundedJsonAdmin, admin.ModelAdmin):
    """Slack and Teams for a rep or a team: the credential is write-only (a hint is shown)."""

    form = NotificationChannelForm
    list_display = ("name", "kind", "rep", "team", "events", "active", "secret_hint")
    list_filter = ("kind", "active")
    search_fields = ("name", "rep__email", "rep__name", "team__name")
    autocomplete_fields = ("rep", "team")
    list_select_related = ("rep", "team")
    readonly_fields = ("secret_hint", "secret_changed_at", "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "kind", "rep", "team", "events", "active")}),
        ("Credential", {"fields": ("new_secret", "secret_hint", "secret_changed_at")}),
        ("Record", {"fields": ("created_at", "updated_at")}),
    )
