"""Routing a chunk in batches (routing.batch, issue 18): the same outcomes as one by one.

Embedded (SQLite) and, with DATABASE_URL, on PostgreSQL (the same tests: the batch's locks and
set-based statements are PostgreSQL's there). Concurrency with real worker processes is in
test_pipeline_workers.py and tests/reliability, which go through the batch path by default.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from audit.models import Event, EventType
from audit.verify import audit_verify
from leads.models import Lead, LeadStatus
from routing import services
from routing.batch import leads_claim
from routing.decisions import clear_live_config_cache
from routing.loads import rep_loads_reconcile
from routing.models import Assignment, AssignmentKind, Rep, TeamMembership
from routing.rules_io import rules_import
from routing.services import leads_process_chunk
from tests.leads.factories import LeadFactory

pytestmark = pytest.mark.django_db

REPS = 4


def _document(*, max_open: int | None = None, team_reps: int = REPS) -> dict[str, Any]:
    reps = []
    for i in range(team_reps):
        rep: dict[str, Any] = {
            "email": f"rep{i}@example.com",
            "name": f"Rep {i}",
            "timezone": "UTC",
        }
        if max_open is not None:
            rep["max_open"] = max_open
        reps.append(rep)
    return {
        "reps": reps,
        "teams": [
            {
                "name": "Inbound",
                "strategy": "round_robin",
                "members": [{"rep": r["email"]} for r in reps],
            }
        ],
        "value_lists": [{"name": "competitors", "values": ["rival.io"]}],
        "ruleset": {
            "name": "Inbound",
            "rules": [
                {
                    "name": "Exclude competitors",
                    "priority": 10,
                    "when": {
                        "all": [{"field": "email_domain", "op": "in_list", "value": "competitors"}]
                    },
                    "action": {"type": "exclude", "reason": "competitor"},
                },
                {
                    "name": "Germany",
                    "priority": 20,
                    "when": {"all": [{"field": "country", "op": "eq", "value": "DE"}]},
                    "action": {"type": "team", "team": "Inbound"},
                },
            ],
        },
    }


@pytest.fixture(autouse=True)
def _batches(settings: Any) -> Any:
    settings.ROUTING_BATCH_SIZE = 50
    clear_live_config_cache()
    yield
    clear_live_config_cache()


def _publish(**kwargs: Any) -> None:
    rules_import(copy.deepcopy(_document(**kwargs)), publish=True)


def _lead(email: str, country: str = "Germany") -> Lead:
    return LeadFactory(raw_payload={"email": email, "country": country})


def _run(leads: list[Lead], **kwargs: Any) -> services.ChunkOutcome:
    return leads_process_chunk(lead_ids=[str(lead.id) for lead in leads], slice_seconds=0, **kwargs)


def _statuses(leads: list[Lead]) -> list[str]:
    rows = Lead.objects.filter(id__in=[lead.id for lead in leads]).values_list("id", "status")
    found = dict(rows)
    return [found[lead.id] for lead in leads]


def _owner(lead: Lead) -> int | None:
    return (
        Assignment.objects.filter(lead=lead, active=True).values_list("rep_id", flat=True).first()
    )


def test_a_batch_goes_round_robin_in_the_chunks_order_with_verifiable_chains() -> None:
    _publish()
    leads = [_lead(f"new{n}@acme.de") for n in range(3 * REPS)]
    outcome = _run(leads)
    assert outcome.failures == 0
    assert _statuses(leads) == [LeadStatus.ASSIGNED] * len(leads)
    members = list(
        TeamMembership.objects.order_by("position", "id").values_list("rep_id", flat=True)
    )
    owners = [_owner(lead) for lead in leads]
    start = members.index(owners[0])
    assert owners == [members[(start + n) % REPS] for n in range(len(leads))]
    # One assignment each, the counters equal to the assignments, every chain intact.
    assert Assignment.objects.count() == len(leads)
    assert rep_loads_reconcile().repaired == 0
    report = audit_verify()
    assert report.ok, report.findings
    types = list(Event.objects.filter(lead=leads[0]).order_by("seq").values_list("type", flat=True))
    assert types == [EventType.RECEIVED, EventType.ASSIGNED]
    # The rep's last assignment is its last lead's.
    last = max(leads, key=lambda lead: leads.index(lead) if _owner(lead) == owners[-1] else -1)
    rep = Rep.objects.get(pk=owners[-1])
    assigned_at = Assignment.objects.get(lead=last).assigned_at
    assert rep.last_assigned_at == assigned_at


def test_outcomes_other_than_an_owner_in_a_batch() -> None:
    _publish()
    leads = [_lead("spy@rival.io"), _lead("far@acme.com", "United States"), _lead("a@acme.de")]
    assert _run(leads).failures == 0
    assert _statuses(leads) == [LeadStatus.EXCLUDED, LeadStatus.UNASSIGNED, LeadStatus.ASSIGNED]
    excluded = Event.objects.get(lead=leads[0], type=EventType.EXCLUDED)
    assert excluded.rule_name == "Exclude competitors"
    unassigned = Lead.objects.get(pk=leads[1].pk)
    assert unassigned.unassigned_retry_at is not None  # its first automatic retry is scheduled
    assert audit_verify().ok


def test_copies_of_one_person_in_one_batch_give_one_original_and_sticky_duplicates() -> None:
    _publish()
    first = _lead("same@acme.de")
    others = [_lead(f"other{n}@acme.de") for n in range(3)]
    copies = [_lead("same@acme.de"), _lead("SAME@acme.de")]
    leads = [first, others[0], copies[0], others[1], copies[1], others[2]]
    assert _run(leads).failures == 0
    assert _statuses(copies) == [LeadStatus.DUPLICATE, LeadStatus.DUPLICATE]
    owner = _owner(first)
    assert owner is not None
    for copy_ in copies:
        stored = Lead.objects.get(pk=copy_.pk)
        assert stored.duplicate_of_id == first.id
        assignment = Assignment.objects.get(lead=copy_)
        assert (assignment.rep_id, assignment.kind) == (owner, AssignmentKind.DUPLICATE)
    assert Lead.objects.get(pk=first.pk).duplicate_of_id is None
    # The duplicates' sticky owner takes no turn: the others went round robin among all.
    assert len({_owner(lead) for lead in [first, *others]}) == REPS
    assert audit_verify().ok


def test_caps_are_exact_in_a_batch() -> None:
    _publish(max_open=2)
    leads = [_lead(f"capped{n}@acme.de") for n in range(2 * REPS + 3)]
    assert _run(leads).failures == 0
    statuses = _statuses(leads)
    assert statuses.count(LeadStatus.ASSIGNED) == 2 * REPS
    assert statuses.count(LeadStatus.UNASSIGNED) == 3
    per_rep = [Assignment.objects.filter(rep_id=rep.pk).count() for rep in Rep.objects.all()]
    assert per_rep == [2] * REPS
    assert rep_loads_reconcile().repaired == 0


def test_a_lead_that_breaks_its_batch_fails_alone_and_the_others_are_routed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _publish()
    leads = [_lead(f"fine{n}@acme.de") for n in range(6)]
    bad = leads[3]
    real = services.lead_apply_normalization

    def breaks(*, lead: Lead) -> Lead:
        if lead.pk == bad.pk:
            raise RuntimeError("boom")
        return real(lead=lead)

    monkeypatch.setattr(services, "lead_apply_normalization", breaks)
    outcome = _run(leads)
    assert outcome.failures == 1
    statuses = _statuses(leads)
    assert statuses[3] == LeadStatus.RECEIVED  # handed back for a retry, as one by one
    assert [s for n, s in enumerate(statuses) if n != 3] == [LeadStatus.ASSIGNED] * 5
    stored = Lead.objects.get(pk=bad.pk)
    assert stored.attempts == 1
    assert stored.last_error == "RuntimeError: boom"
    assert not Assignment.objects.filter(lead=bad).exists()
    assert audit_verify().ok


def test_a_lead_tried_before_is_not_claimed_by_a_batch() -> None:
    _publish()
    fresh, tried = _lead("fresh@acme.de"), _lead("tried@acme.de")
    Lead.objects.filter(pk=tried.pk).update(attempts=1)
    claimed, _lease = leads_claim([fresh.pk, tried.pk])
    assert claimed == [fresh.pk]
    Lead.objects.filter(pk=fresh.pk).update(status=LeadStatus.RECEIVED, claimed_until=None)
    # The chunk routes both: the batch one, one by one the other.
    assert _run([fresh, tried]).failures == 0
    assert _statuses([fresh, tried]) == [LeadStatus.ASSIGNED, LeadStatus.ASSIGNED]
    assert Lead.objects.get(pk=tried.pk).attempts == 2


def test_a_lead_processed_twice_is_assigned_once() -> None:
    _publish()
    leads = [_lead(f"twice{n}@acme.de") for n in range(4)]
    _run(leads)
    _run(leads)  # a second delivery of the message: nothing is claimable
    assert Assignment.objects.count() == 4


def test_a_chunk_of_batches_hands_the_rest_back_after_its_time_slice(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    import contextlib

    from config.celery import app

    settings.ROUTING_BATCH_SIZE = 2
    sent: list[str] = []
    monkeypatch.setattr(app, "send_task", lambda name, args, **kw: sent.append(args[0]))
    monkeypatch.setattr(app, "producer_or_acquire", lambda *a, **k: contextlib.nullcontext())
    _publish()
    leads = [_lead(f"slice{n}@acme.de") for n in range(5)]
    outcome = leads_process_chunk(lead_ids=[str(lead.id) for lead in leads], slice_seconds=1e-9)
    assert (outcome.processed, outcome.handed_back) == (2, 3)
    assert _statuses(leads)[:2] == [LeadStatus.ASSIGNED] * 2
    assert _statuses(leads)[2:] == [LeadStatus.RECEIVED] * 3


def test_a_batch_leaves_no_lead_or_source_in_the_workers_log_context() -> None:
    """A lead a batch leaves to one-by-one processing (a duplicate here) was processed outside
    any log_context: the source it added stayed on every later line of that worker process
    (found by tests/config/test_log_context.py failing after this file in CI)."""
    from config.logging import _context

    _publish()
    first = _lead("same@acme.de")
    copy_ = _lead("same@acme.de")
    before = dict(_context.get())
    assert _run([first, copy_]).failures == 0
    assert _statuses([copy_]) == [LeadStatus.DUPLICATE]
    assert dict(_context.get()) == before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_batch_claim_cut_off_by_lock_contention_does_not_drop_its_chunk() -> None:
    """The batch's claim is one UPDATE of many leads; each row's new status fires the report
    rollup trigger, which upserts its (slot, status, shard) counter row. Two claims (or a claim
    and a batch writing its outcomes) took those rows in opposite orders and deadlocked: in CI's
    two-worker test PostgreSQL cut a claim off, the exception failed the chunk's task, and
    every lead of the chunk not yet routed stayed `received` with no message (300 of 700).
    Here another transaction holds one shard's `lead:received` counter beyond the claim's
    lock_timeout: the claim cannot be had, the leads go one by one, and only those of that
    shard are left (for a retry), unclaimed and without a lost attempt."""
    import threading

    from django.db import connection, transaction

    _publish()
    leads = [_lead(f"contended{n}@acme.de") for n in range(12)]
    shard = leads[0].id.bytes[15] % 8  # the trigger's shard: the id's last byte, mod 8
    held, release = threading.Event(), threading.Event()

    def hold_the_counter() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT n FROM audit_reportslot WHERE measure = 'lead:received' "
                    "AND shard = %s FOR UPDATE",
                    [shard],
                )
                assert cursor.fetchall(), "the intake counted the leads"
                held.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_counter)
    holder.start()
    try:
        assert held.wait(30)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")  # a worker's is 5 s
        outcome = _run(leads)
    finally:
        release.set()
        holder.join(30)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    contended = [lead for lead in leads if lead.id.bytes[15] % 8 == shard]
    others = [lead for lead in leads if lead.id.bytes[15] % 8 != shard]
    assert outcome.failures == len(contended)
    assert _statuses(others) == [LeadStatus.ASSIGNED] * len(others)
    assert _statuses(contended) == [LeadStatus.RECEIVED] * len(contended)
    assert set(
        Lead.objects.filter(id__in=[lead.id for lead in contended]).values_list(
            "attempts", flat=True
        )
    ) == {0}
    assert Assignment.objects.count() == len(others)


# Columns a batch and one by one set differently by design (ids, times, the lead's own keys).
_OWN = {
    "id",
    "source_id",
    "raw_payload",
    "email",
    "request_fingerprint",
    "idempotency_key",
    "received_at",
    "normalized_at",
    "processed_at",
    "deduped_at",
    "dedup_key",
    "person_key_id",
    "queued_at",
}


def _row(lead: Lead) -> dict[str, Any]:
    values = Lead.objects.filter(pk=lead.pk).values().get()
    return {name: value for name, value in values.items() if name not in _OWN}


def test_a_batch_saves_the_lead_row_one_by_one_saves(settings: Any) -> None:
    """The batch writes only the columns its stages changed (``_leads_save``): every column of
    a lead routed in a batch equals the one of the same lead routed one by one (a full save)."""
    _publish()
    payload = {
        "first_name": "Ada",
        "last_name": "Lovelace",
        "company": "Analytical Engines GmbH",
        "title": "Head of Engineering",
        "country": "Germany",
        "city": "Berlin",
        "postal_code": "10115",
        "utm_source": "webinar",
        "employees": "250",
        "favourite_colour": "green",
    }
    alone = LeadFactory(raw_payload={**payload, "email": "ada1@engines.de"})
    in_batch = LeadFactory(raw_payload={**payload, "email": "ada2@engines.de"})
    settings.ROUTING_BATCH_SIZE = 1
    assert _run([alone]).failures == 0
    settings.ROUTING_BATCH_SIZE = 50
    assert _run([in_batch, _lead("other@acme.de")]).failures == 0
    assert _statuses([alone, in_batch]) == [LeadStatus.ASSIGNED] * 2
    assert _row(in_batch) == _row(alone)
    assert _row(in_batch)["custom"]  # the payload's own field was kept


@pytest.mark.postgres
def test_the_batchs_update_writes_a_json_column_changed_in_place() -> None:
    """A JSON column changed in place (the same dict) is written; a replaced column too; the
    payload, which nothing changes after intake, is written only when replaced."""
    from routing.batch import _leads_save

    first, second = _lead("one@acme.de"), _lead("two@acme.de")
    leads = list(Lead.objects.filter(pk__in=[first.pk, second.pk]).order_by("id"))
    loaded = {lead.pk: dict(lead.__dict__) for lead in leads}
    leads[0].custom["added"] = "in place"
    leads[1].city = "Hamburg"
    _leads_save(leads, loaded)
    saved = {lead.pk: lead for lead in Lead.objects.filter(pk__in=[first.pk, second.pk])}
    assert saved[leads[0].pk].custom == {**leads[1].custom, "added": "in place"}
    assert saved[leads[1].pk].city == "Hamburg"
    assert saved[leads[0].pk].claimed_until is None
