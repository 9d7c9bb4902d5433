from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate


def config_triggers_ensure(using: str = "default", **kwargs: Any) -> None:
    """Put the configuration-version triggers back after every migrate.

    SQLite alters most columns by rebuilding the table, which drops its triggers: a later
    migration touching a watched table would otherwise leave workers with a configuration
    cache that never refreshes.
    """
    from django.db import connections, transaction

    from routing.config_triggers import config_triggers_create, config_triggers_drop
    from routing.drafts.snapshot_triggers import snapshot_triggers_create
    from routing.version_triggers import version_triggers_create

    connection = connections[using]
    if "routing_configversion" not in connection.introspection.table_names():
        return  # migrations not applied yet (or only partly)
    with transaction.atomic(using=using):
        config_triggers_drop(connection)
        config_triggers_create(connection)
        version_triggers_create(connection)
        snapshot_triggers_create(connection)


def version_triggers_lift(using: str = "default", **kwargs: Any) -> None:
    """pre_migrate on SQLite: drop the triggers that freeze published versions.

    A trigger of ``routing_rule`` names ``routing_ruleset`` in its body, and SQLite refuses the
    rename that ends a migration rebuilding ``routing_ruleset`` while it exists. post_migrate
    (``config_triggers_ensure``) makes them again.
    """
    from django.db import connections

    from routing.version_triggers import version_triggers_drop

    connection = connections[using]
    if connection.vendor == "sqlite":
        version_triggers_drop(connection)


class RoutingConfig(AppConfig):
    name = "routing"
    verbose_name = "Routing"

    def ready(self) -> None:
        from django.core import checks

        from routing.editor.permissions import revops_group_after_migrate

        pre_migrate.connect(version_triggers_lift, sender=self)
        post_migrate.connect(config_triggers_ensure, sender=self)
        post_migrate.connect(revops_group_after_migrate, sender=self)
        checks.register(metrics_settle_check)


def metrics_settle_check(app_configs: Any, **kwargs: Any) -> list[Any]:
    """METRICS_SETTLE_SECONDS must outlast the longest transaction that writes counted rows."""
    from django.conf import settings
    from django.core.checks import Warning as CheckWarning

    from routing.monitoring.counters import settle_covers_transactions

    ok, longest = settle_covers_transactions()
    if ok:
        return []
    return [
        CheckWarning(
            f"METRICS_SETTLE_SECONDS ({settings.METRICS_SETTLE_SECONDS:g}) is not above "
            f"the longest transaction ({longest:.0f} s: CELERY_TASK_TIME_LIMIT, "
            "GUNICORN_TIMEOUT): /metrics counters may miss rows committed late.",
            hint="Raise METRICS_SETTLE_SECONDS above both (default 300).",
            id="routing.W001",
        )
    ]
