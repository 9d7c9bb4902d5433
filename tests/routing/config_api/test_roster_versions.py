"""The roster API and configuration versions (issue 19): a rep's design changed by an HR or CRM
sync (caps, hours, name; a new rep) is the next numbered configuration version, audited like a
publish and undone by a rollback, and it takes the decide lock (PostgreSQL) so no lead is
decided half on the old design and half on the new; a change of live state only (active, out
of office) is no version but is recorded as a RepStateChange."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from audit.models import Event, EventType
from routing.config_api.roster import rep_update
from routing.decisions import DECIDE_LOCK
from routing.drafts.models import ConfigSnapshot, ConfigSnapshotKind
from routing.drafts.services import config_rollback
from routing.models import Rep
from routing.timeoff.models import RepStateChange
from tests.routing.config_api.test_roster_api import BASE, _call, _token, rules  # noqa: F401

pytestmark = pytest.mark.django_db

WAITED = 1.0


def _kinds() -> list[str]:
    return [snapshot.kind for snapshot in ConfigSnapshot.objects.order_by("number")]


def test_a_cap_changed_by_the_roster_is_a_version_that_rollback_undoes(client, rules):  # noqa: F811
    secret = _token("roster")
    response = _call(client, "patch", f"{BASE}ana@example.com/", secret, {"max_open": 3})
    assert response.status_code == 200, response.json()
    assert _kinds() == [ConfigSnapshotKind.BASELINE, ConfigSnapshotKind.LIVE]
    version = ConfigSnapshot.objects.get(number=2)
    assert version.published_by == "token:hr-sync"
    assert "roster API" in version.note
    (published,) = [
        event
        for event in Event.objects.filter(type=EventType.CONFIG_CHANGED, actor="token:hr-sync")
        if event.data.get("action") == "published"
    ]
    assert any("ana@example.com" in row for row in published.data["rows"])
    config_rollback(number=1, actor="user:rita")
    assert Rep.objects.get(email="ana@example.com").max_open is None


def test_a_new_rep_and_new_hours_are_versions_too(client, rules):  # noqa: F811
    secret = _token("roster")
    created = _call(client, "post", BASE, secret, {"email": "cai@example.com", "name": "Cai"})
    assert created.status_code == 201, created.json()
    hours = {"days": [1, 2, 3, 4], "start": "08:00", "end": "16:00"}
    changed = _call(client, "put", f"{BASE}cai@example.com/", secret, {"working_hours": hours})
    assert changed.status_code == 200, changed.json()
    assert _kinds() == [ConfigSnapshotKind.BASELINE] + [ConfigSnapshotKind.LIVE] * 2
    # The same values again change nothing: no version.
    again = _call(client, "put", f"{BASE}cai@example.com/", secret, {"working_hours": hours})
    assert again.status_code == 200
    assert len(_kinds()) == 3


def test_live_state_is_recorded_but_no_version(client, rules):  # noqa: F811
    secret = _token("roster")
    ana = Rep.objects.get(email="ana@example.com")
    before = RepStateChange.objects.filter(rep_id=ana.pk).count()
    response = _call(client, "patch", f"{BASE}ana@example.com/", secret, {"active": False})
    assert response.status_code == 200, response.json()
    assert _kinds() == []  # no version (not even a baseline)
    assert RepStateChange.objects.filter(rep_id=ana.pk).count() == before + 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_design_change_waits_for_the_leads_being_decided_and_live_state_does_not(
    rules,  # noqa: F811
) -> None:
    """A lead being decided holds the decide lock shared (its claim): a cap changed by the
    roster waits for it, like a publish's swap; a deactivation (live state) does not."""
    ana = Rep.objects.get(email="ana@example.com")
    done: dict[str, bool] = {}
    failed: list[BaseException] = []

    def change(name: str, values: dict[str, object]) -> threading.Thread:
        def work() -> None:
            try:
                rep_update(rep_id=ana.pk, values=values, actor="token:hr")
                done[name] = True
            except BaseException as exc:
                failed.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=work)
        thread.start()
        return thread

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(  # a lead being decided
            "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))", [DECIDE_LOCK]
        )
        live = change("live", {"active": False})
        live.join(30)
        assert done == {"live": True}, failed  # live state: no decide lock
        design = change("design", {"max_open": 4})
        time.sleep(WAITED)
        assert "design" not in done  # waiting for the lead
        assert not failed, failed
        assert Rep.objects.get(pk=ana.pk).max_open is None
    design.join(30)
    assert not failed, failed
    assert done == {"live": True, "design": True}
    assert Rep.objects.get(pk=ana.pk).max_open == 4
    assert ConfigSnapshot.objects.order_by("-number").first().kind == ConfigSnapshotKind.LIVE
