"""The reliability settings are the product's promises: pin them."""

import pytest
from django.conf import settings
from django.db import connection

from config.celery import app


def test_celery_is_configured_for_at_least_once_delivery():
    conf = app.conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_serializer == "json"
    assert conf.accept_content == ["json"]
    assert conf.task_ignore_result is True
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is True
    assert conf.task_soft_time_limit < conf.task_time_limit
    # Celery's Django fixup reads this key to stop closing the connection around every task.
    assert conf.get("CELERY_DB_REUSE_MAX") >= 100


def test_visibility_timeout_is_at_least_twice_the_time_limit():
    assert settings.CELERY_VISIBILITY_TIMEOUT >= 2 * settings.CELERY_TASK_TIME_LIMIT
    if not settings.BROKER_IS_FILESYSTEM:
        options = app.conf.broker_transport_options
        assert options["visibility_timeout"] == settings.CELERY_VISIBILITY_TIMEOUT
        assert options["socket_connect_timeout"] <= 5


def test_every_task_routes_to_a_declared_queue():
    declared = {q.name for q in app.conf.task_queues}
    assert declared == {
        "routing.realtime",
        "routing",
        "routing.bulk",
        "enrichment.realtime",
        "enrichment",
        "crm.realtime",
        "crm",
        "delivery",
        "maintenance",
    }
    app.loader.import_default_modules()
    for name in app.tasks:
        if name.startswith("celery."):
            continue
        route = app.amqp.router.route({}, name)
        assert route["queue"].name in declared, name


def test_beat_sends_a_heartbeat_into_every_queue():
    queues = {
        entry["options"]["queue"]
        for entry in settings.CELERY_BEAT_SCHEDULE.values()
        if entry["task"] == "maintenance.heartbeat"
    }
    assert queues == {q.name for q in app.conf.task_queues}


@pytest.mark.django_db
def test_sqlite_runs_in_wal_mode_with_immediate_transactions():
    if not settings.IS_SQLITE:
        pytest.skip("PostgreSQL run: SQLite pragmas do not apply")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] >= 5000
    assert settings.DATABASES["default"]["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


def test_postgres_keeps_connections():
    if settings.IS_SQLITE:
        pytest.skip("SQLite run")
    assert settings.DATABASES["default"]["CONN_MAX_AGE"] > 0
    assert settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] is True


@pytest.mark.django_db(transaction=True)
def test_a_worker_drops_a_broken_database_connection_around_each_task(monkeypatch):
    """Celery reuses connections across tasks; one that broke (database restarted) must not
    fail every later task of the process (found by the PostgreSQL outage fault test)."""
    from config.celery import drop_broken_db_connections

    connection.ensure_connection()
    # A persistent connection (CONN_MAX_AGE None; the SQLite default of 0 closes after every
    # task, as after every request, which is what obsolete means there).
    monkeypatch.setattr(connection, "close_at", None)
    healthy = connection.connection
    drop_broken_db_connections(task=None)
    assert connection.connection is healthy  # a healthy connection is kept (no reconnect)

    connection.errors_occurred = True
    monkeypatch.setattr(connection, "is_usable", lambda: False)
    drop_broken_db_connections(task=None)
    assert connection.connection is None  # closed: the next query reconnects
    monkeypatch.undo()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
