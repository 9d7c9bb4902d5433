"""The database role the application runs as, and what it may do (PostgreSQL).

The tables belong to the role that runs the migrations. An owner (or a superuser) can disable
the audit triggers, so web, worker and beat connect as another role: ordinary DML on every
table of the application, but on the append-only tables only SELECT and INSERT. Not an owner
and not a superuser, it can neither ALTER TABLE ... DISABLE TRIGGER nor TRUNCATE, UPDATE or
DELETE audit rows, whatever the triggers say. ``manage.py db_grant_app_role`` applies this
after every ``migrate`` (and sets default privileges, so tables and sequences created by later
migrations are covered before it runs again).
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from audit.triggers import TABLE as AUDIT_TABLE

# Tables the application may only read and append to.
APPEND_ONLY_TABLES = (AUDIT_TABLE,)

TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
APPEND_ONLY_PRIVILEGES = "SELECT, INSERT"
SEQUENCE_PRIVILEGES = "USAGE, SELECT"


class RoleError(Exception):
    """The app role cannot be set up safely (it would be the owner, a superuser, ...)."""


def _fetch(cursor: Any, sql: str, params: list[Any] | None = None) -> Any:
    cursor.execute(sql, params or [])
    return cursor.fetchone()


@transaction.atomic
def app_role_grant(*, role: str, password: str | None = None) -> list[str]:
    """Create ``role`` if needed (with ``password``) and give it exactly the app's privileges.

    Idempotent; run as the owner of the tables (the migration role). Returns what it did, one
    line each, without the password.
    """
    if connection.vendor != "postgresql":
        raise RoleError(f"database roles need PostgreSQL (this is {connection.vendor})")
    q = connection.ops.quote_name
    done: list[str] = []
    with connection.cursor() as cursor:
        owner, database, schema = _fetch(
            cursor, "SELECT current_user, current_database(), current_schema()"
        )
        if role == owner:
            raise RoleError(f"the app role must not be the owner role {owner!r}")
        row = _fetch(
            cursor,
            "SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls "
            "FROM pg_roles WHERE rolname = %s",
            [role],
        )
        if row is None:
            if not password:
                raise RoleError(f"role {role!r} does not exist: give a password to create it")
            # Client-side binding (Django's default for psycopg 3) quotes the password literal.
            cursor.execute(f"CREATE ROLE {q(role)} LOGIN PASSWORD %s", [password])
            done.append(f"created role {role}")
        else:
            if password:
                cursor.execute(f"ALTER ROLE {q(role)} WITH LOGIN PASSWORD %s", [password])
                done.append(f"set the password of {role}")
            if row[0]:
                cursor.execute(
                    f"ALTER ROLE {q(role)} NOSUPERUSER NOCREATEROLE NOCREATEDB NOBYPASSRLS"
                )
                done.append(f"took superuser, createrole, createdb and bypassrls from {role}")
        if _fetch(cursor, "SELECT pg_has_role(%s, %s, 'MEMBER')", [role, owner])[0]:
            raise RoleError(f"{role!r} is a member of the owner role {owner!r}: revoke that first")
        owned = _fetch(
            cursor,
            "SELECT string_agg(tablename, ', ' ORDER BY tablename) FROM pg_tables "
            "WHERE schemaname = %s AND tableowner = %s",
            [schema, role],
        )[0]
        if owned:
            raise RoleError(
                f"{role!r} owns tables ({owned}): REASSIGN OWNED BY {role} TO {owner} first"
            )
        statements = [
            f"GRANT CONNECT, TEMPORARY ON DATABASE {q(database)} TO {q(role)}",
            f"GRANT USAGE ON SCHEMA {q(schema)} TO {q(role)}",
            f"GRANT {TABLE_PRIVILEGES} ON ALL TABLES IN SCHEMA {q(schema)} TO {q(role)}",
            f"GRANT {SEQUENCE_PRIVILEGES} ON ALL SEQUENCES IN SCHEMA {q(schema)} TO {q(role)}",
            f"ALTER DEFAULT PRIVILEGES FOR ROLE {q(owner)} IN SCHEMA {q(schema)} "
            f"GRANT {TABLE_PRIVILEGES} ON TABLES TO {q(role)}",
            f"ALTER DEFAULT PRIVILEGES FOR ROLE {q(owner)} IN SCHEMA {q(schema)} "
            f"GRANT {SEQUENCE_PRIVILEGES} ON SEQUENCES TO {q(role)}",
        ]
        tables = set(connection.introspection.table_names(cursor))
        for table in APPEND_ONLY_TABLES:
            if table not in tables:
                continue
            statements += [
                f"REVOKE ALL ON {q(table)} FROM {q(role)}",
                f"REVOKE ALL ON {q(table)} FROM PUBLIC",
                f"GRANT {APPEND_ONLY_PRIVILEGES} ON {q(table)} TO {q(role)}",
            ]
        for statement in statements:
            cursor.execute(statement)
            done.append(statement)
    return done
