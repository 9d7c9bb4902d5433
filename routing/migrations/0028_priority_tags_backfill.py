"""Priority and tags for leads routed before they were columns (routing/priority_backfill.py)."""

from typing import Any

from django.db import migrations

from routing.priority_backfill import priority_tags_backfill


def forward(apps: Any, schema_editor: Any) -> None:
    priority_tags_backfill(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0008_alter_event_type"),
        ("leads", "0020_personkey_wrapped_by"),
        ("routing", "0027_touch_link_use"),
    ]

    operations = [migrations.RunPython(forward, migrations.RunPython.noop, elidable=True)]
