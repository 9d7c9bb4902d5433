"""Drafts of the whole routing configuration and the numbered snapshots publishing them leaves.

A draft holds a configuration document in the rules-as-code format (rules-format.md), begun
from the published configuration (``base_document``, with its digest to tell when it went
stale). Publishing it writes the tables in one transaction and stores a ``ConfigSnapshot``:
numbered from 1, the whole configuration as it was then published, never changed afterwards.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

__all__ = ["ConfigDraft", "ConfigDraftStatus", "ConfigSnapshot", "ConfigSnapshotKind"]


class ConfigSnapshotKind(models.TextChoices):
    BASELINE = "baseline", "Baseline (the configuration before the first draft)"
    DRAFT = "draft", "Published draft"
    ROLLBACK = "rollback", "Rollback"
    IMPORT = "import", "routing_import"
    LIVE = "live", "Live change (admin, CSV import, ruleset publish)"


class ConfigSnapshot(models.Model):
    """One published version of the whole routing configuration; immutable once stored."""

    number = models.PositiveIntegerField(unique=True)
    kind = models.CharField(max_length=16, choices=ConfigSnapshotKind.choices)
    document = models.JSONField(help_text="The whole configuration, as routing_export has it.")
    digest = models.CharField(max_length=64, help_text="SHA-256 of the document, canonical.")
    ruleset_version = models.PositiveIntegerField(
        help_text="The ruleset version published with it: the version each lead records."
    )
    published_at = models.DateTimeField()
    published_by = models.CharField(max_length=200)
    note = models.TextField(blank=True)
    rolled_back_to = models.PositiveIntegerField(
        null=True, blank=True, help_text="The snapshot this rollback published again."
    )
    failing_test_cases = models.JSONField(
        default=list, blank=True, help_text="Test cases that failed and were published over."
    )
    rep_ids = models.JSONField(
        default=dict,
        blank=True,
        help_text="Each rep's id by lower-cased e-mail when stored: a rollback finds by its id "
        "a rep whose e-mail changed since, and never creates one.",
    )

    class Meta:
        ordering = ("-number",)
        verbose_name = "configuration version"
        constraints = [
            models.CheckConstraint(
                condition=Q(number__gte=1), name="config_snapshot_number_positive"
            )
        ]

    def __str__(self) -> str:
        return f"configuration v{self.number}"


class ConfigDraftStatus(models.TextChoices):
    OPEN = "open", "Open"
    PUBLISHED = "published", "Published"
    DISCARDED = "discarded", "Discarded"


class ConfigDraft(models.Model):
    """A draft of the whole routing configuration: a document changed until it is published."""

    status = models.CharField(
        max_length=16, choices=ConfigDraftStatus.choices, default=ConfigDraftStatus.OPEN
    )
    note = models.CharField(max_length=200, blank=True)
    document = models.JSONField(help_text="The configuration the draft proposes.")
    base_document = models.JSONField(help_text="The published configuration it began from.")
    base_digest = models.CharField(max_length=64)
    base_number = models.PositiveIntegerField(
        null=True, blank=True, help_text="The latest configuration version when it began."
    )
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    published_as = models.ForeignKey(
        ConfigSnapshot,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="drafts",
    )

    class Meta:
        ordering = ("-id",)
        verbose_name = "configuration draft"
        constraints = [
            models.CheckConstraint(
                condition=Q(status="published", published_as__isnull=False)
                | (~Q(status="published") & Q(published_as__isnull=True)),
                name="config_draft_published_has_version",
            )
        ]

    def __str__(self) -> str:
        return f"configuration draft {self.pk} ({self.status})"
