from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def config_triggers_ensure(using: str = "default", **kwargs: Any) -> None:
    """Put the configuration-version triggers back after every migrate.

    SQLite alters most columns by rebuilding the table, which drops its triggers: a later
    migration touching a watched table would otherwise leave workers with a configuration
    cache that never refreshes.
    """
    from django.db import connections, transaction

    from routing.config_triggers import config_triggers_create, config_triggers_drop

    connection = connections[using]
    if "routing_configversion" not in connection.introspection.table_names():
        return  # migrations not applied yet (or only partly)
    with transaction.atomic(using=using):
        config_triggers_drop(connection)
        config_triggers_create(connection)


class RoutingConfig(AppConfig):
    name = "routing"
    verbose_name = "Routing"

    def ready(self) -> None:
        from routing.editor.permissions import revops_group_after_migrate

        post_migrate.connect(config_triggers_ensure, sender=self)
        post_migrate.connect(revops_group_after_migrate, sender=self)
