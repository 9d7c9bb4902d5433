"""``manage.py privacy_rewrap``: re-wrap every person's data key under the first PRIVACY_KEYS key.

Rotation: put a new key first in ``PRIVACY_KEYS`` (``--new-key`` prints one), restart, run this,
then drop the old key. Nothing sealed is rewritten: it is sealed with the per-person data keys,
which do not change; only their wrapping does.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from leads import privacy


class Command(BaseCommand):
    help = "Re-wrap every person's data key under the first PRIVACY_KEYS key (key rotation)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--new-key", action="store_true", help="Only print a new key for PRIVACY_KEYS."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["new_key"]:
            self.stdout.write(privacy.new_master_key())
            return
        try:
            count = privacy.rewrap_all()
        except privacy.PrivacyKeyError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(f"re-wrapped {count} person key(s) under the first PRIVACY_KEYS key")
