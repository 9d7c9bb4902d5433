"""``manage.py retention_apply [--dry-run]``: apply the retention periods now.

The beat job does the same every ``RETENTION_INTERVAL_SECONDS`` (routing/retention/).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from leads.models import Source
from routing.retention.services import (
    POLICIES,
    retention_apply,
    retention_due_count,
    retention_periods,
)


class Command(BaseCommand):
    help = (
        "Prune what the retention periods (RETENTION_* settings, each source's own) no longer "
        "let LeadRouter keep; --dry-run only counts what is due."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="Count the leads due per policy; change nothing."
        )
        parser.add_argument(
            "--max-seconds",
            type=float,
            default=None,
            help="Stop after this long (default RETENTION_MAX_SECONDS); run again to go on.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for source in Source.objects.order_by("slug"):
            periods = retention_periods(source)
            shown = ", ".join(
                f"{policy} {periods[policy]} d" if periods[policy] else f"{policy} kept"
                for policy in POLICIES
            )
            self.stdout.write(f"{source.slug}: {shown}")
        if options["dry_run"]:
            due = retention_due_count()
            self.stdout.write(
                "due now: " + ", ".join(f"{policy} {n} lead(s)" for policy, n in due.items())
            )
            return
        result = retention_apply(max_seconds=options["max_seconds"])
        self.stdout.write(f"pruned: {result.sentence()}")
