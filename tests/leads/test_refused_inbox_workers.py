"""The refused inbox end to end on PostgreSQL with two real workers (issue 16 "Tests"): a tool's
nested payloads are refused and kept; RevOps fixes the source's field map; re-accepting them (twice,
from two threads at once) makes one lead each, routed once by the workers."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection
from django.test import Client

from leads.inbox import refused_reaccept
from leads.models import Lead, LeadStatus, RefusedPayload, RefusedState
from routing.models import Assignment
from routing.rules_io import rules_import
from tests.leads.factories import SourceFactory
from tests.support.processes import celery_worker, wait_until

pytestmark = [
    pytest.mark.worker,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

LEADS = 12
RULES = {
    "reps": [{"email": f"rep{i}@example.com", "name": f"Rep {i}"} for i in range(3)],
    "teams": [
        {
            "name": "Inbound",
            "strategy": "round_robin",
            "members": [{"rep": f"rep{i}@example.com"} for i in range(3)],
        }
    ],
    "ruleset": {
        "name": "Inbound",
        "rules": [{"name": "All", "priority": 10, "action": {"type": "team", "team": "Inbound"}}],
    },
}


def _payload(n: int) -> dict:
    # A tool's own names, one level down, that no alias knows: refused until the map names them.
    return {
        "event": "submission",
        "submission": {"id": f"s{n}", "Kontakt": f"buyer{n}@acme-{n}.de", "Firma": "Acme GmbH"},
    }


def test_refused_payloads_reaccepted_after_the_kind_is_set_are_routed_once():
    rules_import(RULES, publish=True)
    source = SourceFactory(slug="demo-form")
    client = Client()
    for n in range(LEADS):
        response = client.post(
            "/api/v1/intake/demo-form/",
            _payload(n),
            content_type="application/json",
            HTTP_AUTHORIZATION="Bearer token-demo-form",
        )
        assert response.status_code == 422, response.content
    assert RefusedPayload.objects.filter(source=source, state=RefusedState.OPEN).count() == LEADS
    assert not Lead.objects.exists()

    source.field_map = {"submission.Kontakt": "email", "submission.Firma": "company"}
    source.save()
    ids = list(RefusedPayload.objects.values_list("id", flat=True))
    errors: list[str] = []

    def reaccept_all() -> None:
        try:
            for refused_id in ids:
                outcome = refused_reaccept(refused_id=refused_id, actor="user:revops")
                if outcome.error:
                    errors.append(outcome.error)
        finally:
            connection.close()

    with celery_worker(concurrency=2) as one, celery_worker(concurrency=2) as two:
        threads = [threading.Thread(target=reaccept_all) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        wait_until(
            lambda: Lead.objects.filter(status=LeadStatus.ASSIGNED).count() == LEADS,
            timeout=120,
            message=lambda: one.text()[-3000:] + two.text()[-3000:],
        )
    assert Lead.objects.count() == LEADS
    assert RefusedPayload.objects.filter(state=RefusedState.ACCEPTED).count() == LEADS
    assert set(Lead.objects.values_list("email", flat=True)) == {
        f"buyer{n}@acme-{n}.de" for n in range(LEADS)
    }
    assert set(Lead.objects.values_list("idempotency_key", flat=True)) == {
        f"refused:{refused_id}" for refused_id in ids
    }
    per_lead = Counter(Assignment.objects.values_list("lead_id", flat=True))
    assert len(per_lead) == LEADS
    assert set(per_lead.values()) == {1}
    assert Counter(Assignment.objects.values_list("rep__email", flat=True)) == {
        f"rep{i}@example.com": LEADS // 3 for i in range(3)
    }
