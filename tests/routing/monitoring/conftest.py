"""Fixtures for monitoring: an alert webhook on a real local HTTP server, e-mail recipients."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pytest_httpserver import HTTPServer


@pytest.fixture
def alert_hook(httpserver: HTTPServer, settings: Any) -> HTTPServer:
    """``ALERT_WEBHOOK_URL`` pointing at a loopback server that answers 200 (loopback allowed)."""
    httpserver.expect_request("/alerts", method="POST").respond_with_json({"ok": True})
    settings.ALERT_WEBHOOK_URL = httpserver.url_for("/alerts")
    settings.ALERT_ALLOW_PRIVATE_URLS = True
    settings.ALERT_WEBHOOK_FORMAT = "slack"
    settings.ALERT_EMAILS = ["ops@example.com"]
    return httpserver


def hook_bodies(httpserver: HTTPServer) -> list[dict[str, Any]]:
    """The JSON bodies the hook received, in order."""
    return [json.loads(request.get_data()) for request, _ in httpserver.log]


class BreachNotices:
    """The SLA breach notifications check_sla queued (``kwargs`` of each task message)."""

    def __init__(self) -> None:
        self.queued: list[dict[str, Any]] = []
        self.inline = True  # also send each at once, as the delivery worker would
        self.real: Callable[[dict[str, Any]], None] = lambda notice: None  # the real publisher


@pytest.fixture(autouse=True)
def breach_notices(monkeypatch: pytest.MonkeyPatch) -> BreachNotices:
    """Breach notifications go through a task on the ``delivery`` queue; with no worker in these
    tests, each queued notice is captured and (unless a test says otherwise) sent in place."""
    from routing.monitoring import sla as sla_module

    notices = BreachNotices()
    notices.real = sla_module._queue_breach_notice

    def queue(notice: dict[str, Any]) -> None:
        notices.queued.append(notice)
        if notices.inline:
            sla_module.breach_notice_send(**notice)

    monkeypatch.setattr(sla_module, "_queue_breach_notice", queue)
    return notices
