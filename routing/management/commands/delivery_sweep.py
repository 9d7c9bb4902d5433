"""``manage.py delivery_sweep [--inline]``: queue (or send here) the deliveries that are due."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from routing.delivery.services import deliveries_sweep_due


class Command(BaseCommand):
    help = (
        "Publish a delivery.deliver task for every pending delivery that is due (what beat's "
        "delivery.sweep_due does every 15 s), or with --inline attempt them in this process."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--inline",
            action="store_true",
            help="Attempt the due deliveries here instead of queueing them (no worker needed).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        count = deliveries_sweep_due(inline=options["inline"])
        verb = "attempted" if options["inline"] else "queued"
        self.stdout.write(f"{count} due delivery(ies) {verb}.")
