from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate


def audit_triggers_ensure(using: str = "default", **kwargs: Any) -> None:
    """Put the append-only triggers back after every migrate (SQLite drops a table's triggers
    when a migration rebuilds it)."""
    from django.db import connections, transaction

    from audit.triggers import TABLE, triggers_create, triggers_drop

    connection = connections[using]
    if TABLE not in connection.introspection.table_names():
        return
    with transaction.atomic(using=using):
        triggers_drop(connection)
        triggers_create(connection)


def rollup_triggers_lift(using: str = "default", **kwargs: Any) -> None:
    """pre_migrate on SQLite: drop the report rollups' triggers (one names ``leads_lead`` in
    its body, and SQLite refuses the rename that ends a migration rebuilding that table while
    it exists); ``rollup_triggers_ensure`` makes them again."""
    from django.db import connections

    from audit.rollups import rollup_triggers_drop

    connection = connections[using]
    if connection.vendor == "sqlite":
        rollup_triggers_drop(connection)


def rollup_triggers_ensure(using: str = "default", **kwargs: Any) -> None:
    """post_migrate: the report rollups' triggers back; on SQLite, whose migrations ran
    without them, the rollups recomputed from the rows too."""
    from django.db import connections, transaction

    from audit.rollups import DAY_TABLE, rollup_triggers_create, rollups_rebuild

    connection = connections[using]
    if DAY_TABLE not in connection.introspection.table_names():
        return  # migrations not applied yet (or only partly)
    with transaction.atomic(using=using):
        rollup_triggers_create(connection)
        if connection.vendor == "sqlite":
            rollups_rebuild(connection)


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from audit.permissions import groups_sync_after_migrate

        post_migrate.connect(groups_sync_after_migrate, sender=self)
        post_migrate.connect(audit_triggers_ensure, sender=self)
        pre_migrate.connect(rollup_triggers_lift, sender=self)
        post_migrate.connect(rollup_triggers_ensure, sender=self)
