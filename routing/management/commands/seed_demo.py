"""``manage.py seed_demo``: demo data for a first look. Idempotent."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from routing.editor.permissions import revops_group_sync

DEMO_GROUPS = ("RevOps", "Sales managers")


class Command(BaseCommand):
    help = "Create demo data and an admin login (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--if-empty",
            action="store_true",
            help="Only seed when the database has no users yet (used by `make run`).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        if options["if_empty"] and user_model.objects.exists():
            self.stdout.write("Database already has data; not seeding.")
            return
        with transaction.atomic():
            for name in DEMO_GROUPS:
                Group.objects.get_or_create(name=name)
            revops_group_sync()  # the RevOps group may edit routing in the admin
            admin, created = user_model.objects.get_or_create(
                username="admin",
                defaults={"email": "admin@example.com", "is_staff": True, "is_superuser": True},
            )
            login_file = settings.VAR_DIR / "demo-login.txt"
            if created or not login_file.exists():
                password = secrets.token_urlsafe(12)
                admin.set_password(password)
                admin.save(update_fields=["password"])
                login_file.write_text(f"admin {password}\n")
                login_file.chmod(0o600)
        username, password = login_file.read_text().split()
        self.stdout.write(self.style.SUCCESS(f"Demo admin login: {username} / {password}"))
