"""Write services of the audit log. The only way events are written."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.utils import timezone

from audit.hashing import HASHED, SEALED, event_hash, event_hash_text, plain_json
from audit.models import ROUTING_CHAIN, Event, EventType
from audit.sealing import event_seal

if TYPE_CHECKING:
    from leads.models import Lead
    from routing.models import Assignment


def _chain_lock(chain: str) -> None:
    """Serialise appends to one chain (PostgreSQL; SQLite serialises all writers)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ["audit:" + chain]
            )


_EVENT_TYPES = frozenset(EventType.values)  # .values builds a new list on every call


def _values(
    *,
    chain: str,
    seq: int,
    prev_hash: str,
    type: str,
    lead_id: uuid.UUID | None,
    at: datetime,
    actor: str,
    rep_id: int | None,
    team_id: int | None,
    rule_id: int | None,
    rep_name: str,
    team_name: str,
    rule_name: str,
    ruleset_version: int | None,
    data: Mapping[str, Any] | None,
    trace: Sequence[Any] | None,
    person_key_id: int | None = None,
) -> dict[str, Any]:
    """An event's column values, sealed and hashed (what ``_build`` makes an Event of)."""
    if type not in _EVENT_TYPES:
        raise ValueError(f"unknown audit event type {type!r}")
    values: dict[str, Any] = {
        "chain": chain,
        "seq": seq,
        "lead_id": lead_id,
        "type": type,
        "at": at,
        "actor": actor[:200],
        "rep_id": rep_id,
        "team_id": team_id,
        "rule_id": rule_id,
        "rep_name": rep_name[:200],
        "team_name": team_name[:200],
        "rule_name": rule_name[:200],
        "ruleset_version": ruleset_version,
        "data": plain_json(dict(data or {})),
        "trace": plain_json(list(trace or [])),
        "prev_hash": prev_hash,
    }
    event_seal(values, person_key_id)
    values["hash"] = event_hash(values)
    return values


def _build(**fields: Any) -> Event:
    return Event(**_values(**fields))


def _person_key_id(lead: Lead | None, lead_id: uuid.UUID | None) -> int | None:
    """The key the lead's personal content is sealed with (set when it was normalised)."""
    if lead is not None:
        return lead.person_key_id
    if lead_id is None:
        return None
    from leads.models import Lead

    return Lead.objects.filter(pk=lead_id).values_list("person_key_id", flat=True).first()


def event_record(
    *,
    type: str,
    lead: Lead | None = None,
    lead_id: uuid.UUID | None = None,
    actor: str = "system",
    at: datetime | None = None,
    rep_id: int | None = None,
    team_id: int | None = None,
    rule_id: int | None = None,
    rep_name: str = "",
    team_name: str = "",
    rule_name: str = "",
    ruleset_version: int | None = None,
    data: Mapping[str, Any] | None = None,
    trace: Sequence[Any] | None = None,
) -> Event:
    """Append one event to its chain (the lead's, else routing's) and return it.

    Call it inside the transaction of the change it records. ``actor`` is ``system``,
    ``user:<username>`` or ``source:<slug>``.
    """
    person_key_id = _person_key_id(lead, lead_id) if data or trace else None
    if lead is not None:
        lead_id = lead.pk
    chain = str(lead_id) if lead_id is not None else ROUTING_CHAIN
    with transaction.atomic():
        _chain_lock(chain)
        last = Event.objects.filter(chain=chain).order_by("-seq").values_list("seq", "hash").first()
        seq, prev_hash = (last[0] + 1, last[1]) if last else (1, "")
        event = _build(
            chain=chain,
            seq=seq,
            prev_hash=prev_hash,
            type=type,
            lead_id=lead_id,
            at=at or timezone.now(),
            actor=actor,
            rep_id=rep_id,
            team_id=team_id,
            rule_id=rule_id,
            rep_name=rep_name,
            team_name=team_name,
            rule_name=rule_name,
            ruleset_version=ruleset_version,
            data=data,
            trace=trace,
            person_key_id=person_key_id,
        )
        event.save(force_insert=True)
    return event


def event_record_for_assignment(
    *,
    type: str,
    assignment: Assignment,
    actor: str = "system",
    at: datetime | None = None,
    data: Mapping[str, Any] | None = None,
    trace: Sequence[Any] | None = None,
) -> Event:
    """An event about an assignment: its lead, rep, team, rule and version, with their names."""
    lead = assignment._state.fields_cache.get("lead")  # loaded already: no query for its key
    return event_record(
        type=type,
        lead=lead,
        lead_id=assignment.lead_id,
        actor=actor,
        at=at,
        rep_id=assignment.rep_id,
        team_id=assignment.team_id,
        rule_id=assignment.rule_id,
        rep_name=assignment.rep_name,
        team_name=assignment.team_name,
        rule_name=assignment.rule_name,
        ruleset_version=assignment.ruleset_version,
        data=data,
        trace=trace,
    )


def events_record_many(items: Sequence[Mapping[str, Any]]) -> list[Event]:
    """Append several events (each given as ``event_record``'s keyword arguments) in a fixed
    number of statements, whatever their number: the chains' locks in one statement (in chain
    order, so two writers of overlapping chains cannot deadlock), their tails in one, and one
    bulk insert. Events of one chain are appended in the order given. Call it inside the
    transaction of the changes they record, like ``event_record``.
    """
    if not items:
        return []
    chains: list[str] = []
    for item in items:
        lead = item.get("lead")
        lead_id = lead.pk if lead is not None else item.get("lead_id")
        chains.append(str(lead_id) if lead_id is not None else ROUTING_CHAIN)
    wanted = sorted(set(chains))
    tails: dict[str, tuple[int, str]] = {}
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0))) FROM "
                "(SELECT k FROM unnest(%s::text[]) AS k ORDER BY k) AS sorted",
                [["audit:" + chain for chain in wanted]],
            )
        rows = (
            Event.objects.filter(chain__in=wanted)
            .order_by("chain", "-seq")
            .distinct("chain")
            .values_list("chain", "seq", "hash")
        )
        tails = {chain: (seq, digest) for chain, seq, digest in rows}
    else:  # SQLite serialises writers; a read a chain
        for chain in wanted:
            last = (
                Event.objects.filter(chain=chain)
                .order_by("-seq")
                .values_list("seq", "hash")
                .first()
            )
            if last is not None:
                tails[chain] = (last[0], last[1])
    events: list[Event] = []
    for item, chain in zip(items, chains, strict=True):
        lead = item.get("lead")
        lead_id = lead.pk if lead is not None else item.get("lead_id")
        data, trace = item.get("data"), item.get("trace")
        person_key_id = _person_key_id(lead, lead_id) if data or trace else None
        seq, prev_hash = tails.get(chain, (0, ""))
        event = _build(
            chain=chain,
            seq=seq + 1,
            prev_hash=prev_hash,
            type=item["type"],
            lead_id=lead_id,
            at=item.get("at") or timezone.now(),
            actor=item.get("actor", "system"),
            rep_id=item.get("rep_id"),
            team_id=item.get("team_id"),
            rule_id=item.get("rule_id"),
            rep_name=item.get("rep_name", ""),
            team_name=item.get("team_name", ""),
            rule_name=item.get("rule_name", ""),
            ruleset_version=item.get("ruleset_version"),
            data=data,
            trace=trace,
            person_key_id=person_key_id,
        )
        tails[chain] = (seq + 1, event.hash)
        events.append(event)
    Event.objects.bulk_create(events, batch_size=500)
    return events


def events_record_received(*, leads: Iterable[Lead], actor: str) -> None:
    """The first event of new leads' chains, in one bulk insert (the kickoff's own transaction).

    A new lead's chain is empty, so there is nothing to read or lock: each starts at 1.
    """
    events = received_events_build(leads=leads, actor=actor)
    if events:
        Event.objects.bulk_create(events, batch_size=500)


def received_event_hashes(*, lead_ids: Sequence[uuid.UUID], at: datetime, actor: str) -> list[str]:
    """The hashes of the ``received`` events that ``received_events_build`` would build for
    leads with these ids received at ``at``, without building them: the canonical text is made
    once, and only the lead's id differs (as chain and lead_id; a UUID needs no JSON escaping).
    """
    marker = uuid.UUID(int=0)
    proto = Event(**received_event_values(lead_id=marker, at=at, actor=actor))
    values = {name: getattr(proto, name) for name in (*HASHED, *SEALED)}
    parts = event_hash_text(values).split(str(marker))
    if len(parts) != 3:  # the marker is elsewhere in the text too (an actor naming it): build each
        return [
            received_event_values(lead_id=lead_id, at=at, actor=actor)["hash"]
            for lead_id in lead_ids
        ]
    head, middle, tail = parts
    return [
        hashlib.sha256(f"{head}{lead_id}{middle}{lead_id}{tail}".encode()).hexdigest()
        for lead_id in map(str, lead_ids)
    ]


def received_events_build(*, leads: Iterable[Lead], actor: str) -> list[Event]:
    """The ``received`` events of new leads, built (hashed) but not stored: what
    ``events_record_received`` inserts."""
    return [
        Event(**received_event_values(lead_id=lead.pk, at=lead.received_at, actor=actor))
        for lead in leads
    ]


def received_event_values(*, lead_id: uuid.UUID, at: datetime, actor: str) -> dict[str, Any]:
    """The column values (hash included) of a new lead's ``received`` event, the first of its
    chain, without building an Event: what the kickoff's single statement writes on PostgreSQL
    (leads.kickoff_sql) and what ``received_events_build`` makes its Events of."""
    return _values(
        chain=str(lead_id),
        seq=1,
        prev_hash="",
        type=EventType.RECEIVED,
        lead_id=lead_id,
        at=at,
        actor=actor,
        rep_id=None,
        team_id=None,
        rule_id=None,
        rep_name="",
        team_name="",
        rule_name="",
        ruleset_version=None,
        data={},
        trace=[],
    )
