"""Liveness and readiness probes for orchestrators and load balancers."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

from config.celery import app as celery_app
from config.errors import error_body
from config.staticfiles import manifest_missing, missing_message

logger = logging.getLogger(__name__)


def _method_not_allowed() -> JsonResponse:
    response = JsonResponse(error_body("method_not_allowed", "Use GET or HEAD."), status=405)
    response["Allow"] = "GET, HEAD"
    return response


@csrf_exempt
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """200 while the process lives and can answer HTTP; checks nothing else on purpose."""
    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed()
    return JsonResponse({"status": "ok"})


def check_database() -> None:
    """Raise unless the database answers a trivial query."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def check_broker() -> None:
    """Raise unless the Celery broker accepts a connection (and, for Redis, answers PING)."""
    timeout = settings.READYZ_BROKER_TIMEOUT_SECONDS
    with celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout)
        channel = conn.default_channel
        client = getattr(channel, "client", None)
        if client is not None and hasattr(client, "ping"):
            client.ping()


class StaticFilesNotCollected(RuntimeError):
    """``collectstatic`` did not run into ``STATIC_ROOT``: pages render without their styles."""


def check_static() -> None:
    """Raise unless the static files were collected (when the storage needs a manifest)."""
    path = manifest_missing()
    if path is not None:
        raise StaticFilesNotCollected(missing_message(path))


@csrf_exempt
@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the database and the broker answer and static files are collected; else 503."""
    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed()
    checks: dict[str, str] = {}
    failed: list[str] = []
    for name, check in (
        ("database", check_database),
        ("broker", check_broker),
        ("static", check_static),
    ):
        try:
            check()
        except Exception as exc:  # any failure means "not ready"; the reason goes in the body
            logger.warning("readiness check %s failed: %s", name, exc)
            checks[name] = f"error: {type(exc).__name__}: {exc}"[:300]
            failed.append(name)
        else:
            checks[name] = "ok"
    if failed:
        body = error_body("not_ready", f"Not ready: {', '.join(failed)} unavailable.")
        body["checks"] = checks
        response = JsonResponse(body, status=503)
        response["Retry-After"] = "5"
        return response
    return JsonResponse({"status": "ok", "checks": checks})
