"""Two syncs changing one rep at once (PostgreSQL, real transactions): the row lock applies them
one after the other, neither change is lost, and the deactivation's re-route happens."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from routing.config_api.roster import rep_update
from routing.decisions import clear_live_config_cache
from routing.models import Assignment, Rep
from routing.rules_io import rules_import
from tests.routing.test_lead_actions import _assigned
from tests.routing.test_pipeline import RULES

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_syncs_on_one_rep_lose_no_change_and_no_reroute() -> None:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    leads = [_assigned(f"p{i}@acme.com") for i in range(2)]  # ana, ben
    ana = Rep.objects.get(email="ana@example.com")
    first_wrote = threading.Event()
    failures: list[BaseException] = []

    def deactivate() -> None:
        try:
            with transaction.atomic():
                rep_update(rep_id=ana.pk, values={"active": False}, actor="token:hr")
                first_wrote.set()
                time.sleep(1.0)  # uncommitted: the other sync waits on the row meanwhile
        except BaseException as exc:
            failures.append(exc)
            first_wrote.set()
        finally:
            connection.close()

    def set_cap() -> None:
        try:
            assert first_wrote.wait(20)
            rep_update(rep_id=ana.pk, values={"max_open": 7}, actor="token:crm")
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=deactivate), threading.Thread(target=set_cap)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not failures, failures
    ana.refresh_from_db()
    assert (ana.active, ana.max_open) == (False, 7)  # both changes, neither overwritten
    assert Assignment.objects.get(lead=leads[0], active=True).rep.email == "ben@example.com"
    clear_live_config_cache()
