"""Configuration versions (``routing_configsnapshot``) are immutable in the database.

The services only ever insert a snapshot; these triggers refuse every UPDATE and DELETE of one
(and TRUNCATE on PostgreSQL), whatever issues it (a queryset's ``update()``, raw SQL, the
admin), with an IntegrityError ("configuration versions are immutable …"), as
``audit.triggers`` does for the audit log. PostgreSQL gets them from the migration that added
them; on both databases they are made again after every migrate (``routing.apps``: SQLite
drops a table's triggers when a migration rebuilds it) and lifted for the length of
``manage.py flush``.
"""

from __future__ import annotations

from typing import Any

TABLE = "routing_configsnapshot"
MESSAGE = "configuration versions are immutable: UPDATE and DELETE are refused"

_PG_CREATE = [
    f"""
    CREATE OR REPLACE FUNCTION routing_configsnapshot_refuse_change() RETURNS trigger AS $$
    BEGIN
        RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'integrity_constraint_violation';
    END;
    $$ LANGUAGE plpgsql
    """,
    f"""
    CREATE TRIGGER routing_configsnapshot_frozen BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION routing_configsnapshot_refuse_change()
    """,
    f"""
    CREATE TRIGGER routing_configsnapshot_no_truncate BEFORE TRUNCATE ON {TABLE}
    FOR EACH STATEMENT EXECUTE FUNCTION routing_configsnapshot_refuse_change()
    """,
]
_PG_DROP = [
    f"DROP TRIGGER IF EXISTS routing_configsnapshot_frozen ON {TABLE}",
    f"DROP TRIGGER IF EXISTS routing_configsnapshot_no_truncate ON {TABLE}",
    "DROP FUNCTION IF EXISTS routing_configsnapshot_refuse_change()",
]
_SQLITE_CREATE = [
    f"""
    CREATE TRIGGER IF NOT EXISTS routing_configsnapshot_no_update BEFORE UPDATE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END
    """,
    f"""
    CREATE TRIGGER IF NOT EXISTS routing_configsnapshot_no_delete BEFORE DELETE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END
    """,
]
_SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS routing_configsnapshot_no_update",
    "DROP TRIGGER IF EXISTS routing_configsnapshot_no_delete",
]


def _statements(vendor: str, *, create: bool) -> list[str]:
    if vendor == "postgresql":
        return _PG_CREATE if create else _PG_DROP
    if vendor == "sqlite":
        return _SQLITE_CREATE if create else _SQLITE_DROP
    raise NotImplementedError(f"no configuration version triggers for the {vendor} database")


def snapshot_triggers_create(connection: Any) -> None:
    """Drop, then make the triggers (idempotent); nothing when the table is not there yet."""
    if TABLE not in connection.introspection.table_names():
        return
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=False):
            cursor.execute(sql)
        for sql in _statements(connection.vendor, create=True):
            cursor.execute(sql)


def snapshot_triggers_drop(connection: Any) -> None:
    if TABLE not in connection.introspection.table_names():
        return
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=False):
            cursor.execute(sql)
