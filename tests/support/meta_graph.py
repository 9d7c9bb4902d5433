"""A stand-in Graph API over HTTP, for tests of the Meta Lead Ads fetch (``graph.py`` and
``routing.fetch.meta``).

It implements the one call we make, as Meta documents it:

- ``GET /vXX.X/<lead id>?fields=...&access_token=...`` ("Retrieving Leads"; the Lead node
  reference): the lead with only the fields asked for (``id`` always), ``field_data`` as
  ``[{"name", "values": [...]}]``.
- Errors in Graph's shape ("Handling Errors"): ``{"error": {"message", "type", "code",
  "error_subcode", "is_transient", "fbtrace_id"}}``, HTTP 400 for request errors:
  - no ``access_token``: code 104 (OAuthException, "An access token is required");
  - an unknown token: code 190 ("Invalid OAuth access token - Cannot parse access token");
    an expired one: code 190 subcode 463 ("Error validating access token: Session has
    expired");
  - an unknown version: code 2500 ("Unknown path components");
  - an unknown field: code 100 ("Tried accessing nonexisting field (x) on node type
    (UserLeadGenInfo)");
  - an id that is no lead: code 100 subcode 33 ("Unsupported get request. Object with ID
    '...' does not exist, cannot be loaded due to missing permissions, or does not support
    this operation").
- Throttling ("Rate Limits"): ``throttle_next(n, code=...)`` answers code 4, 17, 32, 613 or
  80001-80014 with the ``X-App-Usage`` and ``X-Business-Use-Case-Usage`` headers, the latter
  with ``estimated_time_to_regain_access`` (minutes).
- ``fail_next`` (500 with ``is_transient: true``, code 2), ``bad_gateway_next`` (502 HTML),
  ``garbage_next`` (200 that is not JSON), ``slow_next`` (an answer after a delay).

Every answer carries ``X-Business-Use-Case-Usage`` (Page tokens are counted by Business Use
Case). ``requests`` logs what was asked (path, fields, and whether the token was valid; never
the token itself).

``MetaGraphStandIn(tls=True)`` serves HTTPS (as graph.facebook.com does only) with a
certificate of its own for 127.0.0.1; ``ca_file`` is that certificate, to pass as
``META_GRAPH_CA_BUNDLE``. ``down()`` closes the listening socket (connections refused) until
``up()`` listens again on the same port.
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.support.crm_salesforce import _certificate

LEAD_FIELDS = frozenset(
    {
        "id",
        "created_time",
        "ad_id",
        "ad_name",
        "adset_id",
        "adset_name",
        "campaign_id",
        "campaign_name",
        "form_id",
        "is_organic",
        "platform",
        "field_data",
        "custom_disclaimer_responses",
        "home_listing",
        "partner_name",
        "post",
        "retailer_item_id",
        "vehicle",
    }
)
_VERSION = re.compile(r"^v\d{1,2}\.\d$")
PAGE_ID = "230076207144371"


@dataclass
class Logged:
    path: str
    fields: list[str]
    token_ok: bool
    status: int


@dataclass
class _Script:
    kind: str
    count: int
    extra: dict[str, Any] = field(default_factory=dict)


class MetaGraphStandIn:
    """A threaded HTTP server in the test process speaking the Graph API's lead read."""

    def __init__(self, *, tls: bool = False) -> None:
        self.tls = tls
        self.ca_file = ""
        self._key_file = ""
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        if tls:
            self._dir = tempfile.TemporaryDirectory(prefix="meta-standin-")
            cert, key = _certificate(Path(self._dir.name))
            self.ca_file, self._key_file = str(cert), str(key)
        self.port = 0
        self.token = "EAAG-page-token-" + "x" * 40
        self.expired_tokens: set[str] = set()
        self.leads: dict[str, dict[str, Any]] = {}
        self.requests: list[Logged] = []
        self.error_codes: list[int] = []  # the Graph error code of each error answered
        self._scripts: list[_Script] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._counter = 0

    # --- setup -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> MetaGraphStandIn:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle(self) -> None:
                # A client that refuses our certificate, or hangs up: that connection's end.
                with contextlib.suppress(OSError):
                    super().handle()

            def do_GET(self) -> None:
                standin._get(self)

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.ca_file, self._key_file)
            # The handshake runs in the handler's thread, so that a client that refuses the
            # certificate cannot stall the accept loop.
            server.socket = context.wrap_socket(
                server.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = int(server.server_address[1])
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def down(self) -> None:
        """Refuse connections until ``up()`` (Meta unreachable)."""
        self.stop()

    def up(self) -> None:
        """Listen again, on the same port."""
        if self._server is None:
            self.start()

    def close(self) -> None:
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()

    def add_lead(self, leadgen_id: str | None = None, **answers: str) -> str:
        """A lead with ``field_data`` from ``answers`` (question key → answer)."""
        with self._lock:
            self._counter += 1
            lead_id = leadgen_id or str(1_300_000_000_000_000 + self._counter)
        self.leads[lead_id] = {
            "id": lead_id,
            "created_time": "2024-03-05T09:45:12+0000",
            "ad_id": "23851234567890123",
            "ad_name": "DACH demo — carousel",
            "adset_id": "23851234567890456",
            "campaign_id": "23851234567890789",
            "campaign_name": "Q1 DACH demo requests",
            "form_id": "734509821234567",
            "is_organic": False,
            "platform": "fb",
            "field_data": [{"name": key, "values": [value]} for key, value in answers.items()],
        }
        return lead_id

    def expire_token(self) -> None:
        self.expired_tokens.add(self.token)

    def new_token(self) -> str:
        self.token = "EAAG-page-token-" + str(time.monotonic_ns())
        return self.token

    def _script(self, kind: str, count: int, **extra: Any) -> None:
        with self._lock:
            self._scripts.append(_Script(kind, count, extra))

    def throttle_next(self, n: int = 1, *, code: int = 80001, minutes: int = 1) -> None:
        self._script("throttle", n, code=code, minutes=minutes)

    def fail_next(self, n: int = 1) -> None:
        self._script("fail", n)

    def bad_gateway_next(self, n: int = 1) -> None:
        self._script("bad_gateway", n)

    def garbage_next(self, n: int = 1) -> None:
        self._script("garbage", n)

    def slow_next(self, n: int = 1, *, seconds: float = 1.0) -> None:
        self._script("slow", n, seconds=seconds)

    def lead_calls(self) -> int:
        return sum(1 for r in self.requests if r.status == 200)

    # --- serving -----------------------------------------------------------------------------

    def _next_script(self) -> _Script | None:
        with self._lock:
            if not self._scripts:
                return None
            script = self._scripts[0]
            script.count -= 1
            if script.count <= 0:
                self._scripts.pop(0)
            return script

    def _send(
        self,
        handler: BaseHTTPRequestHandler,
        status: int,
        body: bytes,
        *,
        content_type: str = "application/json; charset=UTF-8",
        headers: dict[str, str] | None = None,
    ) -> None:
        logged = getattr(handler, "graph_logged", None)
        if logged is not None:
            # Logged before the answer goes out: a client that has its answer finds its request
            # in ``requests`` (logged after, a test reading at once could find it missing).
            logged.status = status
            with self._lock:
                self.requests.append(logged)
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        usage = {
            PAGE_ID: [
                {
                    "type": "pages",
                    "call_count": 3,
                    "total_cputime": 1,
                    "total_time": 2,
                    "estimated_time_to_regain_access": 0,
                }
            ]
        }
        headers = {"X-Business-Use-Case-Usage": json.dumps(usage), **(headers or {})}
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body)

    def _error(
        self,
        handler: BaseHTTPRequestHandler,
        code: int,
        message: str,
        *,
        status: int = 400,
        subcode: int | None = None,
        kind: str = "OAuthException",
        transient: bool = False,
        headers: dict[str, str] | None = None,
    ) -> int:
        error: dict[str, Any] = {
            "message": message,
            "type": kind,
            "code": code,
            "is_transient": transient,
            "fbtrace_id": "AbCdEfGhIjK",
        }
        if subcode is not None:
            error["error_subcode"] = subcode
        with self._lock:
            self.error_codes.append(code)
        self._send(handler, status, json.dumps({"error": error}).encode(), headers=headers)
        return status

    def _get(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        query = parse_qs(parts.query)
        token = (query.get("access_token") or [""])[0]
        fields = [f for f in (query.get("fields") or [""])[0].split(",") if f]
        token_ok = bool(token) and token == self.token and token not in self.expired_tokens
        handler.graph_logged = Logged(parts.path, fields, token_ok, 0)  # type: ignore[attr-defined]
        self._answer(handler, parts.path, fields, token)

    def _answer(
        self, handler: BaseHTTPRequestHandler, path: str, fields: list[str], token: str
    ) -> int:
        script = self._next_script()
        if script is not None and script.kind == "slow":
            time.sleep(script.extra["seconds"])
            script = None
        if script is not None:
            if script.kind == "fail":
                return self._error(
                    handler,
                    2,
                    "An unexpected error has occurred. Please retry your request later.",
                    status=500,
                    transient=True,
                )
            if script.kind == "bad_gateway":
                self._send(
                    handler, 502, b"<html><body>Bad Gateway</body></html>", content_type="text/html"
                )
                return 502
            if script.kind == "garbage":
                self._send(handler, 200, b"\x00{not json", content_type="text/plain")
                return 200
            if script.kind == "throttle":
                code = script.extra["code"]
                minutes = script.extra["minutes"]
                usage = {
                    PAGE_ID: [
                        {
                            "type": "pages",
                            "call_count": 100,
                            "total_cputime": 20,
                            "total_time": 30,
                            "estimated_time_to_regain_access": minutes,
                        }
                    ]
                }
                headers = {
                    "X-Business-Use-Case-Usage": json.dumps(usage),
                    "X-App-Usage": json.dumps(
                        {"call_count": 100, "total_cputime": 10, "total_time": 12}
                    ),
                }
                messages = {
                    4: "(#4) Application request limit reached",
                    17: "(#17) User request limit reached",
                    32: "(#32) Page request limit reached",
                    613: "(#613) Calls to this api have exceeded the rate limit.",
                }
                return self._error(
                    handler,
                    code,
                    messages.get(code, f"(#{code}) There have been too many calls to this Page"),
                    headers=headers,
                )
        segments = [s for s in path.split("/") if s]
        if len(segments) != 2 or not _VERSION.match(segments[0]):
            return self._error(handler, 2500, f"Unknown path components: {path}")
        if not token:
            return self._error(
                handler, 104, "An access token is required to request this resource."
            )
        if token in self.expired_tokens:
            return self._error(
                handler,
                190,
                "Error validating access token: Session has expired on Tuesday, 05-Mar-24 "
                "01:00:00 PST.",
                subcode=463,
            )
        if token != self.token:
            return self._error(
                handler, 190, "Invalid OAuth access token - Cannot parse access token"
            )
        for name in fields:
            if name not in LEAD_FIELDS:
                return self._error(
                    handler,
                    100,
                    f"(#100) Tried accessing nonexisting field ({name}) on node type "
                    "(UserLeadGenInfo)",
                    kind="GraphMethodException",
                )
        lead = self.leads.get(segments[1])
        if lead is None:
            return self._error(
                handler,
                100,
                f"Unsupported get request. Object with ID '{segments[1]}' does not exist, cannot "
                "be loaded due to missing permissions, or does not support this operation. "
                "Please read the Graph API documentation at https://developers.facebook.com/docs/"
                "graph-api",
                subcode=33,
                kind="GraphMethodException",
            )
        wanted = set(fields) | {"id"} if fields else {"id", "created_time"}
        body = {key: value for key, value in lead.items() if key in wanted}
        self._send(handler, 200, json.dumps(body).encode())
        return 200


@pytest.fixture
def meta_graph() -> Iterator[MetaGraphStandIn]:
    standin = MetaGraphStandIn().start()
    try:
        yield standin
    finally:
        standin.close()


@pytest.fixture
def meta_graph_tls() -> Iterator[MetaGraphStandIn]:
    """The stand-in over HTTPS, with its own certificate in ``ca_file``."""
    standin = MetaGraphStandIn(tls=True).start()
    try:
        yield standin
    finally:
        standin.close()
