"""Which external services this test run can use."""

from __future__ import annotations

import os
import shutil

from django.conf import settings


def chromium_path() -> str | None:
    """Debian's Chromium (never a Playwright browser download)."""
    candidate = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
    if os.path.exists(candidate):
        return candidate
    return shutil.which("chromium")


def service_missing_reason(kind: str) -> str | None:
    """None when ``kind`` is available, else a sentence saying why it is not."""
    if kind == "postgres":
        if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
            return None
        return "PostgreSQL not configured (set DATABASE_URL=postgres://...)"
    if kind == "redis":
        if os.environ.get("REDIS_URL") or not settings.BROKER_IS_FILESYSTEM:
            return None
        return "Redis not configured (set REDIS_URL=redis://...)"
    if kind == "redis_server":
        if shutil.which("redis-server") is None:
            return "redis-server not installed (Debian package `redis-server`)"
        return None
    if kind == "browser":
        if chromium_path() is None:
            return "Chromium not installed (Debian package `chromium`)"
        return None
    raise ValueError(kind)
