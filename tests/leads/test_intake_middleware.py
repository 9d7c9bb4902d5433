"""The intake URLs skip the middleware only pages need (config.pages_only, issue 18)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.test import Client

from tests.leads.conftest import auth

SKIPPED = (SessionMiddleware, AuthenticationMiddleware, MessageMiddleware)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counted: dict[str, int] = {}
    for cls in SKIPPED:
        original = cls.process_request

        def spy(self: Any, request: Any, _original: Any = original, _name: str = cls.__name__):
            counted[_name] = counted.get(_name, 0) + 1
            return _original(self, request)

        monkeypatch.setattr(cls, "process_request", spy)
    return counted


def test_the_web_process_wraps_the_page_only_middleware() -> None:
    assert "config.pages_only.Session" in settings.MIDDLEWARE
    assert "django.contrib.sessions.middleware.SessionMiddleware" not in settings.MIDDLEWARE
    # What must run for intake too is not wrapped.
    for kept in (
        "django.middleware.security.SecurityMiddleware",
        "config.errors.DatabaseUnavailableMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
    ):
        assert kept in settings.MIDDLEWARE


@pytest.mark.django_db
def test_an_intake_request_skips_sessions_users_and_messages(source, published, calls) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    response = client.post(
        "/api/v1/intake/webform/", {"email": "ana@acme.com"}, "application/json", **auth()
    )
    assert response.status_code == 202, response.content
    assert calls == {}
    # Security headers still come from SecurityMiddleware.
    assert response["X-Content-Type-Options"] == "nosniff"
    # A page still gets all of them.
    client.get("/admin/login/")
    assert set(calls) == {cls.__name__ for cls in SKIPPED}


@pytest.mark.django_db
def test_bad_hosts_and_missing_sources_are_still_answered_as_before(source, published) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    response = client.post(
        "/api/v1/intake/nope/", {"email": "ana@acme.com"}, "application/json", **auth()
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "source_not_found"
    response = client.post(
        "/api/v1/intake/webform/",
        {"email": "ana@acme.com"},
        "application/json",
        HTTP_HOST="evil.example",
        **auth(),
    )
    assert response.status_code == 400  # CommonMiddleware's host check still runs
