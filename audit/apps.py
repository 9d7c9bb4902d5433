from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from audit.permissions import groups_sync_after_migrate

        post_migrate.connect(groups_sync_after_migrate, sender=self)
