"""The append-only audit log: one row per thing that happened to a lead or to routing.

Rows are written by services in the same transaction as the change they record, never through
signals. The database refuses UPDATE and DELETE on the table (triggers created by migrations,
see ``audit.triggers``); each row carries the hash of the previous row of its chain (one chain
per lead, one for routing configuration), so ``manage.py audit_verify`` can tell exactly which
rows were altered or removed by someone who bypassed the triggers.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from typing import Any

from django.db import models
from django.db.models.query import ModelIterable
from django.utils import timezone

# Set while an event queryset loads a chunk of rows: ``Event.from_db`` then leaves the sealed
# content for the chunk to open at once, with one person-key lookup (audit.sealing.events_open).
_OPEN_LATER: contextvars.ContextVar[bool] = contextvars.ContextVar("open_later", default=False)
_OPEN_CHUNK = 500


class _OpenedEventIterable(ModelIterable):
    """Events loaded a chunk at a time, their sealed content opened per chunk: a page of N
    events of N people costs one person-key query, not N."""

    def __iter__(self) -> Iterator[Any]:
        from audit.sealing import events_open

        rows = super().__iter__()
        while True:
            chunk = []
            token = _OPEN_LATER.set(True)
            try:
                for event in rows:  # the rows' own code runs with the flag set, not the caller's
                    chunk.append(event)
                    if len(chunk) >= _OPEN_CHUNK:
                        break
            finally:
                _OPEN_LATER.reset(token)
            if not chunk:
                return
            events_open(chunk)
            yield from chunk


class EventQuerySet(models.QuerySet):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._iterable_class = _OpenedEventIterable


class EventType(models.TextChoices):
    RECEIVED = "received"
    DUPLICATE_DETECTED = "duplicate_detected"
    ENRICHED = "enriched"
    ENRICHMENT_FAILED = "enrichment_failed"
    CRM_CHECKED = "crm_checked"
    ASSIGNED = "assigned"
    EXCLUDED = "excluded"
    UNASSIGNED = "unassigned"
    DELIVERED = "delivered"
    DELIVERY_FAILED = "delivery_failed"
    TOUCHED = "touched"
    SLA_BREACHED = "sla_breached"
    REASSIGNED = "reassigned"
    REROUTE_REQUESTED = "reroute_requested"
    FAILED = "failed"
    RULES_PUBLISHED = "rules_published"
    CONFIG_IMPORTED = "config_imported"
    CONFIG_CHANGED = "config_changed"
    ERASED = "erased"
    PRUNED = "pruned"


# The chain of events that are not about one lead (rules published, configuration changes).
ROUTING_CHAIN = "routing"


class Event(models.Model):
    """One audit event. Names are snapshots, so history reads right after renames/deletions."""

    id = models.BigAutoField(primary_key=True)
    chain = models.CharField(max_length=64, help_text="The lead's id, or 'routing'.")
    seq = models.PositiveIntegerField(help_text="Position in its chain, from 1.")
    lead = models.ForeignKey(
        "leads.Lead", on_delete=models.PROTECT, null=True, blank=True, related_name="events"
    )
    type = models.CharField(max_length=32, choices=EventType.choices)
    at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=200, default="system")
    # No database constraint: a rep, team or rule may be deleted; the event keeps its snapshot.
    rep = models.ForeignKey(
        "routing.Rep",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )
    team = models.ForeignKey(
        "routing.Team",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )
    rule = models.ForeignKey(
        "routing.Rule",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )
    rep_name = models.CharField(max_length=200, blank=True)
    team_name = models.CharField(max_length=200, blank=True)
    rule_name = models.CharField(max_length=200, blank=True)
    ruleset_version = models.PositiveIntegerField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)
    trace = models.JSONField(default=list, blank=True)
    # The personal part of data and the trace, sealed with the person's key (leads/privacy.py):
    # unreadable once the key is erased; the hash covers the ciphertext, so the chain holds.
    person_key = models.ForeignKey(
        "leads.PersonKey",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )
    # NULL (not "") when nothing is sealed: SQLite then adds the column in place, without
    # rebuilding the append-only table (and dropping its triggers).
    sealed = models.TextField(null=True, blank=True)  # noqa: DJ001
    prev_hash = models.CharField(max_length=64, blank=True)
    hash = models.CharField(max_length=64)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ("chain", "seq")
        constraints = [
            models.UniqueConstraint(fields=("chain", "seq"), name="audit_event_chain_seq_unique"),
            models.CheckConstraint(condition=models.Q(seq__gte=1), name="audit_event_seq_from_1"),
        ]
        indexes = [
            models.Index(fields=("type", "at"), name="audit_event_type_at_idx"),
            models.Index(fields=("at",), name="audit_event_at_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.seq} of {self.chain}"

    @classmethod
    def from_db(cls, *args: Any, **kwargs: Any) -> Event:
        """Loaded with its sealed content opened (or "erased person" when the key is gone);
        by its queryset a chunk at a time, otherwise (a related object) one by one."""
        event = super().from_db(*args, **kwargs)
        if event.__dict__.get("sealed") and not _OPEN_LATER.get():
            from audit.sealing import event_open

            event_open(event)
        return event


class UserSettings(models.Model):
    """A user's own page settings: the time zone every page shows times in."""

    user = models.OneToOneField(
        "auth.User", on_delete=models.CASCADE, related_name="page_settings", primary_key=True
    )
    time_zone = models.CharField(
        max_length=64,
        blank=True,
        help_text="IANA time zone name (e.g. Europe/Berlin); empty = the browser's, then the "
        "server's.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "user settings"
        verbose_name_plural = "user settings"

    def __str__(self) -> str:
        return f"settings of user {self.user_id}"


class ReportSlot(models.Model):
    """A 15-minute count for the long report windows, kept by triggers (audit.rollups): leads
    received by their current status (``lead:<status>``), routed events (``routed``)."""

    slot = models.DateTimeField()
    measure = models.CharField(max_length=32)
    shard = models.PositiveSmallIntegerField()
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=("slot", "measure", "shard"), name="audit_reportslot_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.measure} at {self.slot}: {self.n}"


class AssignmentDay(models.Model):
    """A UTC day's assignments to a rep in a team, counted for the long report windows and kept
    by triggers (audit.rollups); ``tta_<k>``/``ttft_<k>`` are the histogram bins of time to
    assign and to first touch. ``team_key`` 0 is no team."""

    day = models.DateField()
    team_key = models.IntegerField()
    rep_id = models.IntegerField()
    assigned = models.IntegerField(default=0)
    first = models.IntegerField(default=0)
    initial = models.IntegerField(default=0)
    reassigned_in = models.IntegerField(default=0)
    with_sla = models.IntegerField(default=0)
    sla_met = models.IntegerField(default=0)
    sla_late = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=("day", "team_key", "rep_id"), name="audit_assignmentday_unique"
            )
        ]

    def __str__(self) -> str:
        return f"rep {self.rep_id}, team {self.team_key} on {self.day}"


def _histogram_fields() -> None:
    from audit.rollups import TTA_COLUMNS, TTFT_COLUMNS

    for name in TTA_COLUMNS + TTFT_COLUMNS:
        AssignmentDay.add_to_class(name, models.IntegerField(default=0))


_histogram_fields()
