"""GET /api/v1/alerts/ (api.md "Alerts")."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

from routing.monitoring.alerts import alert_raise, alert_resolve

pytestmark = pytest.mark.django_db


def _client(client: Client, *perms: str) -> Client:
    user = User.objects.create_user("ops", password="pw")
    for perm in perms:
        user.user_permissions.add(Permission.objects.get(codename=perm))
    client.defaults["HTTP_AUTHORIZATION"] = f"Token {Token.objects.create(user=user).key}"
    return client


@pytest.fixture
def alerts() -> None:
    alert_raise(kind="backlog", subject="pipeline", message="700 leads waiting")
    alert_raise(kind="worker", subject="routing", message="no worker")
    alert_resolve(kind="worker", subject="routing")


def test_lists_alerts_in_the_contract_shape(client: Client, alerts: None) -> None:
    response = _client(client, "view_alert").get("/api/v1/alerts/")
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 2
    kinds = {item["kind"]: item for item in body["results"]}
    backlog = kinds["backlog"]
    assert {"id", "kind", "status", "message", "opened_at", "resolved_at"} <= set(backlog)
    assert backlog["status"] == "open"
    assert backlog["resolved_at"] is None
    assert backlog["message"] == "700 leads waiting"
    assert kinds["worker"]["status"] == "resolved"
    assert kinds["worker"]["resolved_at"] is not None


@pytest.mark.parametrize(("status", "kinds"), [("open", ["backlog"]), ("resolved", ["worker"])])
def test_filters_by_status(client: Client, alerts: None, status: str, kinds: list[str]) -> None:
    response = _client(client, "view_alert").get(f"/api/v1/alerts/?status={status}")
    assert [item["kind"] for item in response.json()["results"]] == kinds


def test_a_bad_filter_is_a_json_400(client: Client) -> None:
    response = _client(client, "view_alert").get("/api/v1/alerts/?status=closed")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_filter"
    assert "status" in error["fields"]


def test_pages(client: Client, settings: Any) -> None:
    now = timezone.now()
    for i in range(55):
        alert_raise(kind="sla", subject=f"assignment:{i}", message="m", now=now)
    body = _client(client, "view_alert").get("/api/v1/alerts/?status=open").json()
    assert body["count"] == 55
    assert len(body["results"]) == 50
    assert body["next"]


def test_needs_login_and_the_view_alert_permission(client: Client) -> None:
    response = client.get("/api/v1/alerts/")
    assert response.status_code == 401
    assert response.json()["error"]["code"]
    response = _client(client, "view_lead").get("/api/v1/alerts/")
    assert response.status_code == 403
    assert response.json()["error"]["code"]
