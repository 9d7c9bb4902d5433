"""The app's database role (PostgreSQL): ordinary work, but the audit log only read and appended.

Each test creates its own role, named uniquely per run (roles are cluster-wide and CI may run
several suites against one server), and drops it afterwards.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO
from typing import cast

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection

from audit.models import Event

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.reliability,
    pytest.mark.django_db(transaction=True),
]


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


@pytest.fixture
def app_role() -> Iterator[tuple[str, str]]:
    role = f"lr_test_app_{uuid.uuid4().hex[:12]}"
    password = secrets.token_urlsafe(18)
    yield role, password
    connection.close()  # the test may have left the default connection logged in as the role
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        if cursor.fetchone():
            # Its privileges and default privileges in this database, then the role itself.
            cursor.execute(f"DROP OWNED BY {_q(role)}")
            cursor.execute(f"DROP ROLE {_q(role)}")


def _grant(role: str, password: str | None, monkeypatch: pytest.MonkeyPatch) -> str:
    out = StringIO()
    if password is None:
        call_command("db_grant_app_role", role=role, stdout=out)
    else:
        monkeypatch.setenv("TEST_APP_ROLE_PASSWORD", password)
        call_command(
            "db_grant_app_role", role=role, password_env="TEST_APP_ROLE_PASSWORD", stdout=out
        )
    return out.getvalue()


@contextmanager
def _connect_as(role: str, password: str) -> Iterator[psycopg.Connection]:
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        dbname=settings["NAME"],
        user=role,
        password=password,
        autocommit=True,
    ) as conn:
        yield conn


def _refused(conn: psycopg.Connection, sql: str) -> str:
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as error:
        conn.execute(sql)
    return str(error.value)


def test_the_app_role_appends_to_the_audit_log_and_cannot_change_it(app_role, monkeypatch):
    role, password = app_role
    output = _grant(role, password, monkeypatch)
    assert f"created role {role}" in output
    assert password not in output
    with _connect_as(role, password) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (role,)
        conn.execute(
            "INSERT INTO audit_event (chain, seq, type, at, actor, rep_name, team_name, rule_name,"
            " data, trace, prev_hash, hash) VALUES ('role-test', 1, 'rules_published', now(),"
            " 'test', '', '', '', '{}', '[]', '', 'x')"
        )
        assert conn.execute("SELECT count(*) FROM audit_event").fetchone() == (1,)
        # Refused by the privileges themselves, before any trigger could be asked.
        for sql in (
            "UPDATE audit_event SET actor = 'mallory'",
            "DELETE FROM audit_event",
            "TRUNCATE audit_event",
        ):
            assert "permission denied" in _refused(conn, sql)
        for sql in (
            "ALTER TABLE audit_event DISABLE TRIGGER ALL",
            "ALTER TABLE audit_event DISABLE TRIGGER audit_event_no_update_delete",
            "DROP TRIGGER audit_event_no_update_delete ON audit_event",
            "DROP TABLE audit_event",
        ):
            assert "must be owner" in _refused(conn, sql)
        # The other way to skip triggers needs a superuser.
        _refused(conn, "SET session_replication_role = replica")
        attributes = conn.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles "
            "WHERE rolname = current_user"
        ).fetchone()
        assert attributes == (False, False, False, False)
        owner = conn.execute(
            "SELECT tableowner FROM pg_tables WHERE tablename = %s", ["audit_event"]
        )
        assert owner.fetchone() != (role,)
    assert Event.objects.filter(chain="role-test").values_list("actor", flat=True).get() == "test"


@contextmanager
def _django_as(role: str, password: str) -> Iterator[None]:
    """The default connection logged in as ``role``: the services run as web and worker do."""
    settings = connection.settings_dict
    saved = settings["USER"], settings["PASSWORD"]
    connection.close()
    settings["USER"], settings["PASSWORD"] = role, password
    try:
        yield
    finally:
        connection.close()
        settings["USER"], settings["PASSWORD"] = saved


def test_the_app_role_does_the_apps_work(app_role, monkeypatch):
    from routing.models import Rep
    from routing.services import assignment_touch, lead_reassign
    from tests.audit.test_pages import routed
    from tests.routing.factories import RepFactory

    role, password = app_role
    _grant(role, password, monkeypatch)
    with _django_as(role, password):
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            assert cursor.fetchone() == (role,)
        lead = routed("ana@acme.com")  # ingest and route: leads, assignments, events, locks
        rep = cast(Rep, RepFactory())
        lead_reassign(lead_id=lead.pk, rep_email=rep.email, reason="by hand", actor="user:mia")
        assignment_touch(lead_id=lead.pk, actor="user:mia")
        types = list(Event.objects.filter(lead=lead).order_by("seq").values_list("type", flat=True))
        assert types[-2:] == ["reassigned", "touched"]
        out = StringIO()
        call_command("audit_verify", stdout=out)
        assert "audit log intact" in out.getvalue()
        with pytest.raises(DatabaseError, match="permission denied"):
            Event.objects.filter(lead=lead).update(actor="mallory")
        with pytest.raises(DatabaseError, match="permission denied"):
            Event.objects.filter(lead=lead).delete()
    assert set(Event.objects.filter(lead=lead).values_list("actor", flat=True)) != {"mallory"}


def test_grants_are_idempotent_and_cover_tables_created_later(app_role, monkeypatch):
    role, password = app_role
    _grant(role, password, monkeypatch)
    again = _grant(role, None, monkeypatch)  # after the next migrate: no password needed
    assert "created role" not in again
    future = f"lr_test_future_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:  # a later migration, run by the owner
        cursor.execute(
            f"CREATE TABLE {future} (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, x int)"
        )
    try:
        with _connect_as(role, password) as conn:
            conn.execute(f"INSERT INTO {future} (x) VALUES (1)")  # noqa: S608 (a name the test made)
            conn.execute(f"UPDATE {future} SET x = 2")  # noqa: S608 (a name the test made)
            row = conn.execute(f"SELECT x FROM {future}").fetchone()  # noqa: S608
            assert row == (2,)
            conn.execute(f"DELETE FROM {future}")  # noqa: S608 (a name the test made)
            _refused(conn, "UPDATE audit_event SET actor = 'mallory'")
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE {future}")


def test_a_superuser_role_is_demoted_and_the_owner_is_refused(app_role, monkeypatch):
    role, password = app_role
    with pytest.raises(CommandError, match="does not exist"):
        _grant(role, None, monkeypatch)
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {_q(role)} LOGIN SUPERUSER")
    output = _grant(role, password, monkeypatch)
    assert "took superuser" in output
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [role])
        assert cursor.fetchone() == (False,)
        cursor.execute("SELECT current_user")
        owner = cursor.fetchone()[0]
    with pytest.raises(CommandError, match="must not be the owner"):
        _grant(owner, None, monkeypatch)
