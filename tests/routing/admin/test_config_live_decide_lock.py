"""A save in the Team or Rep admin (with its inlines: memberships and weights, absences) writes
rows a lead being decided locks, so it takes the decide lock exclusively before its first write,
like a publish that changes teams or reps (PostgreSQL, real transactions): it waits for the
leads being decided (each holds the lock shared from its claim), and no lead is decided half
on the old teams and half on the new."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse

from routing.decisions import DECIDE_LOCK
from routing.drafts.models import ConfigSnapshot
from routing.models import Rep, RuleSet, Team, TeamMembership
from tests.routing.admin.test_config_audit import _form_data

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WAITED = 1.0


def _waits_for_a_lead_being_decided(client: Client, url: str, data: dict[str, Any]) -> Any:
    """POST ``data`` in another thread while this connection holds the decide lock shared, as a
    lead's claim does; assert the save waited for it and return its response."""
    done: list[Any] = []
    failed: list[BaseException] = []

    def save() -> None:
        try:
            done.append(client.post(url, data))
        except BaseException as exc:
            failed.append(exc)
        finally:
            connection.close()

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))", [DECIDE_LOCK]
        )
        thread = threading.Thread(target=save)
        thread.start()
        time.sleep(WAITED)
        assert done == []  # waiting for the lead
        assert failed == []
    thread.join(60)
    assert not failed, failed
    assert len(done) == 1
    return done[0]


def test_a_team_save_with_its_members_waits_for_the_leads_being_decided(
    client_revops: Client, live: RuleSet, emea: Team
) -> None:
    url = reverse("admin:routing_team_change", args=[emea.pk])
    data = _form_data(client_revops, url, sla_minutes=5)
    ben = str(Rep.objects.get(email="ben@x.example").pk)
    prefix = next(k for k, v in data.items() if k.endswith("-rep") and str(v) == ben)
    data[prefix.removesuffix("-rep") + "-weight"] = 4
    response = _waits_for_a_lead_being_decided(client_revops, url, data)
    assert response.status_code == 302
    assert Team.objects.get(pk=emea.pk).sla_minutes == 5
    assert TeamMembership.objects.get(team=emea, rep__email="ben@x.example").weight == 4
    assert ConfigSnapshot.objects.count() == 2  # baseline and this version


def test_a_reps_caps_save_waits_for_the_leads_being_decided(
    client_revops: Client, live: RuleSet, emea: Team
) -> None:
    ana = Rep.objects.get(email="ana@x.example")
    url = reverse("admin:routing_rep_change", args=[ana.pk])
    response = _waits_for_a_lead_being_decided(
        client_revops, url, _form_data(client_revops, url, max_open=2)
    )
    assert response.status_code == 302
    assert Rep.objects.get(pk=ana.pk).max_open == 2
