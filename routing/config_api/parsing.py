"""Reading configuration API bodies: the intake's strict JSON, with limits sized for a whole
configuration (docs/api.md, "Configuration", "Body limits").

The intake's limits (64 KiB strings, 1,000 items) fit one lead; a configuration has 20,000
territories and its CSV imports are megabytes of text. So the configuration API keeps the
intake's strictness (UTF-8, no duplicate keys, no NaN, bounded nesting and key length) with its
own sizes: ``CONFIG_API_MAX_BODY_BYTES``, ``CONFIG_API_MAX_STRING_CHARS`` and
``CONFIG_API_MAX_ITEMS``. A body over a limit is answered with a JSON 413 or 400 naming it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.parsers import BaseParser, JSONParser

from config.errors import ApiError
from leads.parsing import IntakeError, Limits, decode_utf8, parse_json

BODY_LIMITS = (
    "Body limits (settings, defaults): a body of at most CONFIG_API_MAX_BODY_BYTES (16 MiB; "
    "413 body_too_large past it), strings of at most CONFIG_API_MAX_STRING_CHARS (16 Mi "
    "characters), lists and objects of at most CONFIG_API_MAX_ITEMS (100,000) items, nesting "
    "at most INTAKE_MAX_JSON_DEPTH (32) levels; 400 invalid_body names the limit exceeded."
)


def config_limits() -> Limits:
    return Limits(
        max_depth=settings.INTAKE_MAX_JSON_DEPTH,
        max_keys=settings.CONFIG_API_MAX_ITEMS,
        max_string=settings.CONFIG_API_MAX_STRING_CHARS,
    )


def _too_large() -> ApiError:
    limit = settings.CONFIG_API_MAX_BODY_BYTES
    return ApiError(
        code="body_too_large",
        message=f"The body is larger than CONFIG_API_MAX_BODY_BYTES ({limit} bytes).",
        status_code=413,
    )


def read_body(stream: Any, parser_context: Any) -> bytes:
    """The body, refused with 413 past ``CONFIG_API_MAX_BODY_BYTES`` (read no further)."""
    limit = settings.CONFIG_API_MAX_BODY_BYTES
    request = (parser_context or {}).get("request")
    try:
        declared = int((request.META if request is not None else {}).get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise _too_large()
    body = stream.read(limit + 1) if stream is not None else b""
    if len(body) > limit:
        raise _too_large()
    return body


class ConfigJSONParser(JSONParser):
    """Strict JSON with the configuration API's limits, never a 500."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        body = read_body(stream, parser_context)
        try:
            return parse_json(body, config_limits())
        except IntakeError as error:
            raise ApiError(code="invalid_body", message=error.message) from None


class ConfigCSVParser(BaseParser):
    """A ``text/csv`` body as its text (the tables import): UTF-8 like the admin's CSV import,
    the same size limit as JSON."""

    media_type = "text/csv"

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        body = read_body(stream, parser_context)
        try:
            text = decode_utf8(body)
        except IntakeError as error:
            raise ApiError(code="invalid_body", message=error.message) from None
        if "\x00" in text:
            raise ApiError(code="invalid_body", message="NUL characters are not allowed.")
        return text
