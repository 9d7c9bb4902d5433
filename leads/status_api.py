"""The lead status URL (issue 20): an async view, so that a waiting request holds a coroutine.

Served by the ASGI process (uvicorn, ``config.asgi``) where requests may wait up to
``STATUS_WAIT_MAX_SECONDS``; the sync web server (gunicorn) answers the same URL at once and
never waits, so no worker that accepts leads is ever held by a waiting page. Also the embed
script a form page includes to show the lead's owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from config.errors import error_body
from leads.status import (
    LeadStatusView,
    lead_status_read,
    lead_status_read_pooled,
    status_token_valid,
    status_wait_seconds,
)
from leads.status_wake import status_waiters

_EMBED = Path(__file__).resolve().parent / "embed" / "owner.js"
# Under ASGI the read runs in one of STATUS_READ_THREADS threads, each with one connection kept
# between reads (a waiter holds none); under WSGI in the request's own thread, on its connection.
_readers = ThreadPoolExecutor(
    max_workers=settings.STATUS_READ_THREADS, thread_name_prefix="lead-status-read"
)


async def _read_async(lead_uuid: uuid.UUID) -> LeadStatusView | None:
    return await asyncio.get_running_loop().run_in_executor(
        _readers, lead_status_read_pooled, lead_uuid
    )


_read_in_request_thread = sync_to_async(
    lambda lead_id: lead_status_read(lead_id=lead_id), thread_sensitive=True
)


def _not_found() -> JsonResponse:
    # The same answer for a forged, expired or another lead's token and a lead that is gone.
    return JsonResponse(
        error_body("not_found", "No such status, or its link has expired."), status=404
    )


def _with_cors(response: HttpResponse, request: HttpRequest, origins: tuple[str, ...]) -> None:
    origin = request.headers.get("Origin", "")
    if origin and origin in origins:
        response["Access-Control-Allow-Origin"] = origin
        response["Access-Control-Allow-Methods"] = "GET, OPTIONS"
        response["Access-Control-Max-Age"] = "600"
    response["Vary"] = "Origin"


@require_http_methods(["GET", "HEAD", "OPTIONS"])
async def lead_status(request: HttpRequest, lead_id: str, token: str) -> HttpResponse:
    """The lead's status for the page that submitted it; ``?wait=N`` holds it until the
    outcome or N seconds (clamped to STATUS_WAIT_MAX_SECONDS; at once under WSGI)."""
    lead_uuid = status_token_valid(lead_id=lead_id, token=token, now=timezone.now())
    if lead_uuid is None:
        return _not_found()
    try:
        wait = status_wait_seconds(request.GET.get("wait"))
    except ValueError:
        return JsonResponse(
            error_body("invalid_wait", "wait must be a number of seconds (at most 10)."),
            status=400,
        )
    if not isinstance(request, ASGIRequest):
        view = await _read_in_request_thread(lead_uuid)
    else:
        view = await _status(lead_uuid, wait if request.method == "GET" else 0.0)
    if view is None:
        return _not_found()
    if request.method == "OPTIONS":
        response = HttpResponse(status=204)
    else:
        response = JsonResponse(view.document)
    response["Cache-Control"] = "no-store"
    _with_cors(response, request, view.cors_origins)
    return response


async def _status(lead_uuid: uuid.UUID, wait: float) -> LeadStatusView | None:
    if wait <= 0:
        return await _read_async(lead_uuid)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    woken = status_waiters.register(lead_uuid)
    try:
        await status_waiters.listening(timeout=min(1.0, wait))
        view = await _read_async(lead_uuid)
        if view is None or view.final:
            return view
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken, max(0.0, deadline - loop.time()))
        return await _read_async(lead_uuid)
    finally:
        status_waiters.unregister(lead_uuid, woken)


@cache
def _embed_script() -> bytes:
    return _EMBED.read_bytes()


@require_http_methods(["GET", "HEAD"])
def embed_script(request: HttpRequest) -> HttpResponse:
    """The script a form page includes to show the lead's owner (leads/embed/owner.js)."""
    response = HttpResponse(_embed_script(), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "public, max-age=300"
    response["X-Content-Type-Options"] = "nosniff"
    return response
