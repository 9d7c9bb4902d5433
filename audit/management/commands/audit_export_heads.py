"""``manage.py audit_export_heads [--output FILE]``: every chain's head, signed, as JSON.

Run it regularly (e.g. nightly) and keep the files away from the database (another machine,
object storage with retention); ``audit_verify --heads FILE`` then proves that nothing up to
those heads was deleted or rewritten. Set ``AUDIT_HEADS_KEY`` to a key the database does not
hold (default: derived from SECRET_KEY).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from audit.heads import audit_heads_export


class Command(BaseCommand):
    help = "Export every audit chain's head (last seq and hash), signed, as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--output", help="Write to this file instead of stdout.")

    def handle(self, *args: Any, **options: Any) -> None:
        text = json.dumps(audit_heads_export(), indent=1, sort_keys=True) + "\n"
        if options.get("output"):
            Path(options["output"]).write_text(text, encoding="utf-8")
            self.stderr.write(f"Wrote {options['output']}.")
        else:
            self.stdout.write(text, ending="")
