"""Each rep's load as counters (``RepLoad``), filled from the assignments as they stand."""

from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


import django.db.models.deletion
from django.db import migrations, models


def _midnight(now, zone_name):
    try:
        zone = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError):
        zone = ZoneInfo("UTC")
    return datetime.combine(now.astimezone(zone).date(), time(0), tzinfo=zone)


def fill(apps, schema_editor):
    """One row per rep, counted now (the same counts the decisions counted until now)."""
    from django.db.models import Count, Q
    from django.utils import timezone

    Rep = apps.get_model("routing", "Rep")
    Assignment = apps.get_model("routing", "Assignment")
    RepLoad = apps.get_model("routing", "RepLoad")
    now = timezone.now()
    open_by_rep = dict(
        Assignment.objects.filter(active=True, touched_at__isnull=True)
        .order_by()
        .values_list("rep_id")
        .annotate(n=Count("id"))
    )
    rows = []
    for rep_id, zone_name in Rep.objects.values_list("id", "timezone").iterator():
        day = _midnight(now, zone_name or "UTC")
        prev = _midnight(day - timedelta(seconds=1), zone_name or "UTC")
        counts = Assignment.objects.filter(rep_id=rep_id, assigned_at__gte=prev).aggregate(
            day=Count("id", filter=Q(assigned_at__gte=day)),
            prev=Count("id", filter=Q(assigned_at__lt=day)),
        )
        rows.append(
            RepLoad(
                rep_id=rep_id,
                open_count=open_by_rep.get(rep_id, 0),
                timezone=zone_name or "UTC",
                day_start=day,
                day_count=counts["day"],
                prev_start=prev,
                prev_count=counts["prev"],
                reconciled_at=now,
            )
        )
    RepLoad.objects.bulk_create(rows, batch_size=1000)


class Migration(migrations.Migration):

    dependencies = [
        ('routing', '0019_crm_last_error_permission'),
    ]

    operations = [
        migrations.CreateModel(
            name='RepLoad',
            fields=[
                ('rep', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='load', serialize=False, to='routing.rep')),
                ('open_count', models.PositiveIntegerField(default=0)),
                ('timezone', models.CharField(default='UTC', max_length=64)),
                ('day_start', models.DateTimeField(blank=True, null=True)),
                ('day_count', models.PositiveIntegerField(default=0)),
                ('prev_start', models.DateTimeField(blank=True, null=True)),
                ('prev_count', models.PositiveIntegerField(default=0)),
                ('drift_open', models.PositiveIntegerField(default=0)),
                ('drift_today', models.PositiveIntegerField(default=0)),
                ('reconciled_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.RunPython(fill, migrations.RunPython.noop, elidable=True),
    ]
