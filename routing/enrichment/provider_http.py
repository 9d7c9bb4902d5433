"""One call to the configured HTTP enrichment endpoint, classified; no database, no retries here.

Request: ``POST <ENRICHMENT_HTTP_URL>`` with ``ENRICHMENT_HTTP_HEADERS`` and a JSON body
``{"email": ..., "domain": ..., "company": ...}``. The whole call (connect, send, wait, read) is
bounded by ``timeout`` seconds (``routing.deadline``), the body by ``max_body_bytes``;
redirects are not followed.
The caller (``services.lead_enrich``) decides what each outcome means for the lead.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import httpx

from routing.deadline import Deadline

MAX_RETRY_AFTER_SECONDS = 3600.0

Kind = Literal["ok", "transient", "rate_limited", "rejected", "malformed"]


@dataclass(frozen=True)
class CallOutcome:
    """What came of one call.

    ``ok``: 2xx with a JSON object (``body``). ``transient``: timeout, connection error, 408 or
    5xx: worth a retry. ``rate_limited``: 429 (``retry_after`` when the provider said).
    ``rejected``: another 4xx or a redirect: retrying will not help. ``malformed``: 2xx whose
    body is not a JSON object, or is too large.
    """

    kind: Kind
    error: str = ""
    status_code: int | None = None
    body: dict[str, Any] = field(default_factory=dict)
    retry_after: float | None = None


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), within [0, 1 h]."""
    if not value:
        return None
    text = value.strip()[:64]
    seconds: float | None = None
    if text.isdigit():
        seconds = float(int(text[:8]))
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


_client_lock = threading.Lock()
_client: httpx.Client | None = None
_client_pid = 0


def _http_client() -> httpx.Client:
    """One pooled client per process (a pool must not cross a fork)."""
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():
        with _client_lock:
            if _client is None or _client_pid != os.getpid():
                _client = httpx.Client(follow_redirects=False, trust_env=False)
                _client_pid = os.getpid()
    return _client


def _read_capped(response: httpx.Response, *, limit: int, deadline: Deadline) -> bytes | None:
    """The body, or None when it is larger than ``limit``; DeadlinePassed past ``deadline``."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        deadline.check()
    return b"".join(chunks)


def _parse_object(raw: bytes) -> dict[str, Any] | None:
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    return parsed if isinstance(parsed, dict) else None


def http_call(
    *,
    url: str,
    headers: dict[str, str],
    payload: dict[str, Any],
    timeout: float,
    max_body_bytes: int,
) -> CallOutcome:
    """Make the call and classify what happened. Never raises."""
    deadline = Deadline(timeout)
    try:
        with _http_client().stream(
            "POST",
            url,
            json=payload,
            headers={"Accept": "application/json", **headers},
            timeout=httpx.Timeout(timeout),
        ) as response:
            status = response.status_code
            if status == 429:
                retry_after = parse_retry_after(response.headers.get("retry-after"))
                return CallOutcome("rate_limited", "HTTP 429", status, retry_after=retry_after)
            if status == 408 or status >= 500:
                return CallOutcome("transient", f"HTTP {status}", status)
            if not 200 <= status < 300:
                return CallOutcome("rejected", f"HTTP {status}", status)
            raw = _read_capped(response, limit=max_body_bytes, deadline=deadline)
    except (httpx.TimeoutException, TimeoutError):
        return CallOutcome("transient", f"timeout after {timeout:g} s")
    except httpx.TransportError as exc:
        return CallOutcome("transient", f"connection error: {type(exc).__name__}")
    except Exception as exc:  # an invalid URL or header, or anything odd in the client
        return CallOutcome("transient", f"{type(exc).__name__}: {str(exc)[:200]}")
    if raw is None:
        return CallOutcome("malformed", f"response larger than {max_body_bytes} bytes", status)
    body = _parse_object(raw)
    if body is None:
        return CallOutcome("malformed", "response is not a JSON object", status)
    return CallOutcome("ok", "", status, body=body)
