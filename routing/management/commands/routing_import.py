"""``manage.py routing_import FILE [--publish]``: load a rules-as-code file (rules-format.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from routing.engine import RuleErrors
from routing.rules_io import rules_import, rules_read


class Command(BaseCommand):
    help = (
        "Validate a rules file (JSON, or YAML for .yaml/.yml) and upsert its sources, reps, "
        "teams, territories, accounts and value lists; its ruleset becomes a new draft version. "
        "Nothing is written when anything is wrong: every error is printed with its path."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="Path of the rules file.")
        parser.add_argument(
            "--publish",
            action="store_true",
            help="Publish the imported ruleset (archives the version published before).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = rules_import(rules_read(options["file"]), publish=options["publish"])
        except RuleErrors as exc:
            for error in exc.errors:
                self.stderr.write(str(error) or error.message)
            count = len(exc.errors)
            raise CommandError(
                f"{count} error{'s' if count != 1 else ''} in {options['file']}; nothing written."
            ) from None
        ruleset = result.ruleset
        what = "new version" if result.created else "unchanged; reused version"
        self.stdout.write(
            self.style.SUCCESS(
                f"Imported {options['file']}: ruleset {what} {ruleset.version} ({ruleset.status})."
            )
        )
        for slug, token in sorted(result.source_tokens.items()):
            self.stdout.write(
                self.style.WARNING(
                    f"Token for new source {slug}: {token} — copy it now, it is not shown again."
                )
            )
