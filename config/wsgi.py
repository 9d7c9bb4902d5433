"""WSGI entry point: ``config.wsgi:application``.

Django builds the request object (``WSGIRequest.__init__``) before any middleware or error
handler runs, so a request it cannot even read — e.g. ``Content-Type: application/json;
charset*=bogus''x`` makes ``parse_header_parameters`` raise ``ValueError`` — escapes Django
entirely. The server would then answer its own HTML 500 and log the full URL, a ``?token=``
included. ``GuardedWSGIHandler`` answers such a request ``400`` in api.md's error shape and logs
it once, URL redacted; anything else that escapes Django is answered ``500`` JSON and logged at
ERROR with its traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")

import django
from django.core.handlers.wsgi import WSGIHandler, WSGIRequest
from django.http import JsonResponse

from config.errors import error_body
from config.logging import redact

logger = logging.getLogger(__name__)

StartResponse = Callable[..., Any]


class UnreadableRequest(Exception):
    """Django could not build a request object from the WSGI environ (the client's fault)."""


class _GuardedRequest(WSGIRequest):
    def __init__(self, environ: dict[str, Any]) -> None:
        try:
            super().__init__(environ)
        except Exception as exc:
            raise UnreadableRequest(exc) from exc


def _url(environ: dict[str, Any]) -> str:
    """Method, path and query of the request, secrets redacted, bounded in length."""
    path = str(environ.get("PATH_INFO", ""))
    query = str(environ.get("QUERY_STRING", ""))
    url = f"{path}?{query}" if query else path
    return redact(f"{environ.get('REQUEST_METHOD', '-')} {url}")[:2000]


def _json_response(start_response: StartResponse, status: int, code: str, message: str) -> Any:
    """api.md's error document, sent the way Django sends a response.

    Closing it (the server does) sends ``request_finished`` as for any other request.
    """
    response = JsonResponse(error_body(code, message), status=status)
    response["Content-Length"] = str(len(response.content))
    # exc_info: allowed to replace headers a failed start_response may already have set.
    start_response(
        f"{response.status_code} {response.reason_phrase}", list(response.items()), sys.exc_info()
    )
    return response


class GuardedWSGIHandler(WSGIHandler):
    """Django's WSGI handler; what escapes it becomes a JSON answer, never the server's page."""

    request_class = _GuardedRequest

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        try:
            return super().__call__(environ, start_response)
        except UnreadableRequest as exc:
            cause = exc.__cause__ or exc
            # ERROR, with the exception type: a client's malformed header and a bug in request
            # parsing look the same from here, and neither may pass silently.
            logger.error(
                "unreadable request %s: %s: %s",
                _url(environ),
                type(cause).__name__,
                redact(str(cause))[:500],
            )
            return _json_response(
                start_response,
                400,
                "bad_request",
                "The request could not be read (malformed headers).",
            )
        except Exception as exc:
            logger.error(
                "request failed outside Django's handlers %s: %s",
                _url(environ),
                type(exc).__name__,
                exc_info=True,
            )
            return _json_response(
                start_response,
                500,
                "server_error",
                "The server failed; the error has been logged.",
            )


def get_application() -> GuardedWSGIHandler:
    """What ``django.core.wsgi.get_wsgi_application`` does, with the guarded handler."""
    django.setup(set_prefix=False)
    return GuardedWSGIHandler()


application = get_application()
