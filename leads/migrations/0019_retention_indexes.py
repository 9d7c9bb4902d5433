"""The retention job's partial indexes: per source, the oldest leads not pruned yet.

On PostgreSQL built ``CONCURRENTLY`` (so ``atomic = False``): a plain CREATE INDEX would block
intake for as long as it takes on a large lead table.
"""

from django.db import migrations, models
from django.db.models import Q

from leads.migration_operations import AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("leads", "0018_retention")]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="lead",
            index=models.Index(
                fields=("source", "received_at"),
                condition=Q(raw_pruned_at__isnull=True),
                name="lead_raw_retained_idx",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="lead",
            index=models.Index(
                fields=("source", "received_at"),
                condition=Q(personal_pruned_at__isnull=True),
                name="lead_personal_retained_idx",
            ),
        ),
    ]
