"""The triggers that make the audit table append-only, for PostgreSQL and SQLite.

Used by the migration that creates them and by ``manage.py flush`` (which must empty the
table: it lifts them for the length of the flush, in its transaction, and puts them back).
"""

from __future__ import annotations

from typing import Any

TABLE = "audit_event"
MESSAGE = "audit events are append-only: UPDATE and DELETE are refused"

_POSTGRES_CREATE = [
    f"""
    CREATE OR REPLACE FUNCTION audit_event_refuse_change() RETURNS trigger AS $$
    BEGIN
        RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'insufficient_privilege';
    END;
    $$ LANGUAGE plpgsql
    """,
    f"""
    CREATE TRIGGER audit_event_no_update_delete BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION audit_event_refuse_change()
    """,
    f"""
    CREATE TRIGGER audit_event_no_truncate BEFORE TRUNCATE ON {TABLE}
    FOR EACH STATEMENT EXECUTE FUNCTION audit_event_refuse_change()
    """,
]
_POSTGRES_DROP = [
    f"DROP TRIGGER IF EXISTS audit_event_no_update_delete ON {TABLE}",
    f"DROP TRIGGER IF EXISTS audit_event_no_truncate ON {TABLE}",
    "DROP FUNCTION IF EXISTS audit_event_refuse_change()",
]
_SQLITE_CREATE = [
    f"""
    CREATE TRIGGER IF NOT EXISTS audit_event_no_update BEFORE UPDATE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END
    """,
    f"""
    CREATE TRIGGER IF NOT EXISTS audit_event_no_delete BEFORE DELETE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END
    """,
]
_SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS audit_event_no_update",
    "DROP TRIGGER IF EXISTS audit_event_no_delete",
]


def _statements(vendor: str, *, create: bool) -> list[str]:
    if vendor == "postgresql":
        return _POSTGRES_CREATE if create else _POSTGRES_DROP
    if vendor == "sqlite":
        return _SQLITE_CREATE if create else _SQLITE_DROP
    raise NotImplementedError(f"no append-only triggers for the {vendor} database")


def triggers_create(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=True):
            cursor.execute(sql)


def triggers_drop(connection: Any) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, create=False):
            cursor.execute(sql)
