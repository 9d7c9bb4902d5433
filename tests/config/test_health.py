import pytest
from django.db import OperationalError
from kombu import Connection

from config import health
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db


def test_healthz_answers_while_the_process_lives(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_200_when_database_and_broker_answer(client):
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "status": "ok",
        "checks": {"database": "ok", "broker": "ok", "static": "ok"},
    }


def test_readyz_is_503_naming_the_broker_when_it_is_down(client, monkeypatch):
    # A real connection attempt to a port where nothing listens: the broker is down.
    dead = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setattr(
        health.celery_app,
        "connection_for_write",
        lambda: Connection(dead, transport_options={"socket_connect_timeout": 0.5}),
    )
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["error"]["code"] == "not_ready"
    assert "broker" in body["error"]["message"]
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"].startswith("error:")
    assert response["Retry-After"]


def test_readyz_is_503_naming_the_database_when_it_fails(client, monkeypatch):
    def broken() -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr(health, "check_database", broken)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"] == {
        "database": "error: OperationalError: connection refused",
        "broker": "ok",
        "static": "ok",
    }


def test_probes_answer_head_and_refuse_other_methods_in_json(client):
    assert client.head("/healthz").status_code == 200
    assert client.head("/readyz").status_code == 200
    for url in ("/healthz", "/readyz"):
        response = client.post(url)
        assert response.status_code == 405
        assert response.json()["error"]["code"] == "method_not_allowed"


def test_csrf_failures_on_json_paths_are_json(settings):
    from django.test import RequestFactory

    from config.errors import csrf_failure

    assert settings.CSRF_FAILURE_VIEW == "config.errors.csrf_failure"
    response = csrf_failure(RequestFactory().post("/api/v1/anything/"), reason="no token")
    assert response.status_code == 403
    assert response["Content-Type"] == "application/json"
    page = csrf_failure(RequestFactory().post("/admin/login/"), reason="no token")
    assert "text/html" in page["Content-Type"]
