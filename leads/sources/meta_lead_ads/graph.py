"""The one Graph API call the worker makes: fetch the lead a leadgen notification names.

From Meta's developer docs:

- "Retrieving Leads" (https://developers.facebook.com/docs/marketing-api/guides/lead-ads/
  retrieving): ``GET /{version}/{leadgen_id}?fields=...&access_token=<page token>`` answers the
  lead (``id``, ``created_time``, the ad and form ids, ``field_data``). The lead reference
  (https://developers.facebook.com/docs/marketing-api/reference/user-lead-gen-info/) names the
  fields asked for in ``FIELDS``.
- "Handling Errors" (https://developers.facebook.com/docs/graph-api/guides/error-handling): an
  error is ``{"error": {"message", "type", "code", "error_subcode", "is_transient",
  "fbtrace_id"}}``; ``190`` (OAuthException: expired, revoked or invalid token) and ``102``
  (session) mean a new token; ``10`` and ``200``-``299`` a missing permission; ``100`` with
  subcode ``33`` an object that does not exist (or cannot be loaded with this token);
  ``is_transient`` an error worth retrying; ``1``/``2`` a temporary problem of the API.
- "Rate Limits" (https://developers.facebook.com/docs/graph-api/overview/rate-limiting):
  throttling answers codes ``4`` (app), ``17`` (user), ``32`` (Pages), ``613`` (custom) and
  ``80001``-``80014`` (Business Use Case: Pages, Lead Ads...); the ``X-App-Usage`` and
  ``X-Business-Use-Case-Usage`` headers carry the usage in percent and, when throttled,
  ``estimated_time_to_regain_access`` in minutes. Page and System User tokens are counted by
  Business Use Case, per Page.

Why plain ``httpx`` and not Meta's ``facebook-business`` SDK: the SDK keeps its API object and
its Graph address in process-wide state (``FacebookAdsApi.set_default_api``, the
``FacebookSession.GRAPH`` class constant), so a per-source base URL or token means patching
globals under concurrent workers; ``FacebookAdsApi.init`` turns on a crash reporter by default
that installs an excepthook and posts stack traces to Meta; and it brings the whole Marketing API
for one GET. This module makes that one GET with a timeout, and never lets the token reach an
error message or a return value. No Django here: the stage that paces it is ``routing.fetch``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import ssl
import time
from dataclasses import dataclass
from typing import Any, Literal

import httpx

FIELDS = (
    "id,created_time,ad_id,ad_name,adset_id,campaign_id,campaign_name,form_id,is_organic,"
    "platform,field_data"
)
RATE_LIMIT_CODES = frozenset({4, 17, 32, 613, *range(80001, 80015)})
AUTH_CODES = frozenset({102, 190})
PERMISSION_CODES = frozenset({10, *range(200, 300)})
NOT_FOUND = (100, 33)
TEMPORARY_CODES = frozenset({1, 2})
MAX_BODY_BYTES = 1_000_000
USAGE_HEADERS = ("x-business-use-case-usage", "x-app-usage", "x-ad-account-usage")

_TOKEN_IN_URL = re.compile(r"(access_token=)[^&\s\"']+")


class _RedactAccessToken(logging.Filter):
    """httpx logs every request's URL at INFO, and ours carries the page token (Meta documents
    ``access_token`` as a query parameter): redacted on the ``httpx`` logger itself, so that no
    handler (the console, a test's capture, Sentry's breadcrumbs) ever sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "access_token=" in str(record.args) or "access_token=" in str(record.msg):
            record.msg = _TOKEN_IN_URL.sub(r"\1[redacted]", record.getMessage())
            record.args = ()
        return True


logging.getLogger("httpx").addFilter(_RedactAccessToken())

ErrorKind = Literal[
    "auth", "permission", "not_found", "rate_limited", "unavailable", "malformed", "rejected"
]


class GraphError(Exception):
    """A fetch that did not give a lead, by what to do about it (``kind``); never the token."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        code: int | None = None,
        subcode: int | None = None,
        retry_after: float | None = None,
        trace_id: str = "",
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.code = code
        self.subcode = subcode
        self.retry_after = retry_after
        self.trace_id = trace_id

    def __str__(self) -> str:
        parts = [self.message]
        if self.code is not None:
            parts.append(f"code {self.code}" + (f"/{self.subcode}" if self.subcode else ""))
        if self.status is not None:
            parts.append(f"HTTP {self.status}")
        if self.trace_id:
            parts.append(f"fbtrace_id {self.trace_id}")
        return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "")


@dataclass(frozen=True)
class Fetched:
    """The lead as the Graph API returned it, and how close the token is to its limits."""

    lead: dict[str, Any]
    usage_percent: float | None = None


def scrub(text: str, token: str = "") -> str:
    """``text`` without ``token`` and without any ``access_token=`` value."""
    if token:
        text = text.replace(token, "[redacted]")
    return _TOKEN_IN_URL.sub(r"\1[redacted]", text)


def _scrub(text: str, token: str) -> str:
    return scrub(text, token)[:500]


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _usage_entries(headers: httpx.Headers) -> list[dict[str, Any]]:
    """Every usage object in the rate-limit headers (BUC's are keyed by business id, in lists)."""
    found: list[dict[str, Any]] = []
    for name in USAGE_HEADERS:
        raw = headers.get(name)
        if not raw or len(raw) > 20_000:
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        stack = [value]
        while stack and len(found) < 100:
            node = stack.pop()
            if isinstance(node, dict):
                if any(key in node for key in ("call_count", "estimated_time_to_regain_access")):
                    found.append(node)
                else:
                    stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    return found


def regain_seconds(headers: httpx.Headers) -> float | None:
    """The longest ``estimated_time_to_regain_access`` (minutes) in the headers, in seconds."""
    minutes = []
    for entry in _usage_entries(headers):
        value = entry.get("estimated_time_to_regain_access")
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            minutes.append(float(value))
    return max(minutes) * 60 if minutes else None


def usage_percent(headers: httpx.Headers) -> float | None:
    """The highest usage in percent (call count, CPU time, total time) the headers report."""
    values = []
    for entry in _usage_entries(headers):
        for key in ("call_count", "total_cputime", "total_time"):
            value = entry.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                values.append(float(value))
    return max(values) if values else None


def _error(response: httpx.Response, content: bytes, token: str) -> GraphError:
    status = response.status_code
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        if status >= 500:
            return GraphError("unavailable", "the Graph API failed", status=status)
        if status == 429:
            return GraphError(
                "rate_limited",
                "throttled",
                status=status,
                retry_after=regain_seconds(response.headers),
            )
        return GraphError("malformed", "an error answer without a Graph error", status=status)
    code = _int(error.get("code"))
    subcode = _int(error.get("error_subcode"))
    message = _scrub(str(error.get("message") or "no message"), token)
    trace = _scrub(str(error.get("fbtrace_id") or ""), token)[:64]

    def make(kind: ErrorKind, retry_after: float | None = None) -> GraphError:
        return GraphError(
            kind,
            message,
            status=status,
            code=code,
            subcode=subcode,
            retry_after=retry_after,
            trace_id=trace,
        )

    if code in RATE_LIMIT_CODES:
        return make("rate_limited", regain_seconds(response.headers))
    if code in AUTH_CODES or (code is None and status == 401):
        return make("auth")
    if code in PERMISSION_CODES:
        return make("permission")
    if (code, subcode) == NOT_FOUND:
        return make("not_found")
    if error.get("is_transient") is True or code in TEMPORARY_CODES or status >= 500:
        return make("unavailable")
    return make("rejected")


def _trust(verify: bool | str) -> bool | ssl.SSLContext:
    """``verify`` as httpx takes it: a CA bundle's path read into an SSL context (httpx 0.28
    deprecates a path), an unreadable bundle a GraphError that names the setting."""
    if not isinstance(verify, str):
        return verify
    try:
        return ssl.create_default_context(cafile=verify)
    except (OSError, ValueError) as exc:  # missing, unreadable, or no certificate in it
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise GraphError(
            "unavailable", f"the CA bundle META_GRAPH_CA_BUNDLE cannot be read ({reason})"
        ) from None


def _certificate_refused(exc: BaseException) -> str:
    """The reason when ``exc`` is a TLS certificate the client refused, else ""."""
    seen: BaseException | None = exc
    for _ in range(5):  # httpx wraps httpcore's error, which wraps ssl's
        if seen is None:
            break
        if isinstance(seen, ssl.SSLCertVerificationError):
            return str(seen.verify_message or "certificate verify failed")[:200]
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return "certificate verify failed"
    return ""


def _read_within(response: httpx.Response, *, deadline: float) -> bytes:
    """The body, cut just past MAX_BODY_BYTES; TimeoutError once ``deadline`` has passed."""
    chunks: list[bytes] = []
    size = 0
    if time.monotonic() > deadline:
        raise TimeoutError("the headers took longer than the timeout")
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            break
        if time.monotonic() > deadline:
            raise TimeoutError("the answer took longer than the timeout")
    return b"".join(chunks)


def fetch_lead(
    *,
    leadgen_id: str,
    token: str,
    base_url: str,
    version: str,
    timeout: float,
    verify: bool | str = True,
) -> Fetched:
    """The lead ``leadgen_id`` from the Graph API, or ``GraphError``; never anything else."""
    if not token:
        raise GraphError("auth", "no page access token is set on the source")
    if not leadgen_id.isdigit():
        raise GraphError("rejected", f"{leadgen_id[:40]!r} is not a Graph object id")
    url = f"{base_url.rstrip('/')}/{version.strip('/')}/{leadgen_id}"
    params = {"fields": FIELDS, "access_token": token}
    trust = _trust(verify)
    # httpx's timeout bounds each read, not the answer: a server that sends a byte now and then
    # would hold the call (and, on the I/O worker's threads pool, which enforces no task time
    # limit, its thread) for ever. So the whole answer must arrive within ``timeout``, and
    # reading stops as soon as it is larger than MAX_BODY_BYTES.
    deadline = time.monotonic() + timeout
    try:
        with (
            httpx.Client(timeout=timeout, verify=trust, follow_redirects=False) as client,
            client.stream(
                "GET", url, params=params, headers={"Accept": "application/json"}
            ) as response,
        ):
            content = _read_within(response, deadline=deadline)
    except (httpx.TimeoutException, TimeoutError):
        raise GraphError("unavailable", f"no answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        refused = _certificate_refused(exc)
        if refused:
            raise GraphError(
                "unavailable", f"the Graph API's certificate is not trusted ({refused})"
            ) from None
        # The message may hold the URL, and the URL the token: only the error's type is kept.
        raise GraphError(
            "unavailable", f"the Graph API is unreachable ({type(exc).__name__})"
        ) from None
    except ValueError as exc:  # an unusable base URL or version
        raise GraphError("rejected", _scrub(f"cannot call the Graph API: {exc}", token)) from None
    if len(content) > MAX_BODY_BYTES:
        raise GraphError("malformed", "an answer too large", status=response.status_code)
    if response.status_code != 200:
        raise _error(response, content, token)
    try:
        lead = json.loads(content)
    except (ValueError, RecursionError):
        raise GraphError("malformed", "an answer that is not JSON", status=200) from None
    if not isinstance(lead, dict):
        raise GraphError("malformed", "an answer that is not a JSON object", status=200)
    if isinstance(lead.get("error"), dict):
        raise _error(response, content, token)
    if str(lead.get("id") or "") != leadgen_id:
        raise GraphError("malformed", "an answer that is not the lead asked for", status=200)
    if not isinstance(lead.get("field_data", []), list):
        raise GraphError("malformed", "an answer whose field_data is not a list", status=200)
    usage = usage_percent(response.headers)
    return Fetched(lead=lead, usage_percent=None if usage is None else math.floor(usage))
