"""The database refuses UPDATE and DELETE of a configuration version (``routing_configsnapshot``).

PostgreSQL gets the triggers here; both databases get them again after every migrate
(``routing.apps``).
"""

from django.db import migrations


def create(apps, schema_editor):
    from routing.drafts.snapshot_triggers import snapshot_triggers_create

    snapshot_triggers_create(schema_editor.connection)


def drop(apps, schema_editor):
    from routing.drafts.snapshot_triggers import snapshot_triggers_drop

    snapshot_triggers_drop(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("routing", "0031_assignment_untouched_due_idx")]

    operations = [migrations.RunPython(create, drop)]
