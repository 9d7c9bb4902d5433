"""The database refuses UPDATE and DELETE on audit events (and TRUNCATE on PostgreSQL)."""

from django.db import migrations

from audit.triggers import triggers_create, triggers_drop


def create(apps, schema_editor):
    triggers_create(schema_editor.connection)


def drop(apps, schema_editor):
    triggers_drop(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_event")]

    operations = [migrations.RunPython(create, drop)]
