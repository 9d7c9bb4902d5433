"""``manage.py routing_export [--version N] [--output FILE]``: write the rules as code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser

from routing.models import RuleSet
from routing.rules_io import rules_export


class Command(BaseCommand):
    help = (
        "Write sources, reps, teams, territories, accounts, value lists and the published "
        "ruleset (or --version N) as rules-format JSON, to stdout or --output FILE."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # api.md names the option --version, which Django reserves for its own version: ours wins.
        kwargs.setdefault("conflict_handler", "resolve")
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--version",
            type=int,
            metavar="N",
            help="Ruleset version to export (default: the published one).",
        )
        parser.add_argument("--output", help="Write to this file instead of stdout.")
        parser.add_argument(
            "--format",
            choices=("json", "yaml"),
            help="json (default) or yaml; an --output file ending in .yaml or .yml means yaml.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            document = rules_export(options["version"])
        except RuleSet.DoesNotExist as exc:
            raise CommandError(f"{exc}.") from None
        output = options["output"] or ""
        fmt = options["format"] or (
            "yaml" if output.lower().endswith((".yaml", ".yml")) else "json"
        )
        if fmt == "yaml":
            text = yaml.safe_dump(
                document, sort_keys=False, allow_unicode=True, default_flow_style=False
            )
        else:
            text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
        if options["output"]:
            Path(options["output"]).write_text(text, encoding="utf-8")
            self.stderr.write(f"Wrote {options['output']}.")
        else:
            self.stdout.write(text, ending="")
