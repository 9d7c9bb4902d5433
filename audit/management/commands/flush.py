"""``manage.py flush``, able to empty the append-only audit table.

Flushing erases the whole database on purpose (tests do it between transactional tests). The
audit triggers refuse that, so this lifts them inside the flush's own transaction on SQLite and
PostgreSQL (transactional DDL) and puts them back before it commits.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands import flush
from django.db import connections, transaction

from audit.triggers import triggers_create, triggers_drop


class Command(flush.Command):
    def handle(self, **options: Any) -> None:
        connection = connections[options["database"]]
        if connection.vendor not in ("postgresql", "sqlite"):
            super().handle(**options)
            return
        with transaction.atomic(using=connection.alias):
            triggers_drop(connection)
            super().handle(**options)
            # post_migrate (sent by flush) may have put them back already: drop, then create.
            triggers_drop(connection)
            triggers_create(connection)
