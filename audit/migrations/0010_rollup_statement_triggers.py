"""The report rollups' lead and event counters kept by statement-level triggers (PostgreSQL).

Migration 0009's row-level triggers upserted each row's counters in the order a statement
changed its rows: two statements (two batch claims, a claim and a batch's outcomes) took the
same counter rows in opposite orders and PostgreSQL cut one off as a deadlock. The new
triggers sum a statement's changes per counter row and upsert them in key order
(``audit.rollups``). SQLite (one writer at a time) keeps its row triggers.
"""

from django.db import migrations

from audit.rollups import rollup_row_triggers_create, rollup_triggers_create


def forward(apps, schema_editor):
    rollup_triggers_create(schema_editor.connection)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        rollup_row_triggers_create(schema_editor.connection)
    else:
        rollup_triggers_create(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("audit", "0009_report_rollups")]

    operations = [migrations.RunPython(forward, backward)]
