"""Which time zone a page shows its times in: the user's own, else the browser's, else the server's.

The browser's zone reaches the server as a cookie (``TZ_COOKIE``) set by ``audit/tz.js`` from
``Intl.DateTimeFormat().resolvedOptions().timeZone``; a name Python's zoneinfo does not know is
ignored, never an error. ``UserTimeZoneMiddleware`` activates the zone for the request, so every
``|date`` in a template and every ``timezone.localtime()`` in a selector uses it; the chosen
zone and where it came from are on ``request.page_zone``.
"""

from __future__ import annotations

import functools
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

TZ_COOKIE = "lr_tz"
ZONE_MAX_LENGTH = 64


class ZoneSource:
    USER = "user"  # the user chose it on the settings page
    BROWSER = "browser"  # the browser's, from the cookie
    SERVER = "server"  # settings.PAGES_TIME_ZONE


@dataclass(frozen=True)
class PageZone:
    zone: zoneinfo.ZoneInfo
    source: str

    @property
    def name(self) -> str:
        return self.zone.key

    def abbreviation(self, at: datetime | None = None) -> str:
        """The zone's abbreviation at ``at`` (now by default): CET or CEST, IST, UTC."""
        return (at or timezone.now()).astimezone(self.zone).tzname() or self.zone.key


@functools.cache
def zone_names() -> tuple[str, ...]:
    """Every zone name zoneinfo knows, sorted (the settings page's choices)."""
    return tuple(sorted(zoneinfo.available_timezones()))


def zone_parse(value: Any) -> zoneinfo.ZoneInfo | None:
    """``value`` as a zone, or None when it is not the name of one (never raises)."""
    if not isinstance(value, str) or not value or len(value) > ZONE_MAX_LENGTH:
        return None
    if value not in _known():
        return None
    return zoneinfo.ZoneInfo(value)


@functools.cache
def _known() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def server_zone() -> zoneinfo.ZoneInfo:
    return zone_parse(settings.PAGES_TIME_ZONE) or zoneinfo.ZoneInfo("UTC")


def user_zone_name(user: Any) -> str:
    """The zone ``user`` chose ("" when none, or for an anonymous user)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return ""
    from audit.models import UserSettings

    found = UserSettings.objects.filter(user_id=user.pk).values_list("time_zone", flat=True)
    return next(iter(found), "") or ""


def page_zone_resolve(*, user_choice: str, cookie: str | None) -> PageZone:
    """The user's choice when it is a zone, else the browser's (the cookie), else the server's."""
    chosen = zone_parse(user_choice)
    if chosen is not None:
        return PageZone(chosen, ZoneSource.USER)
    browser = zone_parse(unquote(cookie) if cookie else cookie)
    if browser is not None:
        return PageZone(browser, ZoneSource.BROWSER)
    return PageZone(server_zone(), ZoneSource.SERVER)


def user_zone_set(*, user: Any, name: str) -> str:
    """Save ``user``'s choice ("" = follow the browser); returns it. Raises ValueError for a
    name that is not a zone."""
    from audit.models import UserSettings

    name = (name or "").strip()
    if name and zone_parse(name) is None:
        raise ValueError(f'unknown time zone "{name[:ZONE_MAX_LENGTH]}"')
    UserSettings.objects.update_or_create(user_id=user.pk, defaults={"time_zone": name})
    return name


class UserTimeZoneMiddleware:
    """Activate the page's zone for the request (after AuthenticationMiddleware)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # Only pages rendered for a logged-in user need it; the API and intake answer in UTC
        # (ISO 8601 with an offset), so they skip the settings query.
        if request.path.startswith(_NOT_PAGES):
            return self.get_response(request)
        page_zone = page_zone_resolve(
            user_choice=user_zone_name(getattr(request, "user", None)),
            cookie=request.COOKIES.get(TZ_COOKIE),
        )
        request.page_zone = page_zone  # type: ignore[attr-defined]
        timezone.activate(page_zone.zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


_NOT_PAGES = ("/api/", "/metrics", "/healthz", "/readyz", "/static/", "/embed/")


def local_words(at: datetime, *, seconds: bool = True) -> str:
    """``at`` in the page's (the active) zone, its abbreviation named: 2026-03-30 09:00:05 CEST."""
    local = timezone.localtime(at)
    text = f"{local:%Y-%m-%d %H:%M:%S}" if seconds else f"{local:%Y-%m-%d %H:%M}"
    return f"{text} {local.tzname() or local.tzinfo}"
