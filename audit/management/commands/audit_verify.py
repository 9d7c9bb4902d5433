"""``manage.py audit_verify``: report audit rows altered or removed behind the triggers' back."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.verify import audit_verify


class Command(BaseCommand):
    help = "Verify the audit log's hash chains; exit 1 naming each altered or removed row."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--chain", help="Only this chain (a lead id, or 'routing').")

    def handle(self, *args: Any, **options: Any) -> None:
        report = audit_verify(chain=options.get("chain"))
        for finding in report.findings:
            self.stderr.write(str(finding))
        summary = f"{report.events} events in {report.chains} chains"
        if not report.ok:
            raise CommandError(f"audit log tampered: {len(report.findings)} finding(s); {summary}")
        self.stdout.write(f"audit log intact: {summary}")
