"""``manage.py enrichment_sweep``: re-send due enrichment tries now (what beat does every 10 s)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from routing.enrichment.services import enrichment_sweep_due


class Command(BaseCommand):
    help = (
        "Re-send enrichment tries that are due (scheduled retries, lost messages, expired "
        "claims) and hand finished leads back to routing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        count = enrichment_sweep_due(batch_size=options["batch_size"])
        self.stdout.write(f"Sent {count} lead(s).")
