"""Batch intake's one statement on PostgreSQL (leads.batch_sql, issue 18): the rows it writes
are the rows ``bulk_create`` writes for the leads and their ``received`` events."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import Event
from audit.services import (
    events_record_received,
    received_event_hashes,
    received_event_values,
    received_events_build,
)
from audit.verify import audit_verify
from leads import lanes
from leads.batch_sql import batch_statement
from leads.models import Lead
from leads.services import _new_lead, _prepare, lead_ingest_batch

RECORDS = [
    {"email": "ana@acme.com", "Org": "Acme", "lead_score": 7.5, "tags": ["a", 1]},
    {"email": "jörg@müller.de", "note": 'quotes " and \\ backslash\nnewline', "n": 10**20},
    {"contact": {"email": "li@x.cn", "name": "李 王"}, "empty": {}, "list": [], "none": None},
    {"phone": "+1 415 555 0100", "external_id": 'key with "quotes" and ünïcode'},
    {"email": "big@acme.com", "float": 1e300, "neg": -0.5, "bool": True, "emoji": "🙂"},
]


def _columns(obj: Any) -> dict[str, Any]:
    return {
        field.attname: getattr(obj, field.attname)
        for field in type(obj)._meta.concrete_fields
        if not field.primary_key
    }


def test_received_hashes_are_the_built_events_hashes() -> None:
    now = timezone.now()
    ids = [uuid.uuid4() for _ in range(5)]
    leads = [Lead(id=lead_id, received_at=now) for lead_id in ids]
    for actor in ("source:webform", "source:" + "x" * 300, 'source:"odd"\u00e9'):
        built = [event.hash for event in received_events_build(leads=leads, actor=actor)]
        assert received_event_hashes(lead_ids=ids, at=now, actor=actor) == built


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_statement_writes_the_rows_bulk_create_writes(source) -> None:  # type: ignore[no-untyped-def]
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's statement")
    now = timezone.now()
    actor = "source:webform"
    orm_items = [_prepare(source, record, None, i) for i, record in enumerate(RECORDS)]
    sql_items = [_prepare(source, record, None, i) for i, record in enumerate(RECORDS)]
    orm_leads = [_new_lead(source, item, now, lanes.BULK) for item in orm_items]
    for lead in orm_leads:  # the keys must differ: one source holds each once
        if lead.idempotency_key is not None:
            lead.idempotency_key = "orm-" + lead.idempotency_key
    Lead.objects.bulk_create(orm_leads)
    events_record_received(leads=orm_leads, actor=actor)

    hashes = received_event_hashes(lead_ids=[i.lead_id for i in sql_items], at=now, actor=actor)
    stored = batch_statement.execute(
        rows=[
            (i.lead_id, i.key, i.fingerprint, i.canonical_json, h)
            for i, h in zip(sql_items, hashes, strict=True)
        ],
        source_id=source.pk,
        lane=lanes.BULK,
        now=now,
        actor=actor,
    )
    assert stored == {item.lead_id for item in sql_items}
    for orm_item, sql_item in zip(orm_items, sql_items, strict=True):
        orm_row = _columns(Lead.objects.get(pk=orm_item.lead_id))
        sql_row = _columns(Lead.objects.get(pk=sql_item.lead_id))
        if sql_item.key is not None:
            assert orm_row.pop("idempotency_key") == "orm-" + sql_row.pop("idempotency_key")
        assert sql_row == orm_row  # every column, defaults and the payload included
        orm_event = _columns(Event.objects.get(lead_id=orm_item.lead_id))
        sql_event = _columns(Event.objects.get(lead_id=sql_item.lead_id))
        for differs in ("chain", "lead_id", "hash"):  # the lead's id is in all three
            orm_event.pop(differs)
            sql_event.pop(differs)
        assert sql_event == orm_event
        assert audit_verify(chain=str(sql_item.lead_id)).ok


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_key_taken_meanwhile_is_skipped_with_no_event(source) -> None:  # type: ignore[no-untyped-def]
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's statement")
    [taken] = lead_ingest_batch(source=source, records=[{"email": "a@b.co", "external_id": "k"}])
    now = timezone.now()
    items = [
        _prepare(source, {"email": "a@b.co", "external_id": "k"}, None, 0),
        _prepare(source, {"email": "c@b.co", "external_id": "k2"}, None, 1),
    ]
    hashes = received_event_hashes(lead_ids=[i.lead_id for i in items], at=now, actor="source:x")
    stored = batch_statement.execute(
        rows=[
            (i.lead_id, i.key, i.fingerprint, i.canonical_json, h)
            for i, h in zip(items, hashes, strict=True)
        ],
        source_id=source.pk,
        lane=lanes.BULK,
        now=now,
        actor="source:x",
    )
    assert stored == {items[1].lead_id}
    assert not Lead.objects.filter(pk=items[0].lead_id).exists()
    assert not Event.objects.filter(lead_id=items[0].lead_id).exists()
    assert Event.objects.filter(lead_id=items[1].lead_id).count() == 1
    assert Lead.objects.get(source=source, idempotency_key="k").pk == taken.lead_id  # type: ignore[union-attr]


def test_received_hashes_for_an_actor_that_contains_the_template_marker():
    """The template's marker is the all-zero UUID, a valid source slug: the hashes are then
    built one by one instead of failing every batch of that source."""
    actor = f"source:{uuid.UUID(int=0)}"
    at = timezone.now()
    ids = [uuid.uuid4(), uuid.uuid4()]
    assert received_event_hashes(lead_ids=ids, at=at, actor=actor) == [
        received_event_values(lead_id=lead_id, at=at, actor=actor)["hash"] for lead_id in ids
    ]
