"""Trigram indexes for the history page's free-text search (PostgreSQL only).

The search (``audit.selectors.HistoryFilter.search``) is ``icontains`` on e-mail, company, first
and last name, which Django writes as ``UPPER("col"::text) LIKE UPPER('%…%')``: a sequential scan
of every lead without an index (about 1 s on a million). A GIN index with ``gin_trgm_ops`` on
exactly that expression serves a ``LIKE '%…%'``; one per column, and the four conditions of the
search combine as a BitmapOr of the four.

Built ``CONCURRENTLY`` (so ``atomic = False``): a plain CREATE INDEX holds a lock that blocks
every INSERT and UPDATE of leads for as long as the build takes (tens of seconds per index on a
million leads), which would stall intake and routing during the deploy. A concurrent build that
fails leaves an INVALID index behind; running the migration again drops and rebuilds it.

The indexes are not in the model's Meta (SQLite has neither GIN nor pg_trgm), so Django's
migration state does not know them; on SQLite this migration does nothing.
"""

from django.db import migrations

TABLE = "leads_lead"
COLUMNS = ("email", "company", "first_name", "last_name")


def index_name(column: str) -> str:
    return f"lead_{column}_trgm_idx"


def create(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        for column in COLUMNS:
            name = index_name(column)
            cursor.execute(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname = %s",
                [name],
            )
            row = cursor.fetchone()
            if row is not None and not row[0]:  # left INVALID by a failed concurrent build
                cursor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
            cursor.execute(
                f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{name}" ON "{TABLE}" '
                f'USING gin ((UPPER("{column}"::text)) gin_trgm_ops)'
            )


def drop(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for column in COLUMNS:
            cursor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{index_name(column)}"')
    # The extension stays: other objects may use it, and it costs nothing unused.


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("leads", "0005_lead_deferrals")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
