"""Middleware that only pages need, skipped for the intake URLs (issue 18).

A source's intake request is machine to machine: no session, no user, no page time zone, no
messages, no static file. Run on
every request, those cost about as much as a bare DRF view's whole work, on the path that must
accept a spike at its own rate. Each class here wraps one such middleware and passes requests for
``INTAKE_PREFIX`` straight on; every other request gets the wrapped middleware unchanged.
SecurityMiddleware, CommonMiddleware (allowed hosts, trailing slashes), CSRF (a no-op for the
exempt intake views; Django's deploy checks look for it by name), frame options and the
database-down answer still run for intake. The settings name these classes (PAGES_ONLY there).

Only in the WSGI web process: the status process (ASGI) keeps only async-capable middleware
(config.settings.base), and these wrappers are sync-only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string
from whitenoise.middleware import WhiteNoiseMiddleware

from audit.timezones import UserTimeZoneMiddleware

INTAKE_PREFIX = "/api/v1/intake/"


class PagesOnly:
    """Runs ``wrapped`` for every request but the intake's."""

    wrapped = ""
    sync_capable = True
    async_capable = False

    get_response: Any

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.inner = import_string(self.wrapped)(get_response)
        if hasattr(self.inner, "process_view"):
            self.process_view = self._process_view

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info.startswith(INTAKE_PREFIX):
            return self.get_response(request)
        return self.inner(request)

    def _process_view(
        self, request: HttpRequest, view: Any, args: Any, kwargs: Any
    ) -> HttpResponse | None:
        if request.path_info.startswith(INTAKE_PREFIX):
            return None
        return self.inner.process_view(request, view, args, kwargs)


# Subclasses of what they wrap, so Django's checks (admin.E408-E410) still find them.
class WhiteNoise(PagesOnly, WhiteNoiseMiddleware):
    wrapped = "whitenoise.middleware.WhiteNoiseMiddleware"


class Session(PagesOnly, SessionMiddleware):
    wrapped = "django.contrib.sessions.middleware.SessionMiddleware"


class Authentication(PagesOnly, AuthenticationMiddleware):
    wrapped = "django.contrib.auth.middleware.AuthenticationMiddleware"


class UserTimeZone(PagesOnly, UserTimeZoneMiddleware):
    wrapped = "audit.timezones.UserTimeZoneMiddleware"


class Messages(PagesOnly, MessageMiddleware):
    wrapped = "django.contrib.messages.middleware.MessageMiddleware"
