"""Configuration versions are immutable in the database itself: whatever issues the UPDATE or
DELETE (a queryset, raw SQL), a trigger refuses it, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from routing.drafts.models import ConfigSnapshot, ConfigSnapshotKind
from routing.drafts.snapshots import config_snapshot_record

pytestmark = pytest.mark.django_db


def _snapshot() -> ConfigSnapshot:
    return config_snapshot_record(
        kind=ConfigSnapshotKind.DRAFT,
        document={"ruleset": {"name": "R", "rules": []}},
        ruleset_version=1,
        actor="t",
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda s: ConfigSnapshot.objects.filter(pk=s.pk).update(note="rewritten"),
        lambda s: ConfigSnapshot.objects.filter(pk=s.pk).update(document={}),
        lambda s: ConfigSnapshot.objects.filter(pk=s.pk).delete(),
        lambda s: s.delete(),
    ],
    ids=["note", "document", "queryset-delete", "delete"],
)
def test_a_stored_version_can_be_neither_changed_nor_deleted(change) -> None:
    snapshot = _snapshot()
    with pytest.raises(DatabaseError, match="immutable"), transaction.atomic():
        change(snapshot)
    stored = ConfigSnapshot.objects.get(pk=snapshot.pk)
    assert stored.note == ""
    assert stored.document == {"ruleset": {"name": "R", "rules": []}}


def test_raw_sql_is_refused_too() -> None:
    snapshot = _snapshot()
    for sql in (
        "UPDATE routing_configsnapshot SET number = 99 WHERE id = %s",
        "DELETE FROM routing_configsnapshot WHERE id = %s",
    ):
        with (
            pytest.raises(DatabaseError, match="immutable"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql, [snapshot.pk])
    assert ConfigSnapshot.objects.get(pk=snapshot.pk).number == snapshot.number


def test_new_versions_are_still_recorded() -> None:
    first = _snapshot()
    second = _snapshot()
    assert (first.number, second.number) == (1, 2)


@pytest.mark.postgres
def test_truncate_is_refused_on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("TRUNCATE is PostgreSQL's")
    _snapshot()
    with (
        pytest.raises(DatabaseError, match="immutable"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("TRUNCATE routing_configsnapshot CASCADE")
    assert ConfigSnapshot.objects.count() == 1
