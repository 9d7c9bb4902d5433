"""The kickoff's single statement on PostgreSQL (leads.kickoff_sql, issue 18): the rows it
writes are the rows ``save()`` + ``bulk_create`` write, in one statement and one commit."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models.signals import pre_init
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import Event
from audit.services import received_events_build
from audit.verify import audit_verify
from leads import lanes
from leads.kickoff_sql import kickoff_statement
from leads.models import Lead
from leads.services import _new_lead, _prepare, lead_ingest

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

RECORD = {"email": "ana@acme.com", "Org": "Acme", "lead_score": 7.5, "tags": ["a", 1]}


def _columns(obj: Any) -> dict[str, Any]:
    return {
        field.attname: getattr(obj, field.attname)
        for field in type(obj)._meta.concrete_fields
        if not field.primary_key
    }


def _both_ways(source: Any, key: str | None) -> tuple[Lead, Lead, Event, Event]:
    now = timezone.now()
    item = _prepare(source, RECORD, key, 0)
    by_orm = _new_lead(source, item, now, lanes.REALTIME)
    by_orm.idempotency_key = None if key is None else key + "-orm"
    [orm_event] = received_events_build(leads=[by_orm], actor="source:webform")
    by_orm.save(force_insert=True)
    Event.objects.bulk_create([orm_event])

    item = _prepare(source, RECORD, key, 0)
    assert kickoff_statement.available()
    _insert(source, item, now)
    by_sql = Lead.objects.get(pk=item.lead_id)
    sql_event = Event.objects.get(lead_id=item.lead_id)
    return by_orm, by_sql, orm_event, sql_event


def _insert(source: Any, item: Any, now: Any) -> None:
    kickoff_statement.insert(
        lead_id=item.lead_id,
        source_id=source.pk,
        lane=lanes.REALTIME,
        raw_payload=item.record,
        idempotency_key=item.key,
        request_fingerprint=item.fingerprint,
        received_at=now,
        actor="source:webform",
    )


@pytest.mark.parametrize("key", [None, "order-17"])
def test_the_statement_writes_the_rows_the_orm_writes(source, key) -> None:  # type: ignore[no-untyped-def]
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's statement")
    by_orm, by_sql, _orm_event, _sql_event = _both_ways(source, key)
    orm_row = _columns(Lead.objects.get(pk=by_orm.pk))
    sql_row = _columns(Lead.objects.get(pk=by_sql.pk))
    if key is not None:
        assert sql_row.pop("idempotency_key") == key
        assert orm_row.pop("idempotency_key") == key + "-orm"
    assert sql_row == orm_row  # every column, defaults included
    orm_events = Event.objects.filter(lead_id=by_orm.pk)
    sql_events = Event.objects.filter(lead_id=by_sql.pk)
    assert orm_events.count() == sql_events.count() == 1
    orm_event, sql_event = _columns(orm_events.get()), _columns(sql_events.get())
    for differs in ("chain", "lead_id", "hash"):  # the lead's id is in all three
        orm_event.pop(differs)
        sql_event.pop(differs)
    assert sql_event == orm_event
    assert audit_verify(chain=str(by_sql.pk)).ok


def test_one_statement_and_no_transaction_of_its_own(source) -> None:  # type: ignore[no-untyped-def]
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's statement")
    item = _prepare(source, {"email": "bo@acme.com"}, None, 0)
    # Inside the test's transaction it takes a savepoint, as transaction.atomic would.
    with CaptureQueriesContext(connection) as queries:
        _insert(source, item, timezone.now())
    statements = [q["sql"] for q in queries.captured_queries]
    inserts = [sql for sql in statements if "INSERT" in sql]
    assert len(inserts) == 1
    assert inserts[0].startswith("WITH new_lead AS (INSERT INTO")
    assert all("SAVEPOINT" in sql for sql in statements if sql not in inserts)


def test_a_repeated_key_writes_neither_row_and_replays(source, published) -> None:  # type: ignore[no-untyped-def]
    first = lead_ingest(source=source, record={"email": "cy@acme.com"}, idempotency_key="k1")
    events = Event.objects.count()
    item = _prepare(source, {"email": "cy@acme.com"}, "k1", 0)
    if connection.vendor == "postgresql":
        with pytest.raises(IntegrityError), transaction.atomic():
            _insert(source, item, timezone.now())
    assert Event.objects.count() == events
    assert Lead.objects.count() == 1
    again = lead_ingest(source=source, record={"email": "cy@acme.com"}, idempotency_key="k1")
    assert again.replayed
    assert again.lead_id == first.lead_id


def test_the_kickoff_uses_the_statement_and_builds_no_model(source, published) -> None:  # type: ignore[no-untyped-def]
    """On PostgreSQL a new lead from a source is written by the one statement, with no Lead or
    Event instance built (their constructors are most of the kickoff's Python work)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's statement")
    built: list[str] = []

    def count(sender: Any, **kwargs: Any) -> None:
        built.append(sender.__name__)

    pre_init.connect(count, sender=Lead)
    pre_init.connect(count, sender=Event)
    try:
        with CaptureQueriesContext(connection) as queries:
            accepted = lead_ingest(source=source, record={"email": "ed@acme.com"})
    finally:
        pre_init.disconnect(count, sender=Lead)
        pre_init.disconnect(count, sender=Event)
    assert built == []
    inserts = [q["sql"] for q in queries.captured_queries if "INSERT" in q["sql"]]
    assert len(inserts) == 1
    assert inserts[0].startswith("WITH new_lead AS (INSERT INTO")
    lead = Lead.objects.get(pk=accepted.lead_id)
    assert lead.received_at == accepted.received_at
    assert Event.objects.get(lead=lead).actor == f"source:{source.slug}"
    assert audit_verify(chain=str(lead.pk)).ok
