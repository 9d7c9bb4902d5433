"""Logging filters and formatters shared by every process."""

import contextlib
import copy
import logging
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

# A source token may arrive in a URL (``?token=...``) for tools that can only set a URL; it must
# never reach the logs, whichever logger (gunicorn access, django.request) prints the URL.
_TOKEN_IN_URL = re.compile(r"([?&](?:token|access_token|api_key)=)[^&\s\"']+", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
# A lead status URL's token is its last path segment (leads.status): a capability, not for logs.
_STATUS_TOKEN = re.compile(r"(/api/v1/status/[^/\s\"']+/)[^/?\s\"']+")


def redact(text: str) -> str:
    """Replace secrets that may appear inside a logged URL or header with ``[redacted]``."""
    text = _STATUS_TOKEN.sub(r"\1[redacted]", _TOKEN_IN_URL.sub(r"\1[redacted]", text))
    return _BEARER.sub(r"\1[redacted]", text)


class RedactTokensFilter(logging.Filter):
    """Redacts source tokens from log records before any handler formats them.

    Arguments may be strings, bytes (decoded as latin-1, as HTTP/1 request lines are, and kept
    bytes), or dicts, lists and tuples of them — gunicorn's access log passes one dict of atoms.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            record.args = _redact_arg(record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


def _redact_arg(value: Any, depth: int = 0) -> Any:
    """``value`` with tokens redacted from its strings; containers are copied, types kept."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, (bytes, bytearray)):
        text = bytes(value).decode("latin-1")
        cleaned = redact(text)
        return value if cleaned == text else cleaned.encode("latin-1")
    if depth > 4:
        return value
    if isinstance(value, Mapping):
        # A copy of the same type: gunicorn's access atoms answer "-" for unknown keys.
        try:
            scrubbed = copy.copy(value) if isinstance(value, dict) else dict(value)
        except Exception:
            scrubbed = dict(value)
        for key, item in list(scrubbed.items()):
            scrubbed[key] = _redact_arg(item, depth + 1)
        return scrubbed
    if type(value) is tuple:  # exact types: a named tuple keeps its own repr
        return tuple(_redact_arg(item, depth + 1) for item in value)
    if type(value) is list:
        return [_redact_arg(item, depth + 1) for item in value]
    return value


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def _drop_frame_vars(event: dict[str, Any]) -> None:
    groups: list[Any] = []
    for key in ("exception", "threads"):
        part = event.get(key)
        if isinstance(part, dict) and isinstance(part.get("values"), list):
            groups.extend(part["values"])
    for group in groups:
        stack = group.get("stacktrace") if isinstance(group, dict) else None
        frames = stack.get("frames") if isinstance(stack, dict) else None
        for frame in frames if isinstance(frames, list) else []:
            if isinstance(frame, dict):
                frame.pop("vars", None)


def sentry_scrub_tokens(event: Any, hint: Any) -> Any:
    """Sentry ``before_send``: every string of the event loses its tokens — the request's URL,
    query string and headers, and also the log message and its arguments, the breadcrumbs
    (gunicorn's access line with ``?token=``) and exception messages. Frame variables are
    dropped outright (settings also turn ``include_local_variables`` off): a frame's locals hold
    headers and token forms whose secrets no pattern would recognise. Sentry's logging
    integration reads records before any handler's filter, so RedactTokensFilter on the console
    handler never sees what Sentry sends."""
    if not isinstance(event, dict):
        return event
    _drop_frame_vars(event)
    event = _scrub(event)
    request = event.get("request")
    if isinstance(request, dict):
        query = request.get("query_string")
        if isinstance(query, str) and "token=" in query.lower():
            request["query_string"] = redact("?" + query)[1:]
    return event


# --- Who a log line is about ------------------------------------------------------------------
# Every record written while a lead is being handled carries the lead's id, its source's slug and
# the Celery task's id as fields of their own (JSON keys; `key=value` after a text line), so one
# lead's story can be filtered in any log system without parsing messages.
CONTEXT_FIELDS = ("lead_id", "source", "task_id")
_EMPTY: Mapping[str, str] = MappingProxyType({})
_context: ContextVar[Mapping[str, str]] = ContextVar("leadrouter_log_context", default=_EMPTY)


@contextlib.contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Records logged inside carry ``fields`` (``lead_id``, ``source``); None values are skipped.

    Nested contexts add to the outer one; each ends with its ``with`` block.
    """
    token = _context.set(_merged(fields))
    try:
        yield
    finally:
        _context.reset(token)


def log_context_add(**fields: object) -> None:
    """Add fields (the source, once the lead is loaded) until the enclosing ``log_context`` ends."""
    _context.set(_merged(fields))


def _merged(fields: Mapping[str, object]) -> Mapping[str, str]:
    current = dict(_context.get())
    current.update({key: str(value) for key, value in fields.items() if value is not None})
    return MappingProxyType(current)


def _current_task_id() -> str | None:
    from celery import current_task  # the task this worker process is executing, if any

    request = getattr(current_task, "request", None) if current_task else None
    task_id = getattr(request, "id", None)
    return str(task_id) if task_id else None


class LogContextFilter(logging.Filter):
    """Adds the current ``log_context`` fields and the Celery task's id to every record.

    A field given explicitly (``logger.info(..., extra={"lead_id": ...})``) is kept.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        if not hasattr(record, "task_id"):
            task_id = _current_task_id()
            if task_id is not None:
                record.task_id = task_id
        return True


class ContextTextFormatter(logging.Formatter):
    """The plain-text format, with the context fields a record has appended as ``key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        pairs = [f"{key}={getattr(record, key)}" for key in CONTEXT_FIELDS if hasattr(record, key)]
        if not pairs:
            return text
        first, newline, rest = text.partition("\n")  # after the message, before a traceback
        return f"{first} {' '.join(pairs)}{newline}{rest}"
