"""The database refuses UPDATE and DELETE of a configuration version (``routing_configsnapshot``);
and a version may be a live change (``kind = "live"``: the admin, a CSV import, a ruleset publish).

PostgreSQL gets the triggers here; both databases get them again after every migrate
(``routing.apps``).
"""

from django.db import migrations, models


def create(apps, schema_editor):
    from routing.drafts.snapshot_triggers import snapshot_triggers_create

    snapshot_triggers_create(schema_editor.connection)


def drop(apps, schema_editor):
    from routing.drafts.snapshot_triggers import snapshot_triggers_drop

    snapshot_triggers_drop(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("routing", "0032_rep_state_history")]

    operations = [
        migrations.AlterField(
            model_name="configsnapshot",
            name="kind",
            field=models.CharField(
                choices=[
                    ("baseline", "Baseline (the configuration before the first draft)"),
                    ("draft", "Published draft"),
                    ("rollback", "Rollback"),
                    ("import", "routing_import"),
                    ("live", "Live change (admin, CSV import, ruleset publish)"),
                ],
                max_length=16,
            ),
        ),
        migrations.RunPython(create, drop),
    ]
