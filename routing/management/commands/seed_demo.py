"""``manage.py seed_demo``: the demo company (Northwind Cloud) for a first look. Idempotent."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from routing.demo import company
from routing.demo.seed import LOGINS, demo_seed, demo_state_path


class Command(BaseCommand):
    help = (
        "Create the demo company: 4 teams, 15 reps, territories, 30 named accounts, value lists, "
        "a published ruleset with saved test cases, two sources, and admin, RevOps and "
        "sales-manager logins. Idempotent: a second run changes nothing and prints the same "
        "logins and tokens."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--if-empty",
            action="store_true",
            help="Only seed when the database has no users yet (used by `make run`).",
        )
        parser.add_argument(
            "--base-url",
            default="http://127.0.0.1:8000",
            help="Where the web server answers, for the URLs printed at the end.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["if_empty"] and get_user_model().objects.exists():
            self.stdout.write("Database already has data; not seeding.")
            return
        result = demo_seed()
        state = result.state
        base = options["base_url"].rstrip("/")
        say = self.stdout.write
        version = f"v{result.ruleset_version}"
        say(self.style.SUCCESS("Demo company Northwind Cloud is ready."))
        say(
            f"  Ruleset {version} is published"
            f"{'' if result.ruleset_created else ' (unchanged)'}; "
            f"{result.test_cases} saved test cases."
        )
        say("  Logins:")
        for username, (role, *_) in LOGINS.items():
            say(f"    {username} / {state.passwords[username]}   {role}")
        say("  Sources (tokens are shown here because this is a demo; keep real ones secret):")
        for slug in (company.FORM_SOURCE, company.WEBINAR_SOURCE):
            say(f"    {base}/api/v1/intake/{slug}/   token {state.source_tokens[slug]}")
        say(
            "  Try: curl -X POST -H 'Authorization: Bearer "
            f"{state.source_tokens[company.FORM_SOURCE]}' -H 'Content-Type: application/json' "
            '-d \'{"your-email": "lea@spree-digital.de", "company-name": "Spree Digital", '
            f'"country-code": "DE", "zip": "10115"}}\' {base}/api/v1/intake/'
            f"{company.FORM_SOURCE}/"
        )
        say(f"  (kept in {demo_state_path()}, readable only by you)")
