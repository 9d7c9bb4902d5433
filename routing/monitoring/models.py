"""Monitoring models: alerts, and the SLA breaches already handled (one per assignment)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

__all__ = [
    "Alert",
    "AlertKind",
    "AlertStatus",
    "MetricsState",
    "SlaBreach",
    "SlaBreachAction",
    "SlaCheckFailure",
    "SlaWarning",
]


class AlertKind(models.TextChoices):
    BACKLOG = "backlog", "Backlog"
    WORKER = "worker", "Worker (a queue nobody drains)"
    BROKER = "broker", "Broker unreachable"
    SLA = "sla", "SLA"
    UNASSIGNED = "unassigned", "Unassigned leads"
    ENRICHMENT = "enrichment", "Enrichment"
    DELIVERY = "delivery", "Delivery"
    RULES = "rules", "Published rules that no longer compile"
    AUDIT = "audit", "Audit (the nightly export of the chain heads)"
    SOURCE = "source", "Source (payloads refused past the threshold)"
    CRM = "crm", "CRM connection (credential refused, down, or rate limited)"
    RETENTION = "retention", "Retention (the job that prunes personal data failed)"


class AlertStatus(models.TextChoices):
    OPEN = "open", "Open"
    RESOLVED = "resolved", "Resolved"


class Alert(models.Model):
    """Something an operator must look at; at most one open per (kind, subject), self-resolving."""

    kind = models.CharField(max_length=32, choices=AlertKind.choices)
    subject = models.CharField(
        max_length=200, blank=True, help_text="What it is about: a queue, an assignment, ..."
    )
    status = models.CharField(max_length=16, choices=AlertStatus.choices, default=AlertStatus.OPEN)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    opened_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-opened_at", "-id")
        constraints = [
            models.UniqueConstraint(
                fields=("kind", "subject"),
                condition=Q(status="open"),
                name="alert_one_open_per_kind_subject",
            ),
            models.CheckConstraint(
                condition=Q(status__in=("open", "resolved")), name="alert_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(status="open", resolved_at__isnull=True)
                | Q(status="resolved", resolved_at__isnull=False),
                name="alert_resolved_iff_resolved_at",
            ),
        ]
        indexes = [models.Index(fields=("status", "kind"), name="alert_status_kind_idx")]

    def __str__(self) -> str:
        label = f"{self.kind}:{self.subject}" if self.subject else self.kind
        return f"{label} ({self.status})"


class SlaBreachAction(models.TextChoices):
    NOTIFIED = "notified", "Notified"
    REASSIGNED = "reassigned", "Reassigned"
    KEPT = "kept", "Kept (no reassignment possible or allowed)"


class SlaBreach(models.Model):
    """An assignment whose first-touch SLA ran out, handled once: the row is the idempotency key.

    The one-to-one makes a second ``sla_breached`` event for one assignment impossible to store,
    even with two beat schedulers running ``check_sla`` at the same moment.
    """

    assignment = models.OneToOneField(
        "routing.Assignment", on_delete=models.PROTECT, related_name="sla_breach"
    )
    lead = models.ForeignKey("leads.Lead", on_delete=models.PROTECT, related_name="+")
    breached_at = models.DateTimeField()
    action = models.CharField(
        max_length=16, choices=SlaBreachAction.choices, default=SlaBreachAction.NOTIFIED
    )
    reassigned_to = models.OneToOneField(
        "routing.Assignment",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="sla_breach_origin",
    )
    note = models.TextField(blank=True)

    class Meta:
        ordering = ("-breached_at",)
        verbose_name = "SLA breach"
        constraints = [
            models.CheckConstraint(
                condition=Q(action__in=("notified", "reassigned", "kept")),
                name="sla_breach_action_valid",
            ),
            models.CheckConstraint(
                condition=Q(action="reassigned", reassigned_to__isnull=False)
                | (~Q(action="reassigned") & Q(reassigned_to__isnull=True)),
                name="sla_breach_reassigned_iff_target",
            ),
        ]

    def __str__(self) -> str:
        return f"SLA breach of assignment {self.assignment_id} ({self.action})"


class SlaCheckFailure(models.Model):
    """An assignment whose SLA handling raised: tried again after a growing pause, not first.

    ``check_sla`` skips an assignment while ``retry_at`` is in the future, so a row that always
    fails (a broken notification, a bad team) cannot hold up the breaches behind it; after
    ``SLA_CHECK_ALERT_AFTER_FAILURES`` failures it raises an ``sla`` alert. Deleted once the
    assignment is handled (or no longer due).
    """

    assignment = models.OneToOneField(
        "routing.Assignment", on_delete=models.CASCADE, related_name="sla_check_failure"
    )
    failures = models.PositiveIntegerField(default=0)
    first_failed_at = models.DateTimeField()
    last_failed_at = models.DateTimeField()
    retry_at = models.DateTimeField(db_index=True)
    last_error = models.TextField(blank=True)

    class Meta:
        verbose_name = "SLA check failure"

    def __str__(self) -> str:
        return f"SLA check of assignment {self.assignment_id} failed {self.failures} time(s)"


class MetricsState(models.Model):
    """The counters /metrics serves, summed up to a high-water mark (``routing.monitoring.
    counters``): a scrape adds only the rows past it instead of counting whole tables."""

    key = models.CharField(max_length=32, primary_key=True)
    data = models.JSONField(default=dict, blank=True)
    refreshed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "metrics state"

    def __str__(self) -> str:
        return f"metrics state {self.key} (refreshed {self.refreshed_at})"


class SlaWarning(models.Model):
    """An assignment whose rep was warned that its SLA is about to run out: at most one each."""

    assignment = models.OneToOneField(
        "routing.Assignment", on_delete=models.PROTECT, related_name="sla_warning"
    )
    warned_at = models.DateTimeField()
    sla_due_at = models.DateTimeField(help_text="The deadline the warning was about.")

    class Meta:
        ordering = ("-warned_at",)
        verbose_name = "SLA warning"

    def __str__(self) -> str:
        return f"{self.assignment_id} warned at {self.warned_at.isoformat()}"
