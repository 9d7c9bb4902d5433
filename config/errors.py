"""One JSON error shape for every API error: ``{"error": {"code", "message", "fields"?}}``.

api.md fixes the shape. DRF exceptions go through ``api_exception_handler``; Django's own 400, 403,
404 and 500 handlers answer JSON under ``/api/`` and for the operations endpoints; a database that
is down becomes ``503`` with ``Retry-After`` instead of an HTML 500.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

logger = logging.getLogger(__name__)

JSON_PATH_PREFIXES = ("/api/", "/healthz", "/readyz", "/metrics")


class ApiError(exceptions.APIException):
    """A domain error with its own code, rendered in the API's error shape."""

    def __init__(
        self,
        *,
        code: str,
        message: str,
        status_code: int = status.HTTP_400_BAD_REQUEST,
        fields: dict[str, list[str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail=message, code=code)
        self.status_code = status_code
        self.error_code = code
        self.message = message
        self.fields = fields
        self.headers = headers or {}


def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """The error document of api.md."""
    error: dict[str, Any] = {"code": code, "message": message}
    if fields:
        error["fields"] = fields
    return {"error": error}


def _flatten_fields(detail: Any) -> dict[str, list[str]]:
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            if isinstance(value, list):
                out[str(key)] = [str(v) for v in value]
            elif isinstance(value, dict):
                for sub, msgs in _flatten_fields(value).items():
                    out[f"{key}.{sub}"] = msgs
            else:
                out[str(key)] = [str(value)]
        return out
    return {}


# Django's own exceptions that DRF's handler converts (to NotFound / PermissionDenied) for the
# response, while ``exc`` is still the Django one.
_DRF_CODES: dict[type[Exception], str] = {
    Http404: "not_found",
    DjangoPermissionDenied: "forbidden",
    exceptions.ParseError: "invalid_body",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.NotAuthenticated: "unauthorized",
    exceptions.AuthenticationFailed: "unauthorized",
    exceptions.PermissionDenied: "forbidden",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.Throttled: "rate_limited",
    exceptions.ValidationError: "invalid",
}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, reshaped to api.md's error document; database outages become 503."""
    if isinstance(exc, ApiError):
        return Response(
            error_body(exc.error_code, exc.message, exc.fields),
            status=exc.status_code,
            headers=exc.headers,
        )
    if isinstance(exc, (OperationalError, InterfaceError)):
        logger.error("database unavailable: %s", exc)
        return Response(
            error_body("service_unavailable", "The database is unavailable; retry later."),
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(settings.DB_UNAVAILABLE_RETRY_AFTER_SECONDS)},
        )
    drf_response = exception_handler(exc, context)
    if drf_response is None:
        return None
    response: Response = drf_response
    code = "error"
    for exc_type, exc_code in _DRF_CODES.items():
        if isinstance(exc, exc_type):
            code = exc_code
            break
    detail = getattr(exc, "detail", None)
    if detail is None and isinstance(response.data, dict):
        detail = response.data.get("detail")  # Http404 / PermissionDenied, converted by DRF
    fields: dict[str, list[str]] | None = None
    if isinstance(exc, exceptions.ValidationError) and isinstance(detail, dict):
        fields = _flatten_fields(detail)
        message = "The request is invalid."
    elif isinstance(detail, list) and detail:
        message = str(detail[0])
    else:
        message = str(detail) if detail else "The request failed."
    response.data = error_body(code, message, fields)
    return response


def wants_json(request: HttpRequest) -> bool:
    """Whether this request is an API or operations call (answered in JSON, never HTML)."""
    return request.path.startswith(JSON_PATH_PREFIXES)


def json_error(status_code: int, code: str, message: str) -> JsonResponse:
    """A plain-Django JSON error response in the API's shape."""
    return JsonResponse(error_body(code, message), status=status_code)


def handler400(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Bad request (e.g. a body over Django's upload limits) outside DRF's handler."""
    if wants_json(request):
        return json_error(400, "bad_request", "The request could not be processed.")
    return defaults.bad_request(request, exception)


def handler403(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Forbidden outside DRF's handler."""
    if wants_json(request):
        return json_error(403, "forbidden", "You are not allowed to do this.")
    return defaults.permission_denied(request, exception)


def handler404(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Not found outside DRF's handler (no matching URL)."""
    if wants_json(request):
        return json_error(404, "not_found", "No such endpoint.")
    return defaults.page_not_found(request, exception)


def handler500(request: HttpRequest) -> HttpResponse:
    """A server error: JSON for API clients, the usual page for browsers."""
    if wants_json(request):
        return json_error(500, "server_error", "The server failed; the error has been logged.")
    return defaults.server_error(request)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF failures: JSON for API and operations paths, Django's page elsewhere."""
    if wants_json(request):
        return json_error(403, "forbidden", "CSRF verification failed.")
    from django.views.csrf import csrf_failure as django_csrf_failure

    return django_csrf_failure(request, reason=reason)


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """Turns a database outage anywhere in a request into ``503`` JSON with ``Retry-After``.

    Sync and async (MiddlewareMixin): under ASGI a sync-only middleware would hold a thread for
    each waiting status request.
    """

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, (OperationalError, InterfaceError)) or (
            isinstance(exception, DatabaseError) and "connection" in str(exception).lower()
        ):
            logger.error(
                "database unavailable during %s %s: %s", request.method, request.path, exception
            )
            response = JsonResponse(
                error_body("service_unavailable", "The database is unavailable; retry later."),
                status=503,
            )
            response["Retry-After"] = str(settings.DB_UNAVAILABLE_RETRY_AFTER_SECONDS)
            return response
        return None
