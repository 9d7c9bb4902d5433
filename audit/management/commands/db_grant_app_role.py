"""``manage.py db_grant_app_role --role NAME [--password-env VAR]``: the app's database role.

Run as the owner of the tables (the migration role) right after ``migrate``: creates the role
when it does not exist (its password read from the environment variable named by
``--password-env``, never from the command line), and grants it ordinary DML on every table but
only SELECT and INSERT on the audit log. Idempotent. See docs/operations.md, "Database roles".
"""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from audit.db_roles import RoleError, app_role_grant


class Command(BaseCommand):
    help = "Create or update the role web, worker and beat connect as (PostgreSQL)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--role", required=True, help="The app role, e.g. leadrouter_app.")
        parser.add_argument(
            "--password-env",
            help="Environment variable holding the role's password: sets it (creates the "
            "role if missing). Without it the role must exist already.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if connection.vendor != "postgresql":
            self.stdout.write(f"{connection.vendor} has no database roles: nothing to grant.")
            return
        password = None
        if options.get("password_env"):
            password = os.environ.get(options["password_env"], "")
            if not password:
                raise CommandError(f"{options['password_env']} is not set or empty")
        try:
            done = app_role_grant(role=options["role"], password=password)
        except RoleError as error:
            raise CommandError(str(error)) from None
        for line in done:
            self.stdout.write(line, style_func=None)
        self.stdout.write(
            f"{options['role']}: DML on the app's tables, SELECT and INSERT only on the audit log."
        )
