"""Sending one chat message: Slack (``slack-sdk``: incoming webhook or bot DM) and Teams webhooks.

Each function makes the requests of one attempt and says what came of it as a ``ChatResult``;
the outbox (``services``) decides what to do next (retry with backoff, honour Retry-After, fail
for good). The client libraries' own retries are turned off: the outbox is the one retry policy,
so an attempt is one request (or, for a DM, the lookup and one post).

Permanent failures are the ones a retry of the same message cannot mend: a revoked or wrong
credential, a channel or user that does not exist, a payload the receiver refuses. They fail the
delivery at once with the receiver's own error code in the reason.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web import WebClient
from slack_sdk.webhook import WebhookClient

from routing.delivery import backoff, egress
from routing.delivery.messages import slack_message, teams_message

# Slack Web API errors worth retrying (the rest, with HTTP 200 and ok:false, are permanent:
# invalid_auth, token_revoked, account_inactive, channel_not_found, missing_scope, ...).
SLACK_TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)


@dataclass(frozen=True)
class ChatResult:
    """What one chat attempt came to: ``delivered``, ``retry`` or ``permanent``."""

    outcome: str
    status_code: int | None = None
    error: str = ""
    excerpt: str = ""
    retry_after: float | None = None
    slack_user_id: str = ""  # the DM's user, for the caller to remember


def _excerpt(text: object) -> str:
    return str(text or "")[: egress.RESPONSE_EXCERPT_CHARS]


def _retry_after(headers: Any, now: datetime) -> float | None:
    value = None
    if headers:
        for key, found in dict(headers).items():
            if str(key).lower() == "retry-after":
                value = found[0] if isinstance(found, list) else found
    return backoff.retry_after_seconds(str(value) if value is not None else None, now=now)


def _http_outcome(
    status: int, *, error: str, excerpt: str, retry_after: float | None
) -> ChatResult:
    """A non-2xx answer of a webhook: 429 and 5xx are retried, any other 4xx is permanent."""
    if status == 429 or status >= 500:
        return ChatResult(
            "retry", status_code=status, error=error, excerpt=excerpt, retry_after=retry_after
        )
    if 300 <= status < 400:
        return ChatResult("retry", status_code=status, error=error + " (redirects not followed)")
    return ChatResult("permanent", status_code=status, error=error, excerpt=excerpt)


def slack_webhook_send(
    *, url: str, payload: dict[str, Any], timeout: float, now: datetime, allow_private: bool
) -> ChatResult:
    """POST the message to a Slack incoming webhook (``WebhookClient``)."""
    try:
        egress.url_resolve(url, allow_private=allow_private)
    except egress.HostUnresolved as exc:
        return ChatResult("retry", error=str(exc))
    except egress.UrlRefused as exc:
        return ChatResult("permanent", error=f"webhook URL refused: {exc}")
    client = WebhookClient(url, timeout=max(1, round(timeout)), retry_handlers=[])
    try:
        response = client.send_dict(slack_message(payload))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return ChatResult("retry", error=f"{type(exc).__name__}: {exc}")
    body = _excerpt(response.body)
    if 200 <= response.status_code < 300:
        return ChatResult("delivered", status_code=response.status_code, excerpt=body)
    # Slack answers a webhook in plain text: invalid_payload, invalid_token, no_service,
    # channel_not_found, channel_is_archived, action_prohibited, ...
    return _http_outcome(
        response.status_code,
        error=f"Slack webhook: HTTP {response.status_code} {body.strip()}".strip(),
        excerpt=body,
        retry_after=_retry_after(response.headers, now),
    )


def _slack_error(exc: SlackApiError, method: str, now: datetime) -> ChatResult:
    response = exc.response
    status = int(response.status_code)
    data = response.data if isinstance(response.data, dict) else {}
    code = str(data.get("error") or f"HTTP {status}")
    excerpt = _excerpt(data or response.data)
    error = f"Slack {method}: {code}"
    if status == 429 or code == "ratelimited":
        return ChatResult(
            "retry",
            status_code=status,
            error=error,
            excerpt=excerpt,
            retry_after=_retry_after(response.headers, now),
        )
    if status >= 500 or code in SLACK_TRANSIENT_ERRORS:
        return ChatResult("retry", status_code=status, error=error, excerpt=excerpt)
    if code == "users_not_found":
        error = f"no Slack user has this rep's e-mail ({error})"
    elif code in ("invalid_auth", "token_revoked", "not_authed", "account_inactive"):
        error = f"the Slack bot token was refused ({error}): set a new one on the channel"
    return ChatResult("permanent", status_code=status, error=error, excerpt=excerpt)


def slack_bot_send(
    *,
    token: str,
    email: str,
    payload: dict[str, Any],
    base_url: str,
    timeout: float,
    now: datetime,
    known_user_id: str = "",
) -> ChatResult:
    """DM the rep: ``users.lookupByEmail`` for their user id (unless ``known_user_id``, found
    before), then ``chat.postMessage`` to it."""
    if not email:
        return ChatResult("permanent", error="the rep has no e-mail to find them in Slack by")
    client = WebClient(
        token=token, base_url=base_url, timeout=max(1, round(timeout)), retry_handlers=[]
    )
    method = "users.lookupByEmail"
    try:
        user_id = known_user_id
        if not user_id:
            found = client.users_lookupByEmail(email=email)
            user = found.get("user") or {}
            user_id = str(user.get("id") or "") if isinstance(user, dict) else ""
        if not user_id:
            return ChatResult("permanent", error="Slack users.lookupByEmail: no user id answered")
        method = "chat.postMessage"
        message = slack_message(payload)
        posted = client.chat_postMessage(
            channel=str(user_id), text=message["text"], blocks=message["blocks"]
        )
    except SlackApiError as exc:
        return _slack_error(exc, method, now)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return ChatResult("retry", error=f"Slack {method}: {type(exc).__name__}: {exc}")
    return ChatResult(
        "delivered",
        status_code=posted.status_code,
        excerpt=_excerpt({"ok": True, "channel": posted.get("channel"), "ts": posted.get("ts")}),
        slack_user_id=str(user_id),
    )


def teams_webhook_send(
    *, url: str, payload: dict[str, Any], timeout: float, now: datetime, allow_private: bool
) -> ChatResult:
    """POST the Adaptive Card to a Teams incoming webhook (our SSRF-safe ``egress.post``)."""
    body = json.dumps(teams_message(payload), separators=(",", ":")).encode()
    try:
        response = egress.post(
            url,
            body=body,
            headers={"Content-Type": "application/json"},
            timeout=timeout,
            allow_private=allow_private,
        )
    except egress.HostUnresolved as exc:
        return ChatResult("retry", error=str(exc))
    except egress.UrlRefused as exc:
        return ChatResult("permanent", error=f"webhook URL refused: {exc}")
    except TimeoutError:
        return ChatResult("retry", error=f"Teams webhook: timed out after {timeout} s")
    except (OSError, http.client.HTTPException) as exc:
        return ChatResult("retry", error=f"Teams webhook: {type(exc).__name__}: {exc}")
    excerpt = response.excerpt
    if 200 <= response.status < 300:
        # The Office 365 connectors answered throttling with HTTP 200 and this text in the body.
        if "delivery failed" in excerpt.lower():
            retry = "429" in excerpt
            return ChatResult(
                "retry" if retry else "permanent",
                status_code=response.status,
                error=f"Teams webhook: {excerpt.strip()[:300]}",
                excerpt=excerpt,
            )
        return ChatResult("delivered", status_code=response.status, excerpt=excerpt)
    return _http_outcome(
        response.status,
        error=f"Teams webhook: HTTP {response.status} {excerpt.strip()[:300]}".strip(),
        excerpt=excerpt,
        retry_after=_retry_after(response.headers, now),
    )
