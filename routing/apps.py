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
        from django.core import checks

        post_migrate.connect(config_triggers_ensure, sender=self)
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
