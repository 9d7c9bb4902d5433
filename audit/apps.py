from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


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


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from audit.permissions import groups_sync_after_migrate

        post_migrate.connect(groups_sync_after_migrate, sender=self)
        post_migrate.connect(audit_triggers_ensure, sender=self)
