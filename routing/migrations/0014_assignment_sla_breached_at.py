"""``Assignment.sla_breached_at`` and the partial index the per-minute SLA check reads.

The check's query (active, untouched, due, no ``SlaBreach`` yet) had no index: every minute it
read every active untouched assignment and anti-joined the breaches. Now a handled breach is
stamped ``sla_breached_at`` (backfilled here from the ``SlaBreach`` rows) and leaves the partial
index ``assignment_sla_due_idx``, which holds only the current, untouched, unhandled
assignments with a due time, in due order.
"""

from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def backfill(apps, schema_editor):
    Assignment = apps.get_model("routing", "Assignment")
    SlaBreach = apps.get_model("routing", "SlaBreach")
    breached = SlaBreach.objects.filter(assignment_id=OuterRef("pk")).values("breached_at")[:1]
    Assignment.objects.filter(
        pk__in=SlaBreach.objects.values("assignment_id"), sla_breached_at__isnull=True
    ).update(sla_breached_at=Subquery(breached))


class Migration(migrations.Migration):
    dependencies = [
        ("routing", "0013_alert_kind_audit"),
    ]

    operations = [
        migrations.AddField(
            model_name="assignment",
            name="sla_breached_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When its missed SLA was handled (the SlaBreach recorded): it leaves "
                "the set the per-minute SLA check reads.",
                null=True,
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
        migrations.AddIndex(
            model_name="assignment",
            index=models.Index(
                condition=models.Q(
                    ("active", True),
                    ("sla_breached_at__isnull", True),
                    ("sla_due_at__isnull", False),
                    ("touched_at__isnull", True),
                ),
                fields=["sla_due_at", "id"],
                name="assignment_sla_due_idx",
            ),
        ),
    ]
