"""An index on ``assigned_at`` alone, for the dashboard's windows over every rep's assignments.

On PostgreSQL built ``CONCURRENTLY`` (so ``atomic = False``): a plain CREATE INDEX would block
every assignment for as long as it takes on a large table.
"""

from django.db import migrations, models

from leads.migration_operations import AddIndexConcurrentlyOnPostgres

INDEX = models.Index(fields=("assigned_at",), name="assignment_assigned_at_idx")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("routing", "0023_time_off")]

    operations = [AddIndexConcurrentlyOnPostgres(model_name="assignment", index=INDEX)]
