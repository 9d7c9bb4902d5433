"""``manage.py audit_verify``: report audit rows altered or removed behind the triggers' back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.heads import audit_heads_check
from audit.verify import audit_verify

# Exit codes: 1 the log was tampered with (rows altered, relinked or removed); 3 the chains hold
# but sealed events cannot be opened and no erasure records why (lost keys).
LOST_KEYS_EXIT = 3


class Command(BaseCommand):
    help = (
        "Verify the audit log's hash chains; exit 1 naming each altered or removed row, 3 "
        "naming each person key lost without an erasure record."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--chain", help="Only this chain (a lead id, or 'routing').")
        parser.add_argument(
            "--heads",
            help="Also check the heads exported earlier to this file (audit_export_heads): "
            "catches deleted last rows and rewritten-and-rehashed chains.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = audit_verify(chain=options.get("chain"))
        findings = list(report.findings)
        summary = f"{report.events} events in {report.chains} chains"
        if report.erasures or report.sealed_erased:
            summary += (
                f"; {report.erasures} erasure(s) recorded, {report.sealed_erased} sealed "
                "event(s) of erased people (unreadable by design, not tampering)"
            )
        if options.get("heads"):
            try:
                document = json.loads(Path(options["heads"]).read_text(encoding="utf-8"))
                heads = audit_heads_check(document)
            except (OSError, ValueError) as error:
                raise CommandError(f"cannot use {options['heads']}: {error}") from None
            findings += heads.findings
            summary += f"; {heads.checked} exported heads checked"
        for finding in findings:
            self.stderr.write(str(finding))
        for problem in report.key_problems:
            self.stderr.write(str(problem))
        if findings:
            raise CommandError(f"audit log tampered: {len(findings)} finding(s); {summary}")
        if report.key_problems:
            unreadable = sum(problem.events for problem in report.key_problems)
            raise CommandError(
                f"audit log intact, but {len(report.key_problems)} person key(s) lost: "
                f"{unreadable} sealed event(s) cannot be opened and no erasure records why "
                '(not tampering; docs/operations.md, "Losing a key"); ' + summary,
                returncode=LOST_KEYS_EXIT,
            )
        self.stdout.write(f"audit log intact: {summary}")
