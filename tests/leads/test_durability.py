"""The lead row is the outbox: a broker outage delays leads, never loses them."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import timedelta

import pytest
from celery import Celery

from config.celery import app as real_app
from leads import services
from leads.models import Lead, LeadStatus
from leads.services import leads_requeue_stale
from tests.leads.conftest import auth
from tests.support.processes import celery_worker, free_port, wait_until

URL = "/api/v1/intake/webform/"


def _app_with_broker(url: str, timeout: float = 1) -> Celery:
    app = Celery("broken", set_as_current=False)
    app.conf.update(
        broker_url=url,
        broker_transport_options={"socket_connect_timeout": timeout, "socket_timeout": timeout},
        broker_connection_timeout=timeout,
        task_routes=real_app.conf.task_routes,
        task_queues=real_app.conf.task_queues,
    )
    return app


def _post(client, email):
    return client.post(
        URL, data=json.dumps({"email": email}), content_type="application/json", **auth()
    )


@pytest.fixture(autouse=True)
def _closed_breaker():
    """Each test starts with the broker breaker closed: one test's outage must not pause the
    next test's publishing (it did, in CI, after a failed hung-broker test)."""
    services.broker_breaker.reset()
    yield
    services.broker_breaker.reset()


@pytest.fixture
def hung_broker():
    """A TCP server that accepts connections and never answers: a paused Redis."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("broker", ["down", "hung"])
def test_intake_answers_202_quickly_while_the_broker_is_down(
    client, source, monkeypatch, broker, hung_broker
):
    url = f"redis://127.0.0.1:{free_port()}/0" if broker == "down" else hung_broker
    monkeypatch.setattr(services, "celery_app", _app_with_broker(url))
    timings = []
    for i in range(5):
        started = time.monotonic()
        response = _post(client, f"p{i}@example.com")
        timings.append(time.monotonic() - started)
        assert response.status_code == 202, response.content
    assert Lead.objects.filter(status=LeadStatus.RECEIVED).count() == 5
    # The first request pays at most the connect/socket timeout; the breaker spares the rest.
    assert timings[0] < 5, timings
    assert max(timings[1:]) < 0.5, timings


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_leads_accepted_during_an_outage_are_processed_once_the_broker_is_back(
    client, source, monkeypatch
):
    with monkeypatch.context() as patch:
        patch.setattr(
            services, "celery_app", _app_with_broker(f"redis://127.0.0.1:{free_port()}/0")
        )
        ids = [_post(client, f"p{i}@example.com").json()["id"] for i in range(3)]
    services.broker_breaker.reset()
    assert leads_requeue_stale(older_than=timedelta(0)) == 3
    with celery_worker() as worker:
        wait_until(
            lambda: (
                not Lead.objects.filter(
                    id__in=ids, status__in=[LeadStatus.RECEIVED, LeadStatus.PROCESSING]
                ).exists()
            ),
            timeout=60,
            message=lambda: f"leads not processed:\n{worker.text()[-3000:]}",
        )
    for lead in Lead.objects.filter(id__in=ids):
        assert lead.status == LeadStatus.UNASSIGNED
        assert lead.email.endswith("@example.com")
        assert lead.attempts == 1
        assert lead.processed_at is not None


@pytest.mark.django_db
def test_requeue_stale_only_takes_old_waiting_leads_in_bounded_batches(
    source, published, django_capture_on_commit_callbacks
):
    from django.utils import timezone

    from tests.leads.factories import LeadFactory

    old = timezone.now() - timedelta(minutes=10)
    waiting = [LeadFactory(source=source, received_at=old) for _ in range(5)]
    LeadFactory(source=source)  # fresh
    LeadFactory(source=source, received_at=old, status=LeadStatus.ASSIGNED)
    with django_capture_on_commit_callbacks(execute=True):
        assert (
            leads_requeue_stale(older_than=timedelta(minutes=2), batch_size=2, max_batches=2) == 4
        )
        assert leads_requeue_stale(older_than=timedelta(minutes=2), batch_size=2) == 1
    # Each was stamped when re-enqueued: not again until another period has passed.
    assert leads_requeue_stale(older_than=timedelta(minutes=2)) == 0
    assert sorted(published) == sorted(str(lead.id) for lead in waiting)


@pytest.mark.django_db
def test_requeue_stale_leaves_a_lead_just_rerouted_alone(source, published):
    """Its wait is counted from when it was queued again, not from when it was received."""
    from django.utils import timezone

    from routing.services import lead_reroute
    from tests.leads.factories import LeadFactory

    old = timezone.now() - timedelta(hours=2)
    lead = LeadFactory(source=source, received_at=old, status=LeadStatus.UNASSIGNED)
    lead_reroute(lead_id=lead.id, actor="system")
    published.clear()
    assert leads_requeue_stale(older_than=timedelta(minutes=2)) == 0
    assert published == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_sweepers_never_enqueue_a_lead_twice(source, published):
    from django.db import connection
    from django.utils import timezone

    from tests.leads.factories import LeadFactory

    old = timezone.now() - timedelta(minutes=10)
    Lead.objects.bulk_create(
        [LeadFactory.build(source=source, received_at=old) for _ in range(300)]
    )
    barrier = threading.Barrier(4)

    def sweep() -> None:
        barrier.wait()
        try:
            leads_requeue_stale(older_than=timedelta(minutes=2), batch_size=25)
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(published) == 300
    assert len(set(published)) == 300


@pytest.mark.django_db
def test_a_sweep_whose_publish_was_skipped_stamps_nothing(source, published):
    from django.utils import timezone

    from tests.leads.factories import LeadFactory

    old = timezone.now() - timedelta(minutes=10)
    leads = [LeadFactory(source=source, received_at=old) for _ in range(3)]
    services.broker_breaker.trip(60)
    assert leads_requeue_stale(older_than=timedelta(minutes=2)) == 0
    assert not Lead.objects.filter(requeued_at__isnull=False).exists()
    services.broker_breaker.reset()
    assert leads_requeue_stale(older_than=timedelta(minutes=2)) == 3
    assert sorted(published) == sorted(str(lead.id) for lead in leads)


@pytest.mark.django_db
def test_the_sweeper_requeues_leads_whose_lease_expired(published):
    from datetime import timedelta

    from django.utils import timezone

    from tests.leads.factories import LeadFactory

    leased = LeadFactory(
        status=LeadStatus.PROCESSING, claimed_until=timezone.now() + timedelta(minutes=1)
    )
    expired = LeadFactory(
        status=LeadStatus.PROCESSING, claimed_until=timezone.now() - timedelta(seconds=5)
    )
    assert leads_requeue_stale(older_than=timedelta(minutes=2)) == 1
    assert published == [str(expired.id)]
    assert leased.id not in published


@pytest.mark.django_db(transaction=True)
def test_in_background_mode_no_request_waits_on_a_hung_broker(
    client, source, monkeypatch, settings, hung_broker
):
    settings.ENQUEUE_IN_BACKGROUND = True
    # The broker's timeouts are 3 s: a request that waited on it would take 3 s or more, so a
    # bound of a third of that tells waiting from a slow machine (CI runs two lanes at once).
    monkeypatch.setattr(services, "celery_app", _app_with_broker(hung_broker, timeout=3))
    timings = []
    try:
        for i in range(5):
            started = time.monotonic()
            response = _post(client, f"p{i}@example.com")
            timings.append(time.monotonic() - started)
            assert response.status_code == 202
        assert max(timings) < 1.0, timings  # the first request too: the thread pays the timeout
    finally:
        # Before the hung broker closes: the thread must not carry this test's work into
        # the next one.
        assert services.publisher.flush(timeout=30)
    assert Lead.objects.filter(status=LeadStatus.RECEIVED).count() == 5


@pytest.mark.django_db(transaction=True)
def test_background_publishing_delivers_after_commit(client, source, published, settings):
    settings.ENQUEUE_IN_BACKGROUND = True
    lead_id = _post(client, "a@example.com").json()["id"]
    assert services.publisher.flush(timeout=5)
    assert published == [lead_id]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_transaction_holding_the_source_row_does_not_hide_its_leads_from_the_sweeper(
    source, published
):
    """The sweeper locks the stale lead rows only (``FOR UPDATE OF``), not the source it joins
    for the intake priority: an admin saving that source, or another sweeper's batch, must not
    make every lead of the source look locked (CI saw four concurrent sweepers publish 25 of 300:
    the first batch's source lock made the others skip everything and stop)."""
    from django.db import connections, transaction
    from django.utils import timezone

    from leads.models import Source
    from tests.leads.factories import LeadFactory

    old = timezone.now() - timedelta(minutes=10)
    Lead.objects.bulk_create([LeadFactory.build(source=source, received_at=old) for _ in range(5)])
    held = threading.Event()
    release = threading.Event()

    def hold_source() -> None:
        try:
            with transaction.atomic():
                Source.objects.select_for_update().get(pk=source.pk)
                held.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_source)
    holder.start()
    try:
        assert held.wait(10)
        assert leads_requeue_stale(older_than=timedelta(minutes=2)) == 5
    finally:
        release.set()
        holder.join()
    assert len(set(published)) == 5
