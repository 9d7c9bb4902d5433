"""Audit chains under concurrent writers (reliability guide, test 17, second part): eight
threads, each with its own database connection, append to the shared routing chain and to a few
lead chains at the same moment. The advisory lock per chain must serialize them: every chain's
``seq`` runs 1..n without a gap or a repeat, each row's ``prev_hash`` is the row before it (no
fork), and ``audit_verify`` passes. CI writes 800 rows; ``make reliability`` (scale 10) the
guide's 10,000 (PostgreSQL: SQLite serializes writers anyway)."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
from django.db import connection, transaction

from audit.models import ROUTING_CHAIN, Event, EventType
from audit.services import event_record
from audit.verify import audit_verify
from leads.models import Lead
from tests.leads.factories import LeadFactory
from tests.reliability.harness import WAIT_SCALE, scaled

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.reliability,
    pytest.mark.django_db(transaction=True),
]

WRITERS = 8
PER_WRITER = scaled(100, least=20)  # CI 8 x 100 rows; scale 10: 8 x 1,000 (+ the leads' own)


def test_eight_writers_at_once_leave_every_chain_whole_and_verified() -> None:
    leads = [LeadFactory(received_event=False) for _ in range(3)]
    barrier = threading.Barrier(WRITERS)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            barrier.wait()
            for i in range(PER_WRITER):
                lead: Lead | None = leads[(n + i) % len(leads)] if i % 2 else None
                # One event per transaction, as the workers write them.
                with transaction.atomic():
                    if lead is None:
                        event_record(
                            type=EventType.RULES_PUBLISHED, actor=f"user:w{n}", data={"i": i}
                        )
                    else:
                        event_record(type=EventType.TOUCHED, lead=lead, data={"w": n, "i": i})
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120 * WAIT_SCALE)
    assert errors == []

    rows = Event.objects.order_by("chain", "seq").values_list("chain", "seq", "prev_hash", "hash")
    chains: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for chain, seq, prev_hash, digest in rows:
        chains[chain].append((seq, prev_hash, digest))
    assert sum(len(c) for c in chains.values()) == WRITERS * PER_WRITER
    assert len(chains[ROUTING_CHAIN]) == WRITERS * PER_WRITER // 2
    assert set(chains) == {ROUTING_CHAIN} | {str(lead.pk) for lead in leads}
    for name, chain in chains.items():
        assert [seq for seq, _, _ in chain] == list(range(1, len(chain) + 1)), name
        previous = ""
        for _seq, prev_hash, digest in chain:
            assert prev_hash == previous, name  # no fork: each row links to the one before
            previous = digest
    report = audit_verify()
    assert report.ok, [str(f) for f in report.findings[:10]]
