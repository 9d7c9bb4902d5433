"""Lock contention is retried at once without using up the lead's attempts."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from django.db import OperationalError, connection, transaction

from config.celery import worker_session_timeouts
from leads.models import Lead, LeadStatus
from routing import services
from routing.decisions import RoutingContention, clear_live_config_cache
from routing.models import Team
from routing.rules_io import rules_import
from routing.services import is_contention, lead_process
from tests.leads.factories import LeadFactory
from tests.routing.test_pipeline import RULES


def _db_error(sqlstate: str) -> OperationalError:
    cause = type("PgError", (Exception,), {"sqlstate": sqlstate})("pg says no")
    error = OperationalError("pg says no")
    error.__cause__ = cause
    return error


def test_contention_is_recognised_by_sqlstate():
    assert is_contention(RoutingContention("x"))
    assert is_contention(_db_error("40P01"))
    assert is_contention(_db_error("55P03"))
    assert is_contention(_db_error("40001"))
    assert not is_contention(_db_error("57014"))  # statement timeout: a real failure
    assert not is_contention(ValueError("x"))


@pytest.mark.django_db
@pytest.mark.parametrize("error", [RoutingContention("busy"), _db_error("40P01")])
def test_contention_is_retried_later_uncounted_then_bounded(monkeypatch, settings, error):
    settings.LEAD_MAX_DEFERRALS = 4
    settings.LEAD_MAX_ATTEMPTS = 2
    lead = LeadFactory()
    sent: list[tuple] = []
    monkeypatch.setattr(
        services, "lead_enqueue_later", lambda lead_id, delay: sent.append((lead_id, delay))
    )

    def contended(*, lead, now, notes=()):  # type: ignore[no-untyped-def]
        raise error

    monkeypatch.setattr(services, "route_lead", contended)
    for _ in range(4):  # put off, not counted, each time later
        assert lead_process(lead_id=lead.id) is None
    lead.refresh_from_db()
    assert (lead.status, lead.attempts, lead.deferrals) == (LeadStatus.RECEIVED, 0, 4)
    delays = [delay for _, delay in sent]
    assert all(b > a for a, b in itertools.pairwise(delays)), delays
    assert lead.last_error.startswith(type(error).__name__)
    # Past the bound, contention counts as a failed attempt, and the attempt bound quarantines.
    for _ in range(2):
        with pytest.raises(type(error)):
            lead_process(lead_id=lead.id)
    assert lead_process(lead_id=lead.id) == LeadStatus.FAILED


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_lock_held_too_long_hands_the_lead_back_instead_of_freezing_the_worker(
    monkeypatch, settings
):
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    sent: list = []
    monkeypatch.setattr(services, "lead_enqueue_later", lambda lead_id, delay: sent.append(lead_id))
    settings.WORKER_DB_LOCK_TIMEOUT_MS = 200
    held = threading.Event()

    def hold_the_team() -> None:
        try:
            with transaction.atomic():
                Team.objects.select_for_update().get(name="EMEA SDR")
                held.set()
                time.sleep(3)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_team)
    holder.start()
    assert held.wait(10)
    worker_session_timeouts(connection=connection)
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "200ms"
    started = time.monotonic()
    assert lead_process(lead_id=lead.id) is None
    assert time.monotonic() - started < 2.5  # cut off at the lock timeout, not after 3 s
    holder.join()
    lead.refresh_from_db()
    assert (lead.status, lead.attempts) == (LeadStatus.RECEIVED, 0)
    assert sent == [lead.id]
    with connection.cursor() as cursor:
        cursor.execute("RESET lock_timeout")
    assert lead_process(lead_id=lead.id) == LeadStatus.ASSIGNED
    assert Lead.objects.get(pk=lead.pk).attempts == 1
    clear_live_config_cache()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_routing_transaction_does_not_block_intake_or_rows_referencing_what_it_locked(
    monkeypatch,
):
    """Routing locks its lead, team and rep FOR NO KEY UPDATE, and never the lead's source.

    A lock on the source (``select_related("source")`` under ``FOR UPDATE`` locks both rows)
    made every intake of that source wait at COMMIT: the new lead's foreign key check takes
    ``FOR KEY SHARE`` on the source row. Under a webinar spike that serialised the intake
    behind the routing workers (bench.spike, 4,000 leads over 30 s: posting took 94.8 s instead
    of 35.6 s). FOR UPDATE on the lead, team or rep would likewise block any row inserted
    meanwhile that refers to them (its foreign key check).
    """
    import leads.services as lead_services
    from leads.services import lead_ingest
    from routing import decisions

    clear_live_config_cache()
    rules_import(RULES, publish=True)
    lead = LeadFactory(raw_payload={"email": "x@acme.com"})
    monkeypatch.setattr(
        lead_services, "leads_enqueue_after_commit", lambda ids, lane=None, **_: None
    )
    inside, release = threading.Event(), threading.Event()
    real_try_owner = decisions._try_owner
    held: list = []

    def assign_then_hold(*args, **kwargs):  # type: ignore[no-untyped-def]
        assignment = real_try_owner(*args, **kwargs)
        held.append(assignment)
        inside.set()  # the lead, its team and the chosen rep are locked; nothing committed
        release.wait(20)
        return assignment

    monkeypatch.setattr(decisions, "_try_owner", assign_then_hold)
    outcome: list[str | None] = []

    def route() -> None:
        try:
            outcome.append(lead_process(lead_id=lead.id))
        finally:
            connection.close()

    router = threading.Thread(target=route)
    router.start()
    waits: dict[str, float] = {}
    try:
        assert inside.wait(20)
        assignment = held[0]
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '3s'")
            # What a foreign key check does for a row inserted meanwhile that refers to these.
            for table, pk in (
                ("leads_lead", lead.pk),
                ("routing_team", assignment.team_id),
                ("routing_rep", assignment.rep_id),
                ("leads_source", lead.source_id),
            ):
                started = time.monotonic()
                cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR KEY SHARE", [pk])  # noqa: S608
                waits[table] = time.monotonic() - started
        started = time.monotonic()
        accepted = lead_ingest(source=lead.source, record={"email": "y@acme.com"})
        waits["intake"] = time.monotonic() - started
    finally:
        release.set()
        router.join(30)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
        clear_live_config_cache()
    assert not router.is_alive()
    # A wait would end in a lock timeout after 3 s; these take milliseconds.
    assert all(seconds < 2.5 for seconds in waits.values()), waits
    assert Lead.objects.get(pk=accepted.lead_id).status == LeadStatus.RECEIVED
    assert outcome == [LeadStatus.ASSIGNED]
