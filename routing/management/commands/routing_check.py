"""``manage.py routing_check FILE [--leads N] [--prune]``: a CI job's check of a configuration
file. Validates it, runs its test cases against the file's configuration and prints the decision
diff against the published configuration over the last N leads. Writes nothing."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from routing.configuration import (
    BUSY_EXIT_STATUS,
    CHECK_LEADS_DEFAULT,
    ConfigurationBusy,
    configuration_check,
)
from routing.engine import RuleErrors
from routing.rules_io import rules_read
from routing.versions import Outcome

ROWS_SHOWN = 50


def _owner(outcome: Outcome) -> str:
    if outcome.status != "assigned":
        return outcome.status or "—"
    return f"{outcome.owner_label}" + (f" ({outcome.team})" if outcome.team else "")


class Command(BaseCommand):
    help = (
        "Check a routing configuration file (JSON, or YAML for .yaml/.yml) for CI: validate it, "
        "run its test cases against the file's configuration, and print how the decisions of "
        "the last N leads would change from the published configuration. Writes nothing; exit "
        "status 1 when the file has errors or a test case fails, 3 when the configuration is "
        "busy (an import, publish or replay under way: try again)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="Path of the configuration file.")
        parser.add_argument(
            "--leads",
            type=int,
            default=CHECK_LEADS_DEFAULT,
            metavar="N",
            help=f"Decide the last N processed leads both ways (default {CHECK_LEADS_DEFAULT}; "
            "0: no diff).",
        )
        parser.add_argument(
            "--prune",
            action="store_true",
            help="Check the file as routing_import --prune takes it: each section it has is the "
            "whole of that section.",
        )
        parser.add_argument(
            "--rows",
            type=int,
            default=ROWS_SHOWN,
            metavar="N",
            help=f"List at most N changed leads (default {ROWS_SHOWN}); all are counted.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["file"]
        if options["leads"] < 0 or options["rows"] < 0:
            raise CommandError("--leads and --rows take a number of at least 0.")
        try:
            report = configuration_check(
                data=rules_read(path), prune=options["prune"], leads=options["leads"]
            )
        except RuleErrors as exc:
            for error in exc.errors:
                self.stderr.write(str(error) or error.message)
            count = len(exc.errors)
            raise CommandError(f"{count} error{'s' if count != 1 else ''} in {path}.") from None
        except ConfigurationBusy as exc:
            raise CommandError(
                f"{exc} (exit status {BUSY_EXIT_STATUS}: busy, try again)",
                returncode=BUSY_EXIT_STATUS,
            ) from None
        self.stdout.write(f"{path} is valid.")
        failing = report.failing
        self.stdout.write(
            f"Test cases: {len(report.results) - len(failing)} of {len(report.results)} passed "
            "against the file's configuration."
        )
        for result in failing:
            self.stdout.write(f'  ✗ "{result.case.name}": {"; ".join(result.problems)}')
        if report.published_version is None:
            self.stdout.write("No version is published: no decisions to compare.")
        else:
            self.stdout.write(
                f"Decisions against published version {report.published_version} over the last "
                f"{report.considered} processed leads: {report.changed} would change."
            )
            for row in report.rows[: options["rows"]]:
                lead = row.lead
                who = lead.email or lead.company or "(no e-mail)"
                self.stdout.write(
                    f"  lead {lead.pk} {who}: {_owner(row.before)} → {_owner(row.after)}"
                    + (f" [rule {row.after.rule}]" if row.after.rule else "")
                )
            if report.changed > options["rows"] and report.rows:
                self.stdout.write(f"  ... and {report.changed - options['rows']} more")
            for rep, before, after in report.per_rep:
                self.stdout.write(f"  {rep}: {before} → {after} ({after - before:+d})")
        if failing:
            raise CommandError(
                f"{len(failing)} test case(s) fail against {path}; nothing was written."
            )
        self.stdout.write(self.style.SUCCESS("OK. Nothing was written."))
