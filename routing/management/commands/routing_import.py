"""``manage.py routing_import FILE [--publish | --check]``: load a rules-as-code file
(rules-format.md), or only check it."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from routing.engine import RuleErrors
from routing.rules_io import rules_check, rules_import, rules_read


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
        parser.add_argument(
            "--check",
            action="store_true",
            help="Only validate the file against the database and say whether its ruleset "
            "differs from the published one; write nothing (exit status 1 on errors).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["check"] and options["publish"]:
            raise CommandError("--check writes nothing: it cannot be combined with --publish.")
        try:
            data = rules_read(options["file"])
            if options["check"]:
                self._check(options["file"], data)
                return
            result = rules_import(data, publish=options["publish"])
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

    def _check(self, path: str, data: Any) -> None:
        checked = rules_check(data)
        live = (
            f"published version {checked.published_version}"
            if checked.published_version is not None
            else "no published version"
        )
        what = (
            f"its ruleset differs from the {live}: importing it makes a new draft"
            if checked.ruleset_changed
            else f"its ruleset is the {live}"
        )
        self.stdout.write(self.style.SUCCESS(f"{path} is valid; {what}. Nothing written."))
