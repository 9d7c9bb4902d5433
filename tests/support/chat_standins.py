"""Stand-ins for Slack and Microsoft Teams on pytest-httpserver, speaking their documented API.

Slack Web API (https://api.slack.com/web, "Using the Slack Web API"; the method pages of
``users.lookupByEmail`` and ``chat.postMessage``; "Rate limits"):

- ``GET|POST /api/users.lookupByEmail`` with ``email`` (query or form) and the token as
  ``Authorization: Bearer xoxb-…``: ``200 {"ok": true, "user": {"id": "U…", ...}}``, or
  ``200 {"ok": false, "error": "users_not_found"}``.
- ``POST /api/chat.postMessage`` with a JSON body (``Content-type: application/json``):
  ``channel`` (a user id opens the DM) and ``text`` and/or ``blocks``: ``200 {"ok": true,
  "channel": "D…", "ts": "…", "message": {...}}``; ``no_text`` without either,
  ``channel_not_found`` for an unknown channel.
- Any method: a missing token is ``not_authed``, an unknown one ``invalid_auth``, a revoked one
  ``token_revoked`` (all HTTP 200, ok false); past the rate limit ``429`` with ``Retry-After``
  (seconds) and ``{"ok": false, "error": "ratelimited"}``.

Slack incoming webhooks ("Sending messages using incoming webhooks", "Handling errors"):
``POST /services/T…/B…/…`` JSON with ``text`` or ``blocks``: ``200 ok`` (plain text);
``400 invalid_payload`` (not JSON), ``400 no_text``, ``403 invalid_token``, ``404 no_service``,
``410 channel_is_archived``, ``429`` with ``Retry-After``.

Teams incoming webhooks ("Create an Incoming Webhook", "Send Adaptive Cards using an Incoming
Webhook", Microsoft Learn): ``POST`` JSON ``{"type": "message", "attachments": [{"contentType":
"application/vnd.microsoft.card.adaptive", "content": {"type": "AdaptiveCard", ...}}]}`` (or a
legacy MessageCard): ``200`` with body ``1``; ``400 Bad payload received by generic incoming
webhook.``; ``429`` ("Microsoft Teams endpoint returned HTTP error 429") with ``Retry-After``.

Behaviours are switched per instance (``rate_limited_for``, ``delay_seconds``, ``revoked``) so a
test says what the far side does; every request is kept in ``calls``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

SLACK_TOKEN = "xoxb-1111-2222-standin-token"


def _json(document: dict[str, Any], status: int = 200, **headers: str) -> Response:
    return Response(
        json.dumps(document), status=status, content_type="application/json", headers=headers
    )


@dataclass
class SlackStandin:
    """Slack's Web API and one incoming webhook, on a local server."""

    server: HTTPServer
    users: dict[str, str] = field(default_factory=dict)  # e-mail → user id
    tokens: set[str] = field(default_factory=lambda: {SLACK_TOKEN})
    revoked: set[str] = field(default_factory=set)
    closed_channels: set[str] = field(default_factory=set)  # users a DM cannot be opened to
    rate_limited_for: int = 0  # answer 429 to the next N calls
    retry_after: int = 30
    delay_seconds: float = 0.0
    webhook_status: tuple[int, str] | None = None  # force the webhook's answer
    calls: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    posted: list[dict[str, Any]] = field(default_factory=list)

    webhook_path = "/services/T000/B000/standinwebhooksecret"

    def __post_init__(self) -> None:
        for method in ("users.lookupByEmail", "chat.postMessage"):
            self.server.expect_request(f"/api/{method}").respond_with_handler(self._api)
        self.server.expect_request(self.webhook_path, method="POST").respond_with_handler(
            self._webhook
        )

    @property
    def base_url(self) -> str:
        return self.server.url_for("/api/")

    @property
    def webhook_url(self) -> str:
        return self.server.url_for(self.webhook_path)

    def _arguments(self, request: Request) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.args.items())
        body = request.get_data(as_text=True)
        if body and request.mimetype == "application/json":
            args.update(json.loads(body))
        elif body:
            args.update({k: v[0] for k, v in parse_qs(body).items()})
        return args

    def _limited(self) -> Response | None:
        if self.delay_seconds:
            time.sleep(self.delay_seconds)
        if self.rate_limited_for > 0:
            self.rate_limited_for -= 1
            return _json(
                {"ok": False, "error": "ratelimited"}, 429, **{"Retry-After": str(self.retry_after)}
            )
        return None

    def _api(self, request: Request) -> Response:
        method = request.path.rsplit("/", 1)[-1]
        args = self._arguments(request)
        self.calls.append((method, args, dict(request.headers)))
        limited = self._limited()
        if limited is not None:
            return limited
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else ""
        if not token:
            return _json({"ok": False, "error": "not_authed"})
        if token in self.revoked:
            return _json({"ok": False, "error": "token_revoked"})
        if token not in self.tokens:
            return _json({"ok": False, "error": "invalid_auth"})
        if method == "users.lookupByEmail":
            user_id = self.users.get(str(args.get("email", "")).lower())
            if user_id is None:
                return _json({"ok": False, "error": "users_not_found"})
            return _json({"ok": True, "user": {"id": user_id, "profile": {}}})
        channel = str(args.get("channel") or "")
        if not args.get("text") and not args.get("blocks"):
            return _json({"ok": False, "error": "no_text"})
        if channel not in self.users.values() or channel in self.closed_channels:
            return _json({"ok": False, "error": "channel_not_found"})
        self.posted.append(args)
        return _json(
            {"ok": True, "channel": "D" + channel[1:], "ts": f"{time.time():.6f}", "message": {}}
        )

    def _webhook(self, request: Request) -> Response:
        self.calls.append(("webhook", {}, dict(request.headers)))
        limited = self._limited()
        if limited is not None:
            return Response(
                "rate_limited", status=429, headers={"Retry-After": str(self.retry_after)}
            )
        if self.webhook_status is not None:
            status, text = self.webhook_status
            return Response(text, status=status, content_type="text/plain")
        try:
            body = json.loads(request.get_data(as_text=True))
        except ValueError:
            return Response("invalid_payload", status=400, content_type="text/plain")
        if not isinstance(body, dict) or not (body.get("text") or body.get("blocks")):
            return Response("no_text", status=400, content_type="text/plain")
        self.posted.append(body)
        return Response("ok", status=200, content_type="text/plain")


@dataclass
class TeamsStandin:
    """One Teams incoming webhook on a local server."""

    server: HTTPServer
    rate_limited_for: int = 0
    retry_after: int = 20
    gone: bool = False
    posted: list[dict[str, Any]] = field(default_factory=list)

    path = "/webhookb2/standin/IncomingWebhook/abc/def"

    def __post_init__(self) -> None:
        self.server.expect_request(self.path, method="POST").respond_with_handler(self._handle)

    @property
    def url(self) -> str:
        return self.server.url_for(self.path)

    def _handle(self, request: Request) -> Response:
        if self.gone:
            return Response("Webhook not found", status=404, content_type="text/plain")
        if self.rate_limited_for > 0:
            self.rate_limited_for -= 1
            return Response(
                "Microsoft Teams endpoint returned HTTP error 429",
                status=429,
                headers={"Retry-After": str(self.retry_after)},
            )
        bad = Response(
            "Bad payload received by generic incoming webhook.",
            status=400,
            content_type="text/plain",
        )
        try:
            body = json.loads(request.get_data(as_text=True))
        except ValueError:
            return bad
        attachments = body.get("attachments") if isinstance(body, dict) else None
        card_ok = isinstance(attachments, list) and any(
            isinstance(item, dict)
            and item.get("contentType") == "application/vnd.microsoft.card.adaptive"
            and isinstance(item.get("content"), dict)
            and item["content"].get("type") == "AdaptiveCard"
            for item in attachments
        )
        message_card = isinstance(body, dict) and body.get("@type") == "MessageCard"
        if not (card_ok and body.get("type") == "message") and not message_card:
            return bad
        self.posted.append(body)
        return Response("1", status=200, content_type="text/plain")
