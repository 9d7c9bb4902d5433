"""``manage.py flush``, able to empty the append-only audit table, for the test suite only.

Tests flush the whole database between transactional tests. The audit triggers refuse that, so
this lifts them inside the flush's own transaction on SQLite and PostgreSQL (transactional DDL)
and puts them back before it commits. Anywhere else erasing the audit log is exactly what the
triggers exist to prevent: without ``AUDIT_ALLOW_FLUSH`` (set by the test settings only) the
command refuses before touching anything.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.core.management.commands import flush
from django.db import connections, transaction

from audit.rollups import rollup_triggers_create, rollup_triggers_drop
from audit.triggers import triggers_create, triggers_drop
from routing.drafts.snapshot_triggers import snapshot_triggers_create, snapshot_triggers_drop
from routing.version_triggers import version_triggers_create, version_triggers_drop


class Command(flush.Command):
    def handle(self, **options: Any) -> None:
        if not getattr(settings, "AUDIT_ALLOW_FLUSH", False):
            raise CommandError(
                "flush would erase the append-only audit log: refused. Only the test settings "
                "allow it (AUDIT_ALLOW_FLUSH); to start over, drop and recreate the database."
            )
        connection = connections[options["database"]]
        if connection.vendor not in ("postgresql", "sqlite"):
            super().handle(**options)
            return
        with transaction.atomic(using=connection.alias):
            # The published ruleset versions are frozen too (SQLite flushes with DELETE).
            triggers_drop(connection)
            version_triggers_drop(connection)
            snapshot_triggers_drop(connection)  # configuration versions are immutable too
            # SQLite deletes row by row: the rollups' triggers would count the deletions
            # after their own table was emptied.
            rollup_triggers_drop(connection)
            super().handle(**options)
            # post_migrate (sent by flush) may have put them back already: drop, then create.
            triggers_drop(connection)
            triggers_create(connection)
            version_triggers_create(connection)
            snapshot_triggers_create(connection)
            rollup_triggers_create(connection)
