"""The Graph API lead read (``leads.sources.meta_lead_ads.graph``) against the stand-in: each
documented answer becomes the right kind of outcome, and the token is in none of them."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from leads.sources import flatten
from leads.sources.meta_lead_ads.graph import FIELDS, GraphError, fetch_lead
from tests.support.meta_graph import MetaGraphStandIn, meta_graph, meta_graph_tls

__all__ = ["meta_graph", "meta_graph_tls"]


def _fetch(graph: MetaGraphStandIn, lead_id: str, **overrides: object) -> object:
    args: dict[str, object] = {
        "leadgen_id": lead_id,
        "token": graph.token,
        "base_url": graph.url,
        "version": "v21.0",
        "timeout": 2.0,
        **overrides,
    }
    return fetch_lead(**args)  # type: ignore[arg-type]


def _error(graph: MetaGraphStandIn, lead_id: str, **overrides: object) -> GraphError:
    with pytest.raises(GraphError) as caught:
        _fetch(graph, lead_id, **overrides)
    error = caught.value
    assert graph.token not in str(error)
    assert graph.token not in repr(error.args)
    return error


def test_a_lead_is_fetched_with_the_documented_fields(meta_graph):
    lead_id = meta_graph.add_lead(
        email="ana@brandt-spedition.de", full_name="Ana Brandt", phone_number="+4930123456"
    )
    fetched = _fetch(meta_graph, lead_id)
    assert fetched.lead["id"] == lead_id  # type: ignore[attr-defined]
    assert meta_graph.requests[-1].fields == FIELDS.split(",")
    assert meta_graph.requests[-1].token_ok
    assert meta_graph.requests[-1].path == f"/v21.0/{lead_id}"
    flat = flatten(fetched.lead, kind="meta_lead_ads")  # type: ignore[attr-defined]
    assert flat.canonical is not None
    assert flat.canonical["email"] == "ana@brandt-spedition.de"
    assert fetched.usage_percent == 3  # type: ignore[attr-defined]


def test_an_expired_or_unknown_token_is_an_auth_error(meta_graph):
    lead_id = meta_graph.add_lead(email="a@b.de")
    unknown = _error(meta_graph, lead_id, token="not-the-token")
    assert (unknown.kind, unknown.code) == ("auth", 190)
    meta_graph.expire_token()
    expired = _error(meta_graph, lead_id)
    assert (expired.kind, expired.code, expired.subcode) == ("auth", 190, 463)
    assert "Session has expired" in str(expired)


@pytest.mark.parametrize("code", [4, 17, 32, 613, 80001, 80014])
def test_throttling_is_rate_limited_for_metas_estimated_time(meta_graph, code):
    lead_id = meta_graph.add_lead(email="a@b.de")
    meta_graph.throttle_next(code=code, minutes=3)
    error = _error(meta_graph, lead_id)
    assert (error.kind, error.code) == ("rate_limited", code)
    assert error.retry_after == 180


def test_5xx_and_502_html_are_unavailable_garbage_is_malformed(meta_graph):
    lead_id = meta_graph.add_lead(email="a@b.de")
    meta_graph.fail_next()
    assert _error(meta_graph, lead_id).kind == "unavailable"
    meta_graph.bad_gateway_next()
    assert _error(meta_graph, lead_id).kind == "unavailable"
    meta_graph.garbage_next()
    assert _error(meta_graph, lead_id).kind == "malformed"
    assert _fetch(meta_graph, lead_id).lead["id"] == lead_id  # type: ignore[attr-defined]


def test_a_slow_answer_is_a_timeout(meta_graph):
    lead_id = meta_graph.add_lead(email="a@b.de")
    meta_graph.slow_next(seconds=1.0)
    error = _error(meta_graph, lead_id, timeout=0.3)
    assert error.kind == "unavailable"
    assert "0.3 s" in str(error)


def test_a_lead_that_does_not_exist_is_not_found(meta_graph):
    error = _error(meta_graph, "999000111")
    assert (error.kind, error.code, error.subcode) == ("not_found", 100, 33)


def test_an_unreachable_graph_names_no_url_and_no_token(meta_graph):
    url = meta_graph.url
    meta_graph.stop()
    error = _error(meta_graph, "123", base_url=url)
    assert error.kind == "unavailable"
    assert "access_token" not in str(error)


def test_an_unknown_version_is_rejected(meta_graph):
    assert _error(meta_graph, "123", version="latest").kind == "rejected"


def test_the_token_never_reaches_a_log_line(meta_graph, caplog):
    lead_id = meta_graph.add_lead(email="a@b.de")
    # httpx's own level too: another test (simulate_traffic) may have quietened it.
    with caplog.at_level("DEBUG"), caplog.at_level("DEBUG", logger="httpx"):
        _fetch(meta_graph, lead_id)
        _error(meta_graph, "999000111")
    assert caplog.records  # httpx logged the requests...
    assert meta_graph.token not in caplog.text  # ...without the token
    assert "access_token=[redacted]" in caplog.text


# --- over HTTPS, as graph.facebook.com is served -----------------------------------------


def test_over_https_a_bundle_that_trusts_the_certificate_fetches(meta_graph_tls, recwarn):
    lead_id = meta_graph_tls.add_lead(email="ana@brandt-spedition.de")
    fetched = _fetch(meta_graph_tls, lead_id, verify=meta_graph_tls.ca_file)
    assert fetched.lead["id"] == lead_id  # type: ignore[attr-defined]
    assert meta_graph_tls.url.startswith("https://")
    # httpx 0.28 deprecates a path as ``verify``: the bundle is read into an SSL context.
    assert not [w for w in recwarn if "verify" in str(w.message)]


def test_over_https_a_certificate_no_bundle_trusts_is_unavailable(meta_graph_tls, tmp_path):
    lead_id = meta_graph_tls.add_lead(email="ana@brandt-spedition.de")
    # The system's CAs (no bundle set) do not know the stand-in's own certificate.
    system = _error(meta_graph_tls, lead_id, verify=True)
    assert system.kind == "unavailable"
    assert "certificate" in str(system)
    # Another CA's bundle does not either.
    other = MetaGraphStandIn(tls=True)
    try:
        wrong = _error(meta_graph_tls, lead_id, verify=other.ca_file)
    finally:
        other.close()
    assert wrong.kind == "unavailable"
    assert "certificate" in str(wrong)
    assert meta_graph_tls.requests == []  # nothing was sent over the refused connection


def test_a_bundle_that_cannot_be_read_is_unavailable_and_says_so(meta_graph_tls, tmp_path):
    lead_id = meta_graph_tls.add_lead(email="ana@brandt-spedition.de")
    missing = _error(meta_graph_tls, lead_id, verify=str(tmp_path / "nowhere.pem"))
    assert missing.kind == "unavailable"
    assert "META_GRAPH_CA_BUNDLE" in str(missing)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    unreadable = _error(meta_graph_tls, lead_id, verify=str(garbage))
    assert unreadable.kind == "unavailable"
    assert "META_GRAPH_CA_BUNDLE" in str(unreadable)


@contextlib.contextmanager
def _dripping_graph(*, body: bytes, every: float) -> Iterator[str]:
    """A Graph stand-in that answers 200 at once, then sends its body a byte every ``every``
    seconds: each read is quick, the answer as a whole is not."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):
                for i in range(len(body)):
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    time.sleep(every)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_answer_that_drips_in_is_a_timeout_of_the_whole_call():
    # On the I/O worker (a threads pool: no task time limit) this call is all that bounds the
    # thread. A byte every 0.2 s never trips httpx's per-read timeout of 1 s; the whole answer
    # (40 bytes, 8 s) must still be given up once the timeout has passed.
    body = b'{"id": "123", "field_data": []}'.ljust(40)
    with _dripping_graph(body=body, every=0.2) as url:
        started = time.monotonic()
        with pytest.raises(GraphError) as caught:
            fetch_lead(leadgen_id="123", token="t", base_url=url, version="v21.0", timeout=1.0)
        elapsed = time.monotonic() - started
    assert caught.value.kind == "unavailable"
    assert "1 s" in str(caught.value)
    assert elapsed < 3.0, f"the call took {elapsed:.1f} s with a timeout of 1 s"
