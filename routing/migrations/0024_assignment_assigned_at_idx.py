"""An index on ``assigned_at`` alone, for the dashboard's windows over every rep's assignments.

On PostgreSQL built ``CONCURRENTLY`` (so ``atomic = False``): a plain CREATE INDEX would block
every assignment for as long as it takes on a large table.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

INDEX = models.Index(fields=("assigned_at",), name="assignment_assigned_at_idx")


class AddIndexConcurrentlyOnPostgres(AddIndexConcurrently):
    """CONCURRENTLY on PostgreSQL, a plain CREATE INDEX elsewhere (SQLite)."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: StateApps,
        to_state: StateApps,
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_forwards(
                self, app_label, schema_editor, from_state, to_state
            )

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: StateApps,
        to_state: StateApps,
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_backwards(
                self, app_label, schema_editor, from_state, to_state
            )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("routing", "0023_time_off")]

    operations = [AddIndexConcurrentlyOnPostgres(model_name="assignment", index=INDEX)]
