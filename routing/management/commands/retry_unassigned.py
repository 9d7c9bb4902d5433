"""``manage.py retry_unassigned``: send a batch of unassigned leads through routing again
(beat: every UNASSIGNED_RETRY_SECONDS)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from routing.monitoring.unassigned import unassigned_retry


class Command(BaseCommand):
    help = (
        "Send up to UNASSIGNED_RETRY_BATCH_SIZE unassigned leads whose next retry is due, "
        "oldest first, through routing again (what beat's maintenance.retry_unassigned does on "
        "its schedule; the interval doubles per retry up to UNASSIGNED_RETRY_MAX_SECONDS)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=int,
            default=None,
            help="How many leads at most (default UNASSIGNED_RETRY_BATCH_SIZE).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        sent = unassigned_retry(batch_size=options["batch_size"])
        self.stdout.write(f"{sent} unassigned lead(s) sent through routing again.")
