"""``manage.py reconcile_rep_loads``: compare the reps' load counters with their assignments and
repair drift (beat: every ``REP_LOAD_RECONCILE_SECONDS``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from routing.loads import rep_loads_reconcile


class Command(BaseCommand):
    help = (
        "Compare every rep's open and today's lead counters with their assignments and repair "
        "any that drifted (logged, and counted in leadrouter_rep_load_drift)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        report = rep_loads_reconcile()
        self.stdout.write(
            f"{report.reps} rep(s) checked, {report.suspects} recounted, {report.repaired} "
            f"repaired (open drift {report.drift_open}, today drift {report.drift_today})."
        )
