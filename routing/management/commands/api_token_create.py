"""``api_token_create --user U --scopes roster,read --name N [--expires-days D]``: a scoped API
token for the configuration API; prints its secret once (only a hash is stored)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from routing.config_api.tokens import ApiTokenInvalid, api_token_create


class Command(BaseCommand):
    help = "Create a scoped API token (read, draft, publish, roster) and print its secret once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True, help="The username the token acts for.")
        parser.add_argument("--scopes", required=True, help="Comma-separated: roster,read")
        parser.add_argument("--name", required=True, help="Who uses it, e.g. hr-sync.")
        parser.add_argument("--expires-days", type=int, default=None, help="Default: never.")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model()._default_manager.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f'No user "{options["user"]}".')
        days = options["expires_days"]
        if days is not None and days < 1:
            raise CommandError("--expires-days must be at least 1.")
        try:
            created = api_token_create(
                user=user,
                name=options["name"],
                scopes=options["scopes"],
                expires_at=timezone.now() + timedelta(days=days) if days else None,
                actor="command:api_token_create",
            )
        except ApiTokenInvalid as exc:
            raise CommandError(str(exc)) from None
        token = created.token
        self.stderr.write(
            f'Token "{token.name}" for {user.get_username()}, scopes {",".join(token.scopes)}'
            + (f", expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "")
            + ". The secret follows, shown this once:"
        )
        self.stdout.write(created.secret)
