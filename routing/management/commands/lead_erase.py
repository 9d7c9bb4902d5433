"""``manage.py lead_erase --email X | --phone Y --reason "..."``: erase one person.

See routing/erasure.py.
"""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from routing.erasure import ErasureRefused, person_erase


class Command(BaseCommand):
    help = (
        "Erase one person's personal data from every lead of theirs (found by e-mail or phone); "
        "the routing decisions and a verifiable audit log remain."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--email", default="", help="The person's e-mail address.")
        parser.add_argument("--phone", default="", help="The person's phone (E.164 preferred).")
        parser.add_argument(
            "--reason", required=True, help="Why (recorded in the audit log; nothing personal)."
        )
        parser.add_argument(
            "--actor", default="", help="Who asked (recorded as the event's actor; default: you)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["reason"].strip():
            raise CommandError("--reason is required: why this person is erased")
        actor = options["actor"].strip() or f"cli:{getpass.getuser()}"
        try:
            result = person_erase(
                email=options["email"],
                phone=options["phone"],
                actor=actor,
                reason=options["reason"].strip(),
            )
        except ErasureRefused as error:
            raise CommandError(f"{error} (--email or --phone)") from None
        self.stdout.write(result.sentence())
