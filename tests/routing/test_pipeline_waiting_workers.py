"""Single-lead traffic routed in batches by real worker processes (issue 18).

Two ``celery -A config worker`` processes on PostgreSQL and Redis take one ``routing.process_lead``
message per lead, each claiming its lead and the leads waiting beside it in its lane
(``routing.batch.lead_process_batched``, SKIP LOCKED): every lead is routed exactly once, the
round robin stays exact, and the messages whose lead another batch took do nothing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from django.db import connection

from config.celery import app
from leads.models import Lead, LeadStatus
from leads.services import lead_ingest
from routing.loads import rep_loads_reconcile
from routing.models import Assignment, TeamMembership
from routing.rules_io import rules_import
from tests.leads.factories import SourceFactory
from tests.reliability.harness import rules
from tests.support.processes import celery_worker, wait_until

pytestmark = [
    pytest.mark.worker,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

LEADS = 300
REPS = 7
TAKEN = "is not waiting or is leased; nothing to do"


def test_two_workers_route_single_lead_messages_in_batches_once_each_round_robin_exact(
    settings: Any,
) -> None:
    settings.ENQUEUE_IN_BACKGROUND = False  # one message a lead, published inline
    rules_import(rules(REPS), publish=True)
    app.control.purge()  # messages earlier tests left in the shared broker
    form = SourceFactory(slug="contact-us")
    env = {"ROUTING_BATCH_SIZE": "50", "ROUTING_BATCH_WAITING": "true"}
    with (
        celery_worker(concurrency=1, name="a", extra_env=env) as first,
        celery_worker(concurrency=1, name="b", extra_env=env) as second,
    ):
        ids = [
            lead_ingest(source=form, record={"email": f"person{i}@acme.com"}).lead_id  # type: ignore[union-attr]
            for i in range(LEADS)
        ]
        wait_until(
            lambda: Lead.objects.filter(status=LeadStatus.ASSIGNED).count() == LEADS,
            timeout=240,
            interval=1,
            message=lambda: (
                f"{Counter(Lead.objects.values_list('status', 'attempts', 'deferrals'))}\n"
                + first.text()[-3000:]
                + second.text()[-3000:]
            ),
        )
        # Every message is consumed (the ones whose lead a batch took return at once).
        wait_until(
            lambda: (
                first.text().count("succeeded in") + second.text().count("succeeded in") >= LEADS
            ),
            timeout=120,
            message=lambda: first.text()[-3000:] + second.text()[-3000:],
        )
        logs = first.text() + second.text()
    connection.close()
    assert len(set(ids)) == LEADS
    assert Lead.objects.filter(status=LeadStatus.ASSIGNED).count() == LEADS
    # Once each: one assignment a lead, one attempt a lead (nobody claimed one twice).
    assert Assignment.objects.count() == LEADS
    assert Assignment.objects.values("lead").distinct().count() == LEADS
    assert set(Lead.objects.values_list("attempts", flat=True)) == {1}
    # The rotation, in the order the assignments were made under the team's lock.
    members = list(TeamMembership.objects.order_by("position").values_list("rep_id", flat=True))
    routed = list(Assignment.objects.order_by("id").values_list("rep_id", flat=True))
    start = members.index(routed[0])
    assert routed == [members[(start + k) % REPS] for k in range(LEADS)]
    assert sorted(Counter(routed).values())[-1] - sorted(Counter(routed).values())[0] <= 1
    assert rep_loads_reconcile().repaired == 0
    # Batches formed: some messages found their lead already taken by another's batch.
    taken = logs.count(TAKEN)
    print(f"\n{LEADS} single-lead messages: {taken} found their lead taken by a batch")
    assert taken > 0, logs[-3000:]
