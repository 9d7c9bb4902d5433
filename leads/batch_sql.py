"""Batch intake's one statement on PostgreSQL: the batch's new leads and their ``received`` events.

``bulk_create`` builds a model instance per lead and per event and then compiles an INSERT of
every column (~60 for a lead) for each row, which cost more CPU than everything else a batch
does. On PostgreSQL the batch kickoff instead sends its rows as one JSON parameter and runs:

    WITH batch AS (SELECT ... FROM jsonb_to_recordset(%s::jsonb) ...),
         new_lead AS (INSERT INTO leads_lead (...) SELECT ... FROM batch ORDER BY n
                      ON CONFLICT DO NOTHING RETURNING id)
    INSERT INTO audit_event (...) SELECT ... FROM new_lead JOIN batch ... RETURNING lead_id

A lead whose idempotency key a concurrent request took is skipped, as ``ignore_conflicts``
skips it, and gets no event; the ids returned are the leads stored. Rows are inserted in the
caller's order (sorted by key, so that concurrent batches take the index locks in one order).

Only the columns the kickoff sets vary; every other column is its field's default rendered
once as a literal, as in ``leads.kickoff_sql`` (whose column lists this reuses). A test writes a
batch both ways and compares the rows column by column.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from audit.models import Event
from leads.kickoff_sql import EVENT_VARYING, LEAD_VARYING, _Columns
from leads.models import Lead

# One row of the batch: (lead id, idempotency key or None, request fingerprint, the payload as
# JSON text, the received event's hash).
BatchRow = tuple[uuid.UUID, str | None, str, str, str]


class BatchStatement:
    """The statement, built on first use in each process."""

    def __init__(self) -> None:
        self._sql: str | None = None
        self._lock = threading.Lock()

    def usable(self) -> bool:
        return connection.vendor == "postgresql"

    def _build(self) -> str:
        if self._sql is None:
            with self._lock:
                if self._sql is None:
                    self._sql = self._compose()
        return self._sql

    @staticmethod
    def _compose() -> str:
        from audit.services import received_events_build

        lead = _Columns(Lead, LEAD_VARYING, Lead())
        proto = Lead(id=None, received_at=timezone.now())
        event = _Columns(Event, EVENT_VARYING, received_events_build(leads=[proto], actor="")[0])
        # The varying columns, in LEAD_VARYING's and EVENT_VARYING's order.
        lead_values = {
            "id": "batch.id::uuid",
            "source": "%(source)s",
            "lane": "%(lane)s",
            "raw_payload": "batch.payload",
            "idempotency_key": "batch.key",
            "request_fingerprint": "batch.print",
            "received_at": "%(now)s",
            "queued_at": "%(now)s",
        }
        event_values = {
            "chain": "batch.id",
            "lead": "new_lead.id",
            "at": "%(now)s",
            "actor": "%(actor)s",
            "hash": "batch.hash",
        }
        if set(lead_values) != set(LEAD_VARYING) or set(event_values) != set(EVENT_VARYING):
            raise RuntimeError("leads.batch_sql is out of step with leads.kickoff_sql")
        constants = len(lead.varying), len(event.varying)
        lead_select = [lead_values[f.name] for f in lead.varying] + lead.values[constants[0] :]
        event_select = [event_values[f.name] for f in event.varying] + event.values[constants[1] :]
        # Literals rendered by the driver may hold "%": escape them for the named parameters.
        lead_select = [v.replace("%", "%%") if not v.startswith("%(") else v for v in lead_select]
        event_select = [v.replace("%", "%%") if not v.startswith("%(") else v for v in event_select]
        lead_table = connection.ops.quote_name(Lead._meta.db_table)
        event_table = connection.ops.quote_name(Event._meta.db_table)
        # Identifiers from the models' meta, quoted; values are parameters or literals.
        return (
            "WITH batch AS (SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS "  # noqa: S608
            "b(n integer, id text, key text, print text, payload jsonb, hash text)), "
            f"new_lead AS (INSERT INTO {lead_table} ({', '.join(lead.columns)}) "
            f"SELECT {', '.join(lead_select)} FROM batch ORDER BY batch.n "
            'ON CONFLICT DO NOTHING RETURNING "id") '
            f"INSERT INTO {event_table} ({', '.join(event.columns)}) "
            f"SELECT {', '.join(event_select)} FROM new_lead "
            "JOIN batch ON batch.id::uuid = new_lead.id "
            'RETURNING "lead_id"'
        )

    def execute(
        self, *, rows: Sequence[BatchRow], source_id: int, lane: str, now: datetime, actor: str
    ) -> set[uuid.UUID]:
        """Insert the rows' leads and events (in the caller's transaction); the ids stored."""
        sql = self._build()
        parts = []
        for n, (lead_id, key, fingerprint, payload, event_hash) in enumerate(rows):
            key_json = "null" if key is None else _json_string(key)
            parts.append(
                f'{{"n":{n},"id":"{lead_id}","key":{key_json},"print":"{fingerprint}",'
                f'"payload":{payload},"hash":"{event_hash}"}}'
            )
        params: dict[str, Any] = {
            "rows": "[" + ",".join(parts) + "]",
            "source": source_id,
            "lane": lane,
            "now": now,
            "actor": actor[:200],
        }
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return {row[0] for row in cursor.fetchall()}

    def reset(self) -> None:
        with self._lock:
            self._sql = None


def _json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


batch_statement = BatchStatement()
