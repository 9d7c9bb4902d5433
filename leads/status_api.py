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
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

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


class _Reads:
    """The status process's lead reads, each in one of ``STATUS_READ_THREADS`` threads, and
    shared: requests that want a lead read no earlier than a moment join a read of that lead
    started at or after it instead of starting their own (1,000 pages woken for one lead, or
    answered at the same second, make one read, not 1,000)."""

    def __init__(self) -> None:
        self._inflight: dict[uuid.UUID, tuple[float, asyncio.Future[LeadStatusView | None]]] = {}

    async def read(self, lead_uuid: uuid.UUID, not_before: float) -> LeadStatusView | None:
        """The lead's status, read at or after ``not_before`` (the event loop's clock)."""
        loop = asyncio.get_running_loop()
        current = self._inflight.get(lead_uuid)
        if current is not None and current[0] >= not_before and current[1].get_loop() is loop:
            return await asyncio.shield(current[1])
        future = loop.run_in_executor(_readers, lead_status_read_pooled, lead_uuid)
        entry = (loop.time(), future)
        self._inflight[lead_uuid] = entry

        def _done(_: object) -> None:
            if self._inflight.get(lead_uuid) is entry:
                del self._inflight[lead_uuid]

        future.add_done_callback(_done)
        return await asyncio.shield(future)


_reads = _Reads()


_read_in_request_thread = sync_to_async(
    lambda lead_id: lead_status_read(lead_id=lead_id), thread_sensitive=True
)


@dataclass(frozen=True)
class StatusAnswer:
    """What a status request is answered: its HTTP status, JSON document (None: no body) and
    headers. Built once for both servers of the URL (the Django view, the ASGI fast path)."""

    status: int
    document: dict[str, Any] | None
    headers: dict[str, str]


# On the URL's errors (a 404, a bad wait): never cached, and readable by a script on any origin,
# so the form page's script can tell an expired link (fallback at once) from a network failure
# (ask again). It tells a page nothing that requesting the URL outside a browser would not: the
# URL reads no cookie, and every 404 is the same whatever its cause.
_ERROR_HEADERS = {"Cache-Control": "no-store", "Access-Control-Allow-Origin": "*"}


def _not_found() -> StatusAnswer:
    # The same answer for a forged, expired or another lead's token and a lead that is gone.
    return StatusAnswer(
        404, error_body("not_found", "No such status, or its link has expired."), _ERROR_HEADERS
    )


STATUS_METHODS = ("GET", "HEAD", "OPTIONS")
EMBED_METHODS = ("GET", "HEAD")


def _not_allowed(request: HttpRequest, methods: tuple[str, ...]) -> HttpResponse:
    # The API's 405 (not Django's empty one): these URLs are read by scripts, which want JSON.
    allow = ", ".join(methods)
    response = JsonResponse(
        error_body("method_not_allowed", f"{request.method} is not served here; use {allow}."),
        status=405,
    )
    response["Allow"] = allow
    return response


def _cors_headers(origin: str, origins: tuple[str, ...]) -> dict[str, str]:
    headers = {"Vary": "Origin"}
    if origin and origin in origins:
        headers["Access-Control-Allow-Origin"] = origin
        headers["Access-Control-Allow-Methods"] = "GET, OPTIONS"
        headers["Access-Control-Max-Age"] = "600"
    return headers


async def lead_status_answer(
    *, method: str, lead_id: str, token: str, wait: str | None, origin: str, can_wait: bool
) -> StatusAnswer:
    """The answer to ``method`` (GET, HEAD or OPTIONS) on a lead's status URL.

    ``wait``: the raw ``?wait=`` (clamped to STATUS_WAIT_MAX_SECONDS); honoured only when
    ``can_wait`` (the ASGI process), else the lead is read at once in the request's thread."""
    lead_uuid = status_token_valid(lead_id=lead_id, token=token, now=timezone.now())
    if lead_uuid is None:
        return _not_found()
    try:
        seconds = status_wait_seconds(wait)
    except ValueError:
        return StatusAnswer(
            400,
            error_body("invalid_wait", "wait must be a number of seconds (at most 10)."),
            _ERROR_HEADERS,
        )
    if not can_wait:
        view = await _read_in_request_thread(lead_uuid)
    else:
        view = await _status(lead_uuid, seconds if method == "GET" else 0.0)
    if view is None:
        return _not_found()
    headers = {"Cache-Control": "no-store", **_cors_headers(origin, view.cors_origins)}
    if method == "OPTIONS":
        return StatusAnswer(204, None, headers)
    return StatusAnswer(200, view.document, headers)


@csrf_exempt  # no cookie or session is read: a write is a 405, never a CSRF page
async def lead_status(request: HttpRequest, lead_id: str, token: str) -> HttpResponse:
    """The lead's status for the page that submitted it; ``?wait=N`` holds it until the
    outcome or N seconds (clamped to STATUS_WAIT_MAX_SECONDS; at once under WSGI).

    Under the ASGI process, config.asgi answers this URL before Django's handler
    (leads.status_asgi) with the same ``lead_status_answer``; this view serves it under WSGI
    and in Django's test clients, and answers any other method (both processes) with a JSON
    405."""
    if request.method not in STATUS_METHODS:
        return _not_allowed(request, STATUS_METHODS)
    answer = await lead_status_answer(
        method=request.method or "GET",
        lead_id=lead_id,
        token=token,
        wait=request.GET.get("wait"),
        origin=request.headers.get("Origin", ""),
        can_wait=isinstance(request, ASGIRequest),
    )
    response: HttpResponse
    if answer.document is None:
        response = HttpResponse(status=answer.status)
    else:
        response = JsonResponse(answer.document, status=answer.status)
    for name, value in answer.headers.items():
        response[name] = value
    return response


async def _status(lead_uuid: uuid.UUID, wait: float) -> LeadStatusView | None:
    loop = asyncio.get_running_loop()
    if wait > 0 and status_waiters.waiting_for(lead_uuid) >= settings.STATUS_MAX_WAITERS_PER_LEAD:
        # The page that submitted the lead waits with one request at a time: more than a few at
        # once is a script holding the status process's connections open. They are answered at
        # once, as without ?wait=, and wait for nothing.
        wait = 0.0
    if wait <= 0:
        return await _reads.read(lead_uuid, loop.time())
    deadline = loop.time() + wait
    woken = status_waiters.register(lead_uuid)
    registered_at = loop.time()
    try:
        if not status_waiters.troubled():
            await status_waiters.listening(timeout=min(1.0, wait))
        # Else Redis is away: no second given to the listener, so an outcome already written is
        # answered at once; once it subscribes again it wakes every waiter to read once more.
        view = await _reads.read(lead_uuid, registered_at)
        if view is None or view.final:
            return view
        # Woken: a read begun once the announcement was heard sees the outcome, so the pages
        # woken by one announcement share one read. Not woken by the end of the wait: nothing
        # was announced since this page registered, and any read begun since then will do.
        not_before = registered_at
        with contextlib.suppress(TimeoutError):
            not_before = await asyncio.wait_for(woken, max(0.0, deadline - loop.time()))
        return await _reads.read(lead_uuid, not_before)
    finally:
        status_waiters.unregister(lead_uuid, woken)


@cache
def _embed_script() -> bytes:
    return _EMBED.read_bytes()


@csrf_exempt
def embed_script(request: HttpRequest) -> HttpResponse:
    """The script a form page includes to show the lead's owner (leads/embed/owner.js)."""
    if request.method not in EMBED_METHODS:
        return _not_allowed(request, EMBED_METHODS)
    response = HttpResponse(_embed_script(), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "public, max-age=300"
    response["X-Content-Type-Options"] = "nosniff"
    return response
