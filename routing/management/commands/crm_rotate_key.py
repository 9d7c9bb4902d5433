"""Re-encrypt every stored CRM credential (and Slack/Teams channel secret) under the first key.

Rotation: generate a key (``--new-key``), put it first in CRM_SECRET_KEYS (keeping the old one
after it), restart, run this command, then remove the old key. A credential no key opens is
reported and left as it is (save a new one on its connection).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from routing.crm.models import CrmConnection
from routing.crm.secrets import SecretUnreadable, new_key, secret_reseal
from routing.delivery.models import NotificationChannel


class Command(BaseCommand):
    help = "Re-encrypt the CRM credentials under the first CRM_SECRET_KEYS key (or print a key)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--new-key", action="store_true", help="print a new key for CRM_SECRET_KEYS and exit"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["new_key"]:
            self.stdout.write(new_key())
            return
        resealed = unreadable = 0
        with transaction.atomic():
            holders: list[CrmConnection | NotificationChannel] = [
                *CrmConnection.objects.select_for_update().exclude(secret_encrypted=""),
                *NotificationChannel.objects.select_for_update().exclude(secret_encrypted=""),
            ]
            for holder in holders:
                try:
                    holder.secret_encrypted = secret_reseal(holder.secret_encrypted)
                except SecretUnreadable as exc:
                    unreadable += 1
                    self.stderr.write(f"{holder.name}: {exc}")
                    continue
                holder.save(update_fields=["secret_encrypted"])
                resealed += 1
        self.stdout.write(f"{resealed} credential(s) re-encrypted, {unreadable} unreadable")
        if unreadable:
            raise SystemExit(1)
