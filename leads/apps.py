from django.apps import AppConfig


class LeadsConfig(AppConfig):
    name = "leads"
    verbose_name = "Leads"

    def ready(self) -> None:
        import config.checks  # noqa: F401  (registers the project's system checks)
