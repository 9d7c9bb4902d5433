"""``manage.py routing_import FILE [--publish [--force]] [--prune] | --check``: load a
rules-as-code file (the whole routing configuration, rules-format.md) into a draft of the whole
configuration (without ``--publish``: nothing live changes), publish it (``--publish``: the
saved test cases first), or only check it."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse

from routing.configuration import BUSY_EXIT_STATUS, ConfigurationBusy, configuration_import
from routing.drafts.services import DraftRefused, FileIntoDraft, config_draft_import_file
from routing.engine import RuleErrors
from routing.rules_io import rules_check, rules_read
from routing.versions import TestCasesFailing

CHANGES_SHOWN = 50


class Command(BaseCommand):
    help = (
        "Validate a rules file (JSON, or YAML for .yaml/.yml) and load it into a new draft of "
        "the whole configuration (its sources, reps, teams, territories, accounts, value lists, "
        "ruleset and test cases, as an import would leave the published configuration), to "
        "test, diff and publish in the admin or with the configuration API: nothing live "
        "changes. With --publish, upsert it and publish it after the saved test cases pass. "
        "Nothing is written when anything is wrong: every error is printed with its path "
        "(exit status 1; 3 when the configuration is busy with another import, publish or "
        "replay: try again)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="Path of the rules file.")
        parser.add_argument(
            "--publish",
            action="store_true",
            help="Write the file to the live tables and publish its ruleset (archives the "
            "version published before), after running every saved test case against the "
            "imported configuration: refused, with nothing written, when one fails (unless "
            "--force). Without it, the file becomes a configuration draft.",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="With --publish: publish even though saved test cases fail (the audit log "
            "records which).",
        )
        parser.add_argument(
            "--prune",
            action="store_true",
            help="Delete, in every section the file has, what it no longer names; refused, with "
            "nothing written, for what live leads or live rules still need. Into a draft: the "
            "draft leaves those rows out (but reps, which a draft never deletes).",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="Only validate the file against the database and say whether its ruleset "
            "differs from the published one; write nothing (exit status 1 on errors).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["check"] and (options["publish"] or options["prune"]):
            raise CommandError(
                "--check writes nothing: it cannot be combined with --publish or --prune "
                "(routing_check FILE [--prune] checks a file as an import would take it)."
            )
        if options["force"] and not options["publish"]:
            raise CommandError("--force only applies to --publish.")
        try:
            data = rules_read(options["file"])
            if options["check"]:
                self._check(options["file"], data)
                return
            if not options["publish"]:
                self._into_draft(options["file"], data, prune=options["prune"])
                return
            imported = configuration_import(
                data=data,
                publish=options["publish"],
                prune=options["prune"],
                force=options["force"],
                file_name=str(options["file"]),
            )
        except ConfigurationBusy as exc:
            raise CommandError(
                f"{exc} (exit status {BUSY_EXIT_STATUS}: busy, try again)",
                returncode=BUSY_EXIT_STATUS,
            ) from None
        except DraftRefused as exc:
            raise CommandError(str(exc)) from None
        except TestCasesFailing as exc:
            for case_result in exc.results:
                if not case_result.passed:
                    problems = "; ".join(case_result.problems)
                    self.stderr.write(f'test_cases: "{case_result.case.name}" fails: {problems}')
            raise CommandError(
                f"{exc}. Not published; nothing written (fix the file, or --force to publish "
                "anyway)."
            ) from None
        except RuleErrors as exc:
            for error in exc.errors:
                self.stderr.write(str(error) or error.message)
            count = len(exc.errors)
            raise CommandError(
                f"{count} error{'s' if count != 1 else ''} in {options['file']}; nothing written."
            ) from None
        result = imported.result
        ruleset = result.ruleset
        what = "new version" if result.created else "unchanged; reused version"
        self.stdout.write(
            self.style.SUCCESS(
                f"Imported {options['file']}: ruleset {what} {ruleset.version} ({ruleset.status})."
            )
        )
        for section, tally in sorted(imported.counts.items()):
            done = ", ".join(f"{number} {key}" for key, number in tally.items() if number)
            if done:
                self.stdout.write(f"  {section}: {done}")
        if imported.published:
            passed = sum(1 for r in imported.test_results if r.passed)
            self.stdout.write(f"Test cases: {passed} of {len(imported.test_results)} passed.")
        if imported.failing:
            self.stdout.write(
                self.style.WARNING(
                    f"Published with {len(imported.failing)} failing test case(s) (--force): "
                    + ", ".join(imported.failing)
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

    def _into_draft(self, path: str, data: Any, *, prune: bool) -> None:
        into: FileIntoDraft = config_draft_import_file(
            data=data, prune=prune, actor="routing_import", note=f"routing_import {path}"
        )
        for note in into.left_out:
            self.stderr.write(self.style.WARNING(note))
        draft = into.draft
        if draft is None:
            self.stdout.write(
                self.style.SUCCESS(
                    f"{path} changes nothing in the published configuration: no draft made."
                )
            )
            return
        count = len(into.changes)
        self.stdout.write(
            self.style.SUCCESS(
                f"Imported {path} into configuration draft {draft.pk}: {count} "
                f"change{'s' if count != 1 else ''} to the published configuration. Nothing "
                "live changed."
            )
        )
        for change in into.changes[:CHANGES_SHOWN]:
            self.stdout.write(f"  {change.words}")
        if count > CHANGES_SHOWN:
            self.stdout.write(f"  ... and {count - CHANGES_SHOWN} more")
        admin = reverse("admin:routing_configdraft_change", args=[draft.pk])
        api = reverse("config-draft", args=[draft.pk])
        self.stdout.write(
            f"Draft {draft.pk}: {admin} in the admin, {api} in the configuration API. Test, "
            "diff and publish it there (its saved test cases run before it publishes)."
        )
