"""The status URL's fast path in the ASGI process (config.asgi), in front of Django's handler.

A page waiting for its rep asks the status URL again and again (each ``?wait=`` ends with an
answer, then the embed asks anew): the status process answers far more status requests than
anything else. Through Django's ASGI handler each one costs ~5 ms of CPU, most of it thread
hops (the request signals, sync adapters), none of it needed by this URL, which reads no
session, user or cookie. This ASGI wrapper answers ``GET``/``HEAD``/``OPTIONS`` on
``/api/v1/status/<lead>/<token>/`` itself, with the view's own ``lead_status_answer``, and
passes every other request (and every other method on that URL) to Django unchanged.

What the Django middleware would have done for this URL it does too: the ``Host`` header
checked against ALLOWED_HOSTS (400), a query string of more than DATA_UPLOAD_MAX_NUMBER_FIELDS
fields refused (400, as Django answers TooManyFieldsSent), a database outage answered ``503``
with ``Retry-After``, any other failure a logged ``500`` in the API's JSON error shape, and the
security headers (``X-Content-Type-Options``, ``X-Frame-Options``, ``Referrer-Policy``,
``Cross-Origin-Opener-Policy``) the security and clickjacking middleware add.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http.request import split_domain_port, validate_host

from config.errors import error_body
from leads.status_api import StatusAnswer, lead_status_answer

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]

STATUS_PATH = re.compile(r"^/api/v1/status/(?P<lead>[^/]+)/(?P<token>[^/]+)/$")
METHODS = ("GET", "HEAD", "OPTIONS")


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return ""


def _host_allowed(scope: Scope) -> bool:
    host = _header(scope, b"host")
    if not host:
        server = scope.get("server")
        host = f"{server[0]}:{server[1]}" if server else ""
    domain, _port = split_domain_port(host)
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def _security_headers() -> dict[str, str]:
    headers = {"X-Frame-Options": settings.X_FRAME_OPTIONS}
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers["X-Content-Type-Options"] = "nosniff"
    if settings.SECURE_REFERRER_POLICY:
        policy = settings.SECURE_REFERRER_POLICY
        headers["Referrer-Policy"] = policy if isinstance(policy, str) else ",".join(policy)
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers["Cross-Origin-Opener-Policy"] = settings.SECURE_CROSS_ORIGIN_OPENER_POLICY
    return headers


async def _send(send: Send, answer: StatusAnswer, method: str) -> None:
    headers = {**_security_headers(), **answer.headers}
    body = b""
    if answer.document is not None:
        body = json.dumps(answer.document).encode()
        headers["Content-Type"] = "application/json"
        headers["Content-Length"] = str(len(body))
    await send(
        {
            "type": "http.response.start",
            "status": answer.status,
            "headers": [
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


async def _answer(scope: Scope, match: re.Match[str]) -> StatusAnswer:
    if not _host_allowed(scope):
        return StatusAnswer(400, error_body("bad_request", "Invalid Host header."), {})
    try:
        # Bounded as Django's QueryDict is (TooManyFieldsSent, answered 400 by handler400).
        pairs = parse_qsl(
            bytes(scope.get("query_string") or b"").decode("latin-1"),
            keep_blank_values=True,
            max_num_fields=settings.DATA_UPLOAD_MAX_NUMBER_FIELDS,
        )
    except ValueError:
        return StatusAnswer(
            400, error_body("bad_request", "The request could not be processed."), {}
        )
    wait = next((value for key, value in reversed(pairs) if key == "wait"), None)
    try:
        return await lead_status_answer(
            method=scope["method"],
            lead_id=match["lead"],
            token=match["token"],
            wait=wait,
            origin=_header(scope, b"origin"),
            can_wait=True,
        )
    except (OperationalError, InterfaceError) as exc:
        return _unavailable(scope, exc)
    except DatabaseError as exc:
        if "connection" in str(exc).lower():
            return _unavailable(scope, exc)
        raise


def _unavailable(scope: Scope, exc: Exception) -> StatusAnswer:
    logger.error("database unavailable during %s %s: %s", scope["method"], "status", exc)
    return StatusAnswer(
        503,
        error_body("service_unavailable", "The database is unavailable; retry later."),
        {"Retry-After": str(settings.DB_UNAVAILABLE_RETRY_AFTER_SECONDS)},
    )


def status_fast_path(django_app: ASGIApp) -> ASGIApp:
    """``django_app`` with the status URL answered in front of it (see the module's words)."""

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http" and scope.get("method") in METHODS:
            match = STATUS_PATH.match(scope.get("path") or "")
        if match is None:
            await django_app(scope, receive, send)
            return
        try:
            answer = await _answer(scope, match)
        except Exception:
            logger.exception("status request failed")
            answer = StatusAnswer(
                500, error_body("server_error", "The server failed; the error has been logged."), {}
            )
        await _send(send, answer, scope["method"])

    return application
