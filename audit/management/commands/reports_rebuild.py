"""``manage.py reports_rebuild``: recompute the report rollups from the raw rows.

The migration that creates them fills them, and triggers keep them from then on; this is for a
database whose triggers were lifted for a while (a bulk load with them off) or restored from
parts. It holds a SHARE lock on leads, assignments and events on PostgreSQL while it runs:
writers wait, readers do not.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand
from django.db import connections, transaction

from audit.rollups import rollups_rebuild


class Command(BaseCommand):
    help = "Recompute the report rollups (audit_reportslot, audit_assignmentday) from raw rows."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--database", default="default")

    def handle(self, **options: Any) -> None:
        connection = connections[options["database"]]
        started = time.perf_counter()
        with transaction.atomic(using=connection.alias):
            rollups_rebuild(connection)
        self.stdout.write(f"report rollups rebuilt in {time.perf_counter() - started:.1f} s")
