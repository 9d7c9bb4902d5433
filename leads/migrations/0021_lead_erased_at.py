"""Lead.erased_at: when the lead's person was erased, backfilled for leads erased before.

A lead erased before this column existed is told by its fields (first name "erased person", no
e-mail and no phone, as ``person_erase`` left it); its time is that of its ``erased`` audit
event, else the migration's. A lead whose personal data retention pruned (it looks the same)
was not erased at anyone's request: it keeps ``personal_pruned_at`` and no ``erased_at``, unless
it has an ``erased`` event too.
"""

from django.db import migrations, models
from django.db.models import Max, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

ERASED = "erased person"  # leads.privacy.ERASED, frozen here as the migration saw it


def backfill(apps, schema_editor):
    Lead = apps.get_model("leads", "Lead")
    Event = apps.get_model("audit", "Event")
    erased_event = (
        Event.objects.filter(lead_id=OuterRef("pk"), type="erased")
        .values("lead_id")
        .annotate(at=Max("at"))
        .values("at")[:1]
    )
    looks_erased = Lead.objects.filter(first_name=ERASED, email="", phone="", erased_at=None)
    has_event = Event.objects.filter(type="erased").values("lead_id")
    looks_erased.filter(Q(pk__in=has_event) | Q(personal_pruned_at=None)).update(
        erased_at=Coalesce(Subquery(erased_event), timezone.now())
    )


class Migration(migrations.Migration):
    dependencies = [
        ("leads", "0020_personkey_wrapped_by"),
        ("audit", "0008_alter_event_type"),
    ]

    operations = [
        migrations.AddField(
            model_name="lead",
            name="erased_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
