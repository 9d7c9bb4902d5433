"""The delivery outbox: webhook endpoints, one ``Delivery`` per recipient, and its attempts.

A ``Delivery`` is written in the assignment's transaction with its payload frozen, so it is
sent even if the message that should start it is lost (a beat sweeper picks up whatever is due)
and every retry sends the same bytes under the same ``message_id`` (``webhook-id``).
"""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from routing.delivery.egress import HostUnresolved, UrlRefused, url_resolve
from routing.delivery.signing import SECRET_PREFIX, secret_bytes, secret_generate

__all__ = [
    "Delivery",
    "DeliveryAttempt",
    "DeliveryChannel",
    "DeliveryEvent",
    "DeliveryStatus",
    "NoticeEvent",
    "NotificationChannel",
    "NotificationKind",
    "WebhookEndpoint",
]


class DeliveryEvent(models.TextChoices):
    ASSIGNED = "lead.assigned", "Lead assigned (first assignment, or duplicate to its owner)"
    REASSIGNED = "lead.reassigned", "Lead reassigned"
    # Notices to a rep only (e-mail, Slack, Teams), never sent to webhook endpoints.
    SLA_WARNING = "lead.sla_warning", "SLA about to breach (to the rep)"
    REASSIGNED_AWAY = "lead.reassigned_away", "Lead reassigned away (to its former rep)"


# What a webhook endpoint may subscribe to: the assignment events, not the rep's notices.
WEBHOOK_EVENTS = (DeliveryEvent.ASSIGNED.value, DeliveryEvent.REASSIGNED.value)


def _all_events() -> list[str]:
    return list(WEBHOOK_EVENTS)


def url_errors(url: str) -> list[str]:
    """Why ``url`` may not receive webhooks (SSRF and form); empty when it may."""
    try:
        url_resolve(url, allow_private=settings.DELIVERY_ALLOW_PRIVATE_URLS)
    except HostUnresolved as exc:
        return [f"{exc} (a webhook URL must resolve when it is saved)"]
    except UrlRefused as exc:
        return [str(exc)]
    return []


class WebhookEndpoint(models.Model):
    """A URL that receives signed webhooks for the events it subscribes to."""

    name = models.CharField(max_length=200, unique=True)
    url = models.URLField(max_length=2000, help_text="http(s) URL; private addresses are refused.")
    secret = models.CharField(
        max_length=200,
        default=secret_generate,
        help_text="whsec_… signing secret; give it to the receiver to verify signatures.",
    )
    active = models.BooleanField(default=True)
    events = models.JSONField(
        default=_all_events,
        help_text=f"Event types sent to this endpoint: {', '.join(WEBHOOK_EVENTS)}.",
    )
    disabled_at = models.DateTimeField(null=True, blank=True, editable=False)
    disabled_reason = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name",)
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="webhook_endpoint_name_not_empty"),
            models.CheckConstraint(
                condition=Q(secret__startswith=SECRET_PREFIX),
                name="webhook_endpoint_secret_prefix",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def subscribes_to(self, event: str) -> bool:
        return isinstance(self.events, list) and event in self.events

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        if self.url:
            found = url_errors(self.url)
            if found:
                errors["url"] = found
        if (
            not isinstance(self.events, list)
            or not self.events
            or any(event not in WEBHOOK_EVENTS for event in self.events)
        ):
            errors["events"] = [f"choose one or more of: {', '.join(WEBHOOK_EVENTS)}"]
        try:
            if len(secret_bytes(self.secret or "")) < 24 or not self.secret.startswith(
                SECRET_PREFIX
            ):
                raise ValueError
        except ValueError:
            errors["secret"] = ["must be whsec_ followed by at least 24 bytes in base64"]
        if errors:
            raise ValidationError(errors)
        if self.active:  # re-enabled by hand: the reason it was disabled no longer applies
            self.disabled_at = None
            self.disabled_reason = ""


class DeliveryChannel(models.TextChoices):
    WEBHOOK = "webhook", "Webhook"
    EMAIL = "email", "E-mail to the rep"
    CRM = "crm", "Owner written to the CRM"
    SLACK = "slack", "Slack message"
    TEAMS = "teams", "Microsoft Teams message"


CHAT_CHANNELS = (DeliveryChannel.SLACK.value, DeliveryChannel.TEAMS.value)


class NoticeEvent(models.TextChoices):
    """What a rep is told about, as a notification channel subscribes to it."""

    ASSIGNED = "assigned", "New lead assigned (or reassigned) to the rep"
    SLA_WARNING = "sla_warning", "SLA about to breach"
    REASSIGNED_AWAY = "reassigned_away", "Lead reassigned away from the rep"


def _all_notice_events() -> list[str]:
    return list(NoticeEvent.values)


def notice_event_for(event: str) -> str:
    """The notice a delivery event is to its rep (``lead.reassigned`` is a new lead to them)."""
    return {
        DeliveryEvent.SLA_WARNING.value: NoticeEvent.SLA_WARNING.value,
        DeliveryEvent.REASSIGNED_AWAY.value: NoticeEvent.REASSIGNED_AWAY.value,
    }.get(event, NoticeEvent.ASSIGNED.value)


class NotificationKind(models.TextChoices):
    SLACK_WEBHOOK = "slack_webhook", "Slack incoming webhook (posts to one channel)"
    SLACK_BOT = "slack_bot", "Slack bot (a direct message to the rep, found by e-mail)"
    TEAMS_WEBHOOK = "teams_webhook", "Microsoft Teams incoming webhook (posts to one channel)"


SLACK_BOT_TOKEN_PREFIX = "xoxb-"  # noqa: S105 (a prefix, not a secret)


class NotificationChannel(models.Model):
    """Where a rep, or every member of a team, is told about their leads in Slack or Teams.

    The credential (a webhook URL or a bot token) is stored encrypted (``routing.crm.secrets``)
    and shown back only as a hint. A rep's channel covers their notices; a team's covers the
    notices about its leads: a webhook posts them to the team's channel, a bot sends each one
    to the rep concerned as a direct message.
    """

    name = models.CharField(max_length=200, help_text="What it is, e.g. '#emea-sdr' or 'Rita DM'.")
    kind = models.CharField(max_length=16, choices=NotificationKind.choices)
    rep = models.ForeignKey(
        "routing.Rep",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="notification_channels",
    )
    team = models.ForeignKey(
        "routing.Team",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="notification_channels",
    )
    events = models.JSONField(
        default=_all_notice_events,
        help_text=f"What to send: {', '.join(NoticeEvent.values)}.",
    )
    active = models.BooleanField(default=True)
    secret_encrypted = models.TextField(blank=True, editable=False)
    secret_hint = models.CharField(max_length=100, blank=True, editable=False)
    secret_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name", "id")
        constraints = [
            models.CheckConstraint(
                condition=Q(rep__isnull=False, team__isnull=True)
                | Q(rep__isnull=True, team__isnull=False),
                name="notification_channel_rep_xor_team",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=NotificationKind.values),
                name="notification_channel_kind_valid",
            ),
            models.CheckConstraint(
                condition=~Q(name=""), name="notification_channel_name_not_empty"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def delivery_channel(self) -> str:
        if self.kind == NotificationKind.TEAMS_WEBHOOK:
            return DeliveryChannel.TEAMS.value
        return DeliveryChannel.SLACK.value

    def subscribes_to(self, notice: str) -> bool:
        return isinstance(self.events, list) and notice in self.events

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        if (self.rep_id is None) == (self.team_id is None):
            errors["rep"] = ["choose a rep or a team (exactly one)"]
        if (
            not isinstance(self.events, list)
            or not self.events
            or any(event not in NoticeEvent.values for event in self.events)
        ):
            errors["events"] = [f"choose one or more of: {', '.join(NoticeEvent.values)}"]
        if errors:
            raise ValidationError(errors)


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


def message_id_for(*, lead_id: object, assignment_id: int, recipient: str, event: str) -> str:
    """The ``webhook-id``: the same for every retry of one message, unique across installs.

    Derived from the lead's UUID as well as the assignment id, so two databases (a restore, a
    second install) never reuse an id a receiver has already seen.
    """
    digest = hashlib.sha256(f"{lead_id}:{assignment_id}:{recipient}:{event}".encode()).hexdigest()
    return f"msg_{digest[:32]}"


class Delivery(models.Model):
    """One message about one assignment to one recipient (an endpoint, or the rep by e-mail)."""

    channel = models.CharField(max_length=16, choices=DeliveryChannel.choices)
    endpoint = models.ForeignKey(
        WebhookEndpoint,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="deliveries",
    )
    notification_channel = models.ForeignKey(
        NotificationChannel,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="deliveries",
        help_text="The Slack or Teams channel a chat message goes to.",
    )
    crm_connection = models.ForeignKey(
        "routing.CrmConnection",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="deliveries",
        help_text="The CRM an owner write-back goes to.",
    )
    recipient = models.CharField(
        max_length=2000,
        help_text="The rep's e-mail address, the endpoint's URL, the CRM's name, or the chat "
        "channel's name and the rep (never a webhook URL), when created.",
    )
    assignment = models.ForeignKey(
        "routing.Assignment", on_delete=models.PROTECT, related_name="deliveries"
    )
    event = models.CharField(max_length=32, choices=DeliveryEvent.choices)
    message_id = models.CharField(max_length=64, unique=True, help_text="The webhook-id header.")
    payload = models.JSONField(help_text="Frozen when created; every attempt sends it unchanged.")
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    give_up_at = models.DateTimeField(help_text="After this a failing delivery is marked failed.")
    dispatched_at = models.DateTimeField(
        null=True, blank=True, help_text="When a task was last published for it."
    )
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-created_at", "-id")
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=("assignment", "endpoint", "event"),
                condition=Q(endpoint__isnull=False),
                name="delivery_one_per_assignment_endpoint_event",
            ),
            models.UniqueConstraint(
                fields=("assignment", "event"),
                condition=Q(channel="email"),
                name="delivery_one_email_per_assignment_event",
            ),
            models.UniqueConstraint(
                fields=("assignment", "crm_connection", "event"),
                condition=Q(channel="crm"),
                name="delivery_one_crm_write_per_assignment_event",
            ),
            models.UniqueConstraint(
                fields=("assignment", "notification_channel", "event"),
                condition=Q(channel__in=CHAT_CHANNELS),
                name="delivery_one_chat_per_assignment_channel_event",
            ),
            models.CheckConstraint(
                condition=Q(channel="webhook", endpoint__isnull=False)
                | Q(channel__in=("email", "crm", *CHAT_CHANNELS), endpoint__isnull=True),
                name="delivery_endpoint_iff_webhook",
            ),
            models.CheckConstraint(
                condition=Q(channel__in=CHAT_CHANNELS, notification_channel__isnull=False)
                | (~Q(channel__in=CHAT_CHANNELS) & Q(notification_channel__isnull=True)),
                name="delivery_notification_channel_iff_chat",
            ),
            models.CheckConstraint(
                condition=Q(channel="crm", crm_connection__isnull=False)
                | (~Q(channel="crm") & Q(crm_connection__isnull=True)),
                name="delivery_crm_connection_iff_crm",
            ),
            models.CheckConstraint(
                condition=Q(channel__in=DeliveryChannel.values), name="delivery_channel_valid"
            ),
            models.CheckConstraint(
                condition=Q(status__in=DeliveryStatus.values), name="delivery_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status="pending") | Q(next_attempt_at__isnull=False),
                name="delivery_pending_has_next_attempt",
            ),
            models.CheckConstraint(
                condition=~Q(status="delivered") | Q(delivered_at__isnull=False),
                name="delivery_delivered_has_delivered_at",
            ),
        ]
        indexes = [
            # The sweeper's scan: pending rows by due time.
            models.Index(
                fields=("next_attempt_at",),
                condition=Q(status="pending"),
                name="delivery_pending_due_idx",
            ),
            models.Index(fields=("status", "created_at"), name="delivery_status_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} ({self.channel} → {self.recipient}, {self.status})"


class DeliveryAttempt(models.Model):
    """One try at sending a delivery, append-only: when, what came back, how long it took."""

    delivery = models.ForeignKey(Delivery, on_delete=models.PROTECT, related_name="attempt_log")
    number = models.PositiveIntegerField()
    at = models.DateTimeField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    response_excerpt = models.TextField(blank=True, help_text="The first 1,000 characters.")
    outcome = models.CharField(
        max_length=16, help_text="delivered, retry, failed, cancelled or refused."
    )

    class Meta:
        ordering = ("delivery", "number", "id")
        constraints = [
            models.UniqueConstraint(
                fields=("delivery", "number"), name="delivery_attempt_unique_number"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.delivery_id} #{self.number}: {self.outcome}"
