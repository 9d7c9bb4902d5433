"""``Lead.queued_at``: when the lead last entered the routing queue (intake or a re-route).

The backlog age, ``leadrouter_backlog_oldest_seconds`` and the stale sweeper measured a waiting
lead's wait from ``received_at``, so an unassigned lead received hours ago and retried now looked
hours late. Existing leads get ``received_at``, or for a lead waiting now after a re-route the
time of its latest ``reroute_requested`` event. The partial index over waiting leads moves from
``received_at`` to ``queued_at`` (the oldest-waiting query and the sweeper read it).
"""

import django.utils.timezone
from django.db import migrations, models
from django.db.models import F, OuterRef, Subquery
from django.db.models.functions import Coalesce

HELP = (
    "When it last entered the routing queue: at intake, and again each time it is sent through "
    "routing anew (a retry of an unassigned lead, a re-route). How long a waiting lead has "
    "waited is measured from here, not from received_at."
)


def backfill(apps, schema_editor):
    Lead = apps.get_model("leads", "Lead")
    Event = apps.get_model("audit", "Event")
    Lead.objects.update(queued_at=F("received_at"))
    rerouted = (
        Event.objects.filter(lead=OuterRef("pk"), type="reroute_requested")
        .order_by("-at")
        .values("at")[:1]
    )
    Lead.objects.filter(status__in=("received", "processing")).update(
        queued_at=Coalesce(Subquery(rerouted), F("received_at"))
    )


class Migration(migrations.Migration):
    dependencies = [
        ("leads", "0006_lead_search_trigram"),
        ("audit", "0003_event_type_config_imported"),
    ]

    operations = [
        migrations.AddField(
            model_name="lead",
            name="queued_at",
            field=models.DateTimeField(null=True, help_text=HELP),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
        migrations.AlterField(
            model_name="lead",
            name="queued_at",
            field=models.DateTimeField(default=django.utils.timezone.now, help_text=HELP),
        ),
        migrations.RemoveIndex(model_name="lead", name="lead_waiting_idx"),
        migrations.AddIndex(
            model_name="lead",
            index=models.Index(
                condition=models.Q(("status", "received")),
                fields=["queued_at"],
                name="lead_queued_idx",
            ),
        ),
    ]
