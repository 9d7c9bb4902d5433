"""``manage.py check_backlog``: measure the backlog and open or resolve alerts (beat: every min)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand

from routing.monitoring.backlog import backlog_check


class Command(BaseCommand):
    help = (
        "Measure leads waiting, the oldest one, broker queue lengths, worker heartbeats and "
        "enrichment failures; open or resolve the backlog, worker, broker, enrichment and "
        "unassigned alerts (what beat's maintenance.check_backlog does every minute)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = backlog_check()
        self.stdout.write(json.dumps(report.as_data(), indent=2, sort_keys=True))
        if report.problems:
            self.stdout.write("Backlog: " + "; ".join(report.problems))
