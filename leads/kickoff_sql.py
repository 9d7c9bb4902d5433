"""The kickoff's one statement on PostgreSQL: the lead and its ``received`` event together.

``Model.save()`` and ``bulk_create`` compile an INSERT of every column on every call (the lead
has ~60), and the kickoff's transaction costs BEGIN, two INSERTs and COMMIT: four round trips.
On PostgreSQL the kickoff instead runs one statement, prepared once per process:

    WITH new_lead AS (INSERT INTO leads_lead (...) VALUES (...) RETURNING id)
    INSERT INTO audit_event (...) SELECT ... FROM new_lead

Outside a transaction it commits on its own: one round trip, one commit, both rows or neither
(a repeated idempotency key raises IntegrityError as the ORM's INSERT would). Inside a
caller's transaction it runs in a savepoint, as ``transaction.atomic`` would.

Only the columns the kickoff sets are parameters; every other column is written as its field's
default, rendered as a literal once (a column whose default is NULL is left out). A test writes
one lead both ways and compares the rows column by column, so a field added later with a
default is picked up, and one the kickoff must set is noticed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from django.db import connection, models, transaction
from django.db.models.fields import AutoFieldMixin
from django.utils import timezone

from audit.models import Event
from leads.models import Lead

# Set per lead by the kickoff (leads.services._new_lead); the rest are the fields' defaults.
LEAD_VARYING = (
    "id",
    "source",
    "lane",
    "raw_payload",
    "idempotency_key",
    "request_fingerprint",
    "received_at",
    "queued_at",
)
# Set per event for a `received` event (audit.services.received_events_build); the rest are
# the same for every received event of a source's kickoff (checked on each use).
EVENT_VARYING = ("chain", "lead", "at", "actor", "hash")


class _Columns:
    """One table's INSERT: its columns, the varying ones as placeholders, the rest literals."""

    def __init__(self, model: type[models.Model], varying: Sequence[str], prototype: Any) -> None:
        self.varying: list[models.Field[Any, Any]] = []
        for name in varying:
            field = model._meta.get_field(name)
            if not isinstance(field, models.Field):
                raise TypeError(f"{model.__name__}.{name} is not a column")
            self.varying.append(field)
        self.constant: list[tuple[models.Field[Any, Any], Any]] = []
        columns: list[str] = []
        values: list[str] = []
        quote = connection.ops.quote_name
        varying_set = set(self.varying)
        for field in model._meta.concrete_fields:
            if field in varying_set:
                continue
            if field.primary_key and isinstance(field, AutoFieldMixin):
                continue  # the sequence's
            value = getattr(prototype, field.attname)
            self.constant.append((field, value))
            prepared = field.get_db_prep_save(value, connection)
            if prepared is None:
                continue  # NULL: the column's own default
            columns.append(quote(str(field.column)))
            values.append(connection.ops.compose_sql("%s", [prepared]))  # type: ignore[attr-defined]
        self.columns = [quote(str(field.column)) for field in self.varying] + columns
        self.values = ["%s"] * len(self.varying) + values

    def params(self, obj: models.Model) -> list[Any]:
        return [
            field.get_db_prep_save(getattr(obj, field.attname), connection)
            for field in self.varying
        ]

    def matches(self, obj: models.Model) -> bool:
        """Whether ``obj`` holds the constants this statement writes."""
        return all(getattr(obj, field.attname) == value for field, value in self.constant)


class KickoffStatement:
    """The statement and its column lists, built on first use in each process."""

    def __init__(self) -> None:
        self._built: tuple[str, _Columns, _Columns] | None = None
        self._lock = threading.Lock()

    def _build(self) -> tuple[str, _Columns, _Columns]:
        if self._built is None:
            with self._lock:
                if self._built is None:
                    lead = _Columns(Lead, LEAD_VARYING, Lead())
                    # A received event as audit builds it, for a lead that is not there.
                    from audit.services import received_events_build

                    proto = Lead(id=None, received_at=timezone.now())
                    event = _Columns(
                        Event, EVENT_VARYING, received_events_build(leads=[proto], actor="")[0]
                    )
                    event_values = [
                        '"new_lead"."id"' if field.name == "lead" else "%s"
                        for field in event.varying
                    ] + event.values[len(event.varying) :]
                    lead_table = connection.ops.quote_name(Lead._meta.db_table)
                    event_table = connection.ops.quote_name(Event._meta.db_table)
                    # Identifiers from the models' meta, quoted; values are parameters or
                    # literals rendered by the driver.
                    sql = (
                        f"WITH new_lead AS (INSERT INTO {lead_table} "  # noqa: S608
                        f"({', '.join(lead.columns)}) VALUES ({', '.join(lead.values)}) "
                        'RETURNING "id") '
                        f"INSERT INTO {event_table} ({', '.join(event.columns)}) "
                        f"SELECT {', '.join(event_values)} FROM new_lead"
                    )
                    self._built = (sql, lead, event)
        return self._built

    def usable(self, lead: Lead, event: Event) -> bool:
        """Whether this statement can write ``lead`` and ``event``: on PostgreSQL, a new lead
        that sets no column beyond the kickoff's and a plain received event (else the ORM)."""
        if connection.vendor != "postgresql":
            return False
        _sql, lead_columns, event_columns = self._build()
        return lead_columns.matches(lead) and event_columns.matches(event)

    def execute(self, lead: Lead, event: Event) -> None:
        """Insert both rows in one statement (committed by it, outside a transaction)."""
        sql, lead_columns, event_columns = self._build()
        params = lead_columns.params(lead) + [
            value
            for field, value in zip(event_columns.varying, event_columns.params(event), strict=True)
            if field.name != "lead"
        ]
        if connection.in_atomic_block:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(sql, params)
        else:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
        # As save() and bulk_create leave them: stored.
        lead._state.adding = False
        lead._state.db = connection.alias
        event._state.adding = False
        event._state.db = connection.alias

    def reset(self) -> None:
        with self._lock:
            self._built = None


kickoff_statement = KickoffStatement()
