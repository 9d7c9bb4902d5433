"""``manage.py check_sla``: handle breached SLAs once each (beat: every minute)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from routing.monitoring.sla import sla_check


class Command(BaseCommand):
    help = (
        "Record an sla_breached event and notify for every active, untouched assignment past "
        "its SLA (once each), reassigning within the team where the rule says so."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        result = sla_check()
        self.stdout.write(
            f"{result.breached} breach(es): {result.reassigned} reassigned, "
            f"{result.kept} kept with an alert; {result.alerts_resolved} alert(s) resolved."
        )
