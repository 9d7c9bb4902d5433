"""``manage.py person_export --email X | --phone Y``: everything held about one person, as JSON.

See audit/subject_access.py.
"""

from __future__ import annotations

import getpass
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.subject_access import SubjectAccessRefused, person_export


class Command(BaseCommand):
    help = "Print everything held about one person (found by e-mail or phone) as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--email", default="", help="The person's e-mail address.")
        parser.add_argument("--phone", default="", help="The person's phone (E.164 preferred).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            document = person_export(
                email=options["email"], phone=options["phone"], actor=f"cli:{getpass.getuser()}"
            )
        except SubjectAccessRefused as error:
            raise CommandError(f"{error} (--email or --phone)") from None
        self.stdout.write(json.dumps(document, indent=2, ensure_ascii=False, default=str))
