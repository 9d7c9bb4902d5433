"""The database refuses changes to published and archived ruleset versions and their rules.

PostgreSQL gets the triggers here. On SQLite they are made after every migrate instead
(``routing.apps``), since a later migration rebuilding ``routing_ruleset`` would fail on them.
"""

from django.db import migrations


def create(apps, schema_editor):
    from routing.version_triggers import version_triggers_create

    if schema_editor.connection.vendor == "postgresql":
        version_triggers_create(schema_editor.connection)


def drop(apps, schema_editor):
    from routing.version_triggers import version_triggers_drop

    version_triggers_drop(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("routing", "0014_assignment_sla_breached_at")]

    operations = [migrations.RunPython(create, drop)]
