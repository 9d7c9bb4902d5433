"""``manage.py requeue_stale``: re-enqueue leads left waiting in ``received``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from leads.services import leads_requeue_stale


class Command(BaseCommand):
    help = "Re-enqueue leads waiting in 'received' longer than --older-than seconds."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than", type=int, default=None, help="seconds (default: setting)"
        )
        parser.add_argument("--batch-size", type=int, default=None)
        parser.add_argument("--max-batches", type=int, default=20)

    def handle(self, *args: Any, **options: Any) -> None:
        older = options["older_than"]
        count = leads_requeue_stale(
            older_than=timedelta(seconds=older) if older is not None else None,
            batch_size=options["batch_size"],
            max_batches=options["max_batches"],
        )
        self.stdout.write(f"Re-enqueued {count} lead(s).")
