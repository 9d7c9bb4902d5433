"""The configuration commands' exit status when the configuration is busy (another import or
publish, or a replay, holds its lock): 3, "try again", distinct from 1, "the file is wrong", so
that a CI job can retry the one and fail on the other (PostgreSQL: SQLite has no such lock)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from routing.configuration import BUSY_EXIT_STATUS, configuration_import
from tests.routing.test_configuration import document, text

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@contextmanager
def lock_held() -> Iterator[None]:
    """The configuration lock held by another session, as an import in flight holds it."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    import psycopg

    settings_dict = connection.settings_dict
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with (
            psycopg.connect(
                host=settings_dict["HOST"] or "127.0.0.1",
                port=settings_dict["PORT"] or 5432,
                user=settings_dict["USER"],
                password=settings_dict["PASSWORD"] or None,
                dbname=settings_dict["NAME"],
            ) as other,
            other.transaction(),
        ):
            other.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ["routing:publish"]
            )
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        yield
    finally:
        release.set()
        holder.join(10)


def test_a_busy_configuration_exits_3_and_a_wrong_file_1(tmp_path: Path) -> None:
    """The bug: routing_check exited 1 when the lock was held, as for a wrong file."""
    assert BUSY_EXIT_STATUS == 3
    good = tmp_path / "routing.json"
    good.write_text(text(document()))
    bad_document = document()
    bad_document["teams"][0]["strategy"] = "random"
    bad = tmp_path / "bad.json"
    bad.write_text(text(bad_document))
    with lock_held():
        for args in (["routing_check", str(good)], ["routing_import", str(good), "--publish"]):
            with pytest.raises(CommandError, match=r"(?i)try again") as caught:
                call_command(*args)
            assert caught.value.returncode == 3, args
        # routing_check validates first: a wrong file is 1 even while busy.
        with pytest.raises(CommandError, match="1 error in") as wrong:
            call_command("routing_check", str(bad))
        assert wrong.value.returncode == 1
    with pytest.raises(CommandError, match="1 error in") as wrong:
        call_command("routing_import", str(bad), "--publish")
    assert wrong.value.returncode == 1


def test_a_busy_import_into_a_draft_exits_3(tmp_path: Path) -> None:
    configuration_import(data=document(), publish=True)
    changed = document()
    changed["teams"][0]["sla_minutes"] = 5
    path = tmp_path / "routing.json"
    path.write_text(text(changed))
    with lock_held(), pytest.raises(CommandError, match=r"(?i)try again") as caught:
        call_command("routing_import", str(path))
    assert caught.value.returncode == 3
