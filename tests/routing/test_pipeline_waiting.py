"""One lead's message routes the leads waiting beside it in its lane (issue 18: single-lead
traffic in batches; ``routing.batch.lead_process_batched``).

Embedded (SQLite) and, with DATABASE_URL, on PostgreSQL; the SKIP LOCKED and statement-count
tests are PostgreSQL's. Real worker processes: test_pipeline_waiting_workers.py.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from audit.verify import audit_verify
from leads import lanes
from leads.models import EnrichmentStatus, Lead, LeadStatus
from routing.batch import lead_process_batched
from routing.decisions import clear_live_config_cache
from routing.loads import rep_loads_reconcile
from routing.models import Assignment, TeamMembership
from routing.rules_io import rules_import
from tests.leads.factories import LeadFactory, SourceFactory

pytestmark = pytest.mark.django_db

REPS = 4
RULES: dict[str, Any] = {
    "reps": [
        {"email": f"rep{i}@example.com", "name": f"Rep {i}", "timezone": "UTC"} for i in range(REPS)
    ],
    "teams": [
        {
            "name": "Inbound",
            "strategy": "round_robin",
            "members": [{"rep": f"rep{i}@example.com"} for i in range(REPS)],
        }
    ],
    "ruleset": {
        "name": "Inbound",
        "rules": [
            {"name": "Everyone", "priority": 10, "action": {"type": "team", "team": "Inbound"}}
        ],
    },
}


@pytest.fixture(autouse=True)
def published(settings: Any) -> Any:
    settings.ROUTING_BATCH_SIZE = 50
    settings.ROUTING_BATCH_WAITING = True
    settings.CRM_CONFIG_CACHE_SECONDS = settings.PRIVACY_KEY_CACHE_SECONDS = 3600.0
    clear_live_config_cache()
    rules_import(copy.deepcopy(RULES), publish=True)
    yield
    clear_live_config_cache()


def _lead(n: int, lane: str = lanes.REALTIME, **fields: Any) -> Lead:
    return LeadFactory(raw_payload={"email": f"p{n}-{lane}@acme.de"}, lane=lane, **fields)


def _status(lead: Lead) -> str:
    return str(Lead.objects.values_list("status", flat=True).get(pk=lead.pk))


def _owners(leads: list[Lead]) -> list[int | None]:
    owners = dict(Assignment.objects.filter(active=True).values_list("lead_id", "rep_id"))
    return [owners.get(lead.pk) for lead in leads]


def _members() -> list[int]:
    return list(TeamMembership.objects.order_by("position", "id").values_list("rep_id", flat=True))


def test_one_message_routes_its_lane_oldest_first_round_robin_and_leaves_other_lanes() -> None:
    waiting = [_lead(n) for n in range(10)]
    bulk = [_lead(n, lanes.BULK) for n in range(3)]
    normal = [_lead(n, lanes.NORMAL) for n in range(2)]

    assert lead_process_batched(lead_id=str(waiting[4].pk)) == 0

    assert [_status(lead) for lead in waiting] == [LeadStatus.ASSIGNED] * 10
    assert {_status(lead) for lead in bulk + normal} == {LeadStatus.RECEIVED}
    # The message's lead first, then the lane's oldest first: the rotation in that order.
    order = [waiting[4], *waiting[:4], *waiting[5:]]
    members = _members()
    owners = _owners(order)
    start = members.index(owners[0])  # type: ignore[arg-type]
    assert owners == [members[(start + k) % REPS] for k in range(len(order))]
    processed = [Lead.objects.get(pk=lead.pk).processed_at for lead in order]
    assert processed == sorted(processed)  # type: ignore[type-var]
    assert Assignment.objects.count() == 10
    assert rep_loads_reconcile().repaired == 0
    assert audit_verify().ok
    # The other leads' own messages find their lead done and do nothing.
    for lead in waiting:
        assert lead_process_batched(lead_id=str(lead.pk)) == 0
    assert Assignment.objects.count() == 10
    assert Lead.objects.filter(attempts__gt=1).count() == 0


def test_a_batch_takes_its_lanes_high_priority_leads_first(settings: Any) -> None:
    settings.ROUTING_BATCH_SIZE = 3
    hot_source = SourceFactory(intake_priority=" Hot ")
    old = [_lead(n) for n in range(4)]
    hot_by_source = LeadFactory(
        raw_payload={"email": "s@acme.de"}, lane=lanes.REALTIME, source=hot_source
    )
    hot_by_rule = _lead(99, priority="URGENT")  # a tag rule's, from an earlier routing
    lead_process_batched(lead_id=str(old[0].pk))
    assert _status(old[0]) == LeadStatus.ASSIGNED
    assert _status(hot_by_source) == _status(hot_by_rule) == LeadStatus.ASSIGNED
    assert {_status(lead) for lead in old[1:]} == {LeadStatus.RECEIVED}


def test_leads_tried_or_put_off_are_left_to_their_own_messages() -> None:
    tried = _lead(1, attempts=1, last_error="RuntimeError: boom")  # waits for its backoff
    put_off = _lead(2, deferrals=1)  # its original is still being enriched
    fresh = _lead(3)
    own = _lead(4)
    lead_process_batched(lead_id=str(own.pk))
    assert _status(own) == _status(fresh) == LeadStatus.ASSIGNED
    assert _status(tried) == _status(put_off) == LeadStatus.RECEIVED
    assert Lead.objects.get(pk=tried.pk).attempts == 1


def test_a_message_whose_lead_was_tried_before_routes_it_alone_and_the_others_as_a_batch() -> None:
    own = _lead(1, attempts=1)
    others = [_lead(n) for n in range(2, 5)]
    lead_process_batched(lead_id=str(own.pk))
    assert _status(own) == LeadStatus.ASSIGNED
    assert Lead.objects.get(pk=own.pk).attempts == 2
    assert {_status(lead) for lead in others} == {LeadStatus.ASSIGNED}
    assert {Lead.objects.get(pk=lead.pk).attempts for lead in others} == {1}


def test_off_the_message_routes_its_lead_alone(settings: Any) -> None:
    settings.ROUTING_BATCH_WAITING = False
    own, other = _lead(1), _lead(2)
    lead_process_batched(lead_id=str(own.pk))
    assert (_status(own), _status(other)) == (LeadStatus.ASSIGNED, LeadStatus.RECEIVED)


def test_a_lead_taken_by_another_worker_is_a_no_op_of_one_statement() -> None:
    leads = [_lead(n) for n in range(3)]
    lead_process_batched(lead_id=str(leads[0].pk))
    with CaptureQueriesContext(connection) as captured:
        assert lead_process_batched(lead_id=str(leads[2].pk)) == 0
    assert len(captured.captured_queries) == 1, captured.captured_queries


def _statements(waiting: int, size: int) -> int:
    start = Lead.objects.count()  # new people: no duplicates
    for n in range(waiting):
        _lead(1000 + start + n)
    own = _lead(start)
    with CaptureQueriesContext(connection) as captured:
        lead_process_batched(lead_id=str(own.pk))
    assert Lead.objects.filter(status=LeadStatus.ASSIGNED).count() >= size
    Lead.objects.filter(status=LeadStatus.RECEIVED).update(status=LeadStatus.EXCLUDED)
    return len(captured.captured_queries)


@pytest.mark.postgres
def test_a_messages_statements_are_fixed_whatever_the_number_waiting(settings: Any) -> None:
    """A message routes at most ROUTING_BATCH_SIZE leads: its statements do not grow with the
    backlog beyond that (nor with the batch's size: routing.batch)."""
    settings.ROUTING_BATCH_SIZE = 10
    for n in range(REPS):  # each rep's first lead creates its counters' row: not typical
        lead_process_batched(lead_id=str(_lead(-1 - n, lanes.BULK).pk))
    at_ten = _statements(9, 10)
    at_forty = _statements(39, 10)
    at_two_hundred = _statements(199, 10)
    print(f"\nstatements for one message: {at_ten}, {at_forty}, {at_two_hundred}")
    assert at_ten == at_forty == at_two_hundred
    # Four more than a batch of a chunk (test_pipeline_statements): the message's own claim,
    # and the lock-and-read of the others in place of the chunk's read of what it won.
    assert at_ten <= 36


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_lead_locked_by_another_worker_is_skipped_not_waited_for(settings: Any) -> None:
    """SKIP LOCKED: a waiting lead another transaction holds (another worker claiming it) is
    neither waited for nor taken."""
    settings.WORKER_DB_LOCK_TIMEOUT_MS = 60_000
    own, locked, free = _lead(1), _lead(2), _lead(3)
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Lead.objects.select_for_update().filter(pk=locked.pk).get()
                holding.set()
                done.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        lead_process_batched(lead_id=str(own.pk))
        took = time.monotonic() - started
    finally:
        done.set()
        thread.join()
    assert took < 5
    assert (_status(own), _status(free), _status(locked)) == (
        LeadStatus.ASSIGNED,
        LeadStatus.ASSIGNED,
        LeadStatus.RECEIVED,
    )


def test_a_lead_back_from_enrichment_joins_the_batch_without_another_attempt() -> None:
    back = _lead(
        1, status=LeadStatus.PROCESSING, enrichment_status=EnrichmentStatus.DONE, attempts=1
    )
    parked = _lead(2, status=LeadStatus.PROCESSING, enrichment_status=EnrichmentStatus.PENDING)
    own = _lead(3)
    lead_process_batched(lead_id=str(own.pk))
    assert (_status(own), _status(back)) == (LeadStatus.ASSIGNED, LeadStatus.ASSIGNED)
    assert Lead.objects.get(pk=back.pk).attempts == 1
    assert _status(parked) == LeadStatus.PROCESSING  # still waiting for its enrichment
