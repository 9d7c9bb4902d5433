"""Fixtures for monitoring: an alert webhook on a real local HTTP server, e-mail recipients."""

from __future__ import annotations

import json
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
