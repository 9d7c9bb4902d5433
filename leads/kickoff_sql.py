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
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection, models, transaction
from django.db.models.fields import AutoFieldMixin
from django.utils import timezone

from audit.models import Event
from leads.models import Lead

# Set per lead by the kickoff (leads.services); the rest are the fields' defaults.
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
# Set per event for a `received` event (audit.services.received_event_values); the rest are
# the same for every received event (the function's constants).
EVENT_VARYING = ("chain", "lead", "at", "actor", "hash")


# The Python types each column type's get_db_prep_save passes through unchanged (PostgreSQL).
_PLAIN: dict[str, tuple[type, ...]] = {
    "CharField": (str,),
    "TextField": (str,),
    "UUIDField": (uuid.UUID,),
    "DateTimeField": (datetime,),
    "ForeignKey": (int,),
    "BigAutoField": (int,),
    "BigIntegerField": (int,),
    "IntegerField": (int,),
    "PositiveIntegerField": (int,),
}


class _Columns:
    """One table's INSERT: its columns, the varying ones as placeholders, the rest literals."""

    def __init__(self, model: type[models.Model], varying: Sequence[str], prototype: Any) -> None:
        self.varying: list[models.Field[Any, Any]] = []
        for name in varying:
            field = model._meta.get_field(name)
            if not isinstance(field, models.Field):
                raise TypeError(f"{model.__name__}.{name} is not a column")
            self.varying.append(field)
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
            prepared = field.get_db_prep_save(value, connection)
            if prepared is None:
                continue  # NULL: the column's own default
            columns.append(quote(str(field.column)))
            values.append(connection.ops.compose_sql("%s", [prepared]))  # type: ignore[attr-defined]
        self.columns = [quote(str(field.column)) for field in self.varying] + columns
        self._plain = [(field, _PLAIN.get(field.get_internal_type(), ())) for field in self.varying]
        self.values = ["%s"] * len(self.varying) + values

    def params(self, values: dict[str, Any], skip: str = "") -> list[Any]:
        """The varying columns' parameters from ``values`` (by attname), ``skip`` left out.

        A value the field's ``get_db_prep_save`` would hand to the driver unchanged on
        PostgreSQL (a string, an int, a UUID for a uuid column, an aware datetime for a
        timestamp, None) is passed as it is; anything else (the JSON payload) goes through it."""
        params = []
        for field, plain in self._plain:
            if field.attname == skip:
                continue
            value = values[field.attname]
            if value is None or (type(value) in plain and getattr(value, "tzinfo", True)):
                params.append(value)
            else:
                params.append(field.get_db_prep_save(value, connection))
        return params


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

    @staticmethod
    def available() -> bool:
        """Whether the kickoff can use the statement (PostgreSQL; else the ORM writes)."""
        return connection.vendor == "postgresql"

    def insert(
        self,
        *,
        lead_id: uuid.UUID,
        source_id: int,
        lane: str,
        raw_payload: Any,
        idempotency_key: str | None,
        request_fingerprint: str,
        received_at: datetime,
        actor: str,
    ) -> None:
        """Insert a new lead and its ``received`` event in one statement (committed by it,
        outside a transaction).

        No model instance is built: the lead's values are the kickoff's, its event's those of
        ``audit.services.received_event_values`` (hashed as every received event is); every
        other column is the statement's constant."""
        from audit.services import received_event_values

        sql, lead_columns, event_columns = self._build()
        lead_values = {
            "id": lead_id,
            "source_id": source_id,
            "lane": lane,
            "raw_payload": raw_payload,
            "idempotency_key": idempotency_key,
            "request_fingerprint": request_fingerprint,
            "received_at": received_at,
            "queued_at": received_at,
        }
        event_values = received_event_values(lead_id=lead_id, at=received_at, actor=actor)
        params = lead_columns.params(lead_values) + event_columns.params(
            event_values, skip="lead_id"
        )
        if connection.in_atomic_block:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(sql, params)
        else:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)

    def reset(self) -> None:
        with self._lock:
            self._built = None


kickoff_statement = KickoffStatement()
