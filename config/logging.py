"""Logging filters shared by every process."""

import logging
import re
from typing import Any

# A source token may arrive in a URL (``?token=...``) for tools that can only set a URL; it must
# never reach the logs, whichever logger (gunicorn access, django.request) prints the URL.
_TOKEN_IN_URL = re.compile(r"([?&](?:token|access_token|api_key)=)[^&\s\"']+", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)


def redact(text: str) -> str:
    """Replace secrets that may appear inside a logged URL or header with ``[redacted]``."""
    return _BEARER.sub(r"\1[redacted]", _TOKEN_IN_URL.sub(r"\1[redacted]", text))


class RedactTokensFilter(logging.Filter):
    """Redacts source tokens from log records before any handler formats them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            if isinstance(record.args, dict):
                record.args = {
                    k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()
                }
            else:
                record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def sentry_scrub_tokens(event: Any, hint: Any) -> Any:
    """Sentry ``before_send``: the request's URL, query string and headers lose their tokens."""
    request = event.get("request")
    if isinstance(request, dict):
        for key in ("url", "query_string", "headers", "data"):
            if key in request:
                request[key] = _scrub(request[key])
        query = request.get("query_string")
        if isinstance(query, str) and "token=" in query.lower():
            request["query_string"] = redact("?" + query)[1:]
    return event
