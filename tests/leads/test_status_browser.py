"""Issue 20 in real headless Chromium against the real stack: a plain HTML form page on its own
origin posts to a source, and the embed script shows the prospect their rep.

gunicorn accepts the lead, a celery worker routes it, uvicorn serves the status URL the script
waits on (woken by the worker); the page is served from a third origin the source lists for CORS.
"""

from __future__ import annotations

import contextlib
import http.server
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from leads.models import Lead
from routing.models import Rep
from routing.rules_io import rules_import
from tests.leads.factories import SourceFactory
from tests.support.processes import (
    BIN,
    celery_worker,
    child_env,
    free_port,
    start,
    status_server,
    wait_until,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

RULES = {
    "reps": [{"email": "ana@northwind.example", "name": "Ana Lima", "timezone": "UTC"}],
    "teams": [
        {"name": "Web", "strategy": "round_robin", "members": [{"rep": "ana@northwind.example"}]}
    ],
    "value_lists": [{"name": "competitors", "values": ["rival.io"]}],
    "ruleset": {
        "name": "Inbound",
        "rules": [
            {
                "name": "Exclude competitors",
                "priority": 10,
                "when": {
                    "all": [{"field": "email_domain", "op": "in_list", "value": "competitors"}]
                },
                "action": {"type": "exclude", "reason": "competitor"},
            },
            {"name": "Everyone", "priority": 20, "action": {"type": "team", "team": "Web"}},
        ],
    },
}

FALLBACK = "Thank you! A rep will be in touch shortly."


def _page(
    web: str,
    *,
    action: str | None = None,
    attributes: str = "",
    fields: str = "",
    scripts: int = 1,
) -> str:
    # What a marketing site would write: a form, a fallback line, one script tag.
    action = action or f"{web}/api/v1/intake/website/?token=token-website"
    script = f'<script src="{web}/embed/owner.js" async></script>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Book a demo</title></head>
<body>
  <h1>Book a demo</h1>
  <form method="post" action="{action}" data-leadrouter {attributes}>
    <label>Work e-mail <input name="email" type="email" required></label>
    <label>Company <input name="company"></label>
    {fields}
    <button type="submit">Book a demo</button>
  </form>
  <p id="owner" data-leadrouter-owner hidden>{FALLBACK}</p>
  {script * scripts}
</body></html>"""


@pytest.fixture
def form_site() -> Iterator[tuple[str, dict[str, str]]]:
    """A web server of the form page's own origin; set ``html["page"]`` to what it serves."""
    html: dict[str, str] = {"page": ""}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html["page"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", html
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _gunicorn(status_base: str) -> Iterator[str]:
    """gunicorn (intake, and the embed script) writing ``status_base`` into each status URL."""
    import urllib.request

    port = free_port()
    env = child_env(
        PORT=str(port), HOST="127.0.0.1", WEB_CONCURRENCY="1", STATUS_BASE_URL=status_base
    )
    args = [str(BIN / "gunicorn"), "config.wsgi:application", "--config", "config/gunicorn.py"]
    web = start(args, env)
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_until(answers, timeout=60, message=lambda: f"no gunicorn:\n{web.text()}")
        yield base
    finally:
        web.stop()


@pytest.fixture
def stack() -> Iterator[str]:
    """gunicorn (intake), uvicorn (status URLs) and a celery worker; yields the web origin."""
    with (
        status_server() as status_base,
        _gunicorn(status_base) as base,
        celery_worker(queues=["routing.realtime", "routing"]),
    ):
        yield base


def test_a_form_page_shows_the_prospect_their_rep_and_falls_back_otherwise(
    chromium: str, stack: str, form_site: tuple[str, dict[str, str]]
) -> None:
    from playwright.sync_api import expect, sync_playwright

    origin, html = form_site
    html["page"] = _page(stack)
    rules_import(RULES, publish=True)
    Rep.objects.filter(email="ana@northwind.example").update(
        display_name="Ana",
        photo_url="https://cdn.example.com/ana.jpg",
        booking_url="https://cal.example.com/ana",
    )
    SourceFactory(slug="website", allow_query_token=True, cors_origins=origin)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            # The photo's host does not exist here: answer it, so the page makes no outside call.
            page.route("https://cdn.example.com/**", lambda route: route.fulfill(status=204))
            page.goto(f"{origin}/")
            page.fill("input[name=email]", "pat@prospect.io")
            page.fill("input[name=company]", "Prospect Ltd")
            page.click("button[type=submit]")
            owner = page.locator("#owner")
            expect(owner).to_have_attribute("data-leadrouter-state", "owner", timeout=15_000)
            expect(owner).to_have_text("Your rep is Ana \u2014 book a time")
            expect(owner.locator("a")).to_have_attribute("href", "https://cal.example.com/ana")
            expect(owner.locator("img")).to_have_attribute("src", "https://cdn.example.com/ana.jpg")
            expect(page.locator("form")).to_be_hidden()
            assert page.url == f"{origin}/"  # the page stayed; it never showed the JSON 202

            # A lead that gets no owner (a competitor, excluded): the page keeps its own text.
            page.goto(f"{origin}/")
            page.fill("input[name=email]", "spy@rival.io")
            page.click("button[type=submit]")
            expect(owner).to_have_attribute("data-leadrouter-state", "fallback", timeout=15_000)
            expect(owner).to_have_text(FALLBACK)
            expect(owner).to_be_visible()

            # A WordPress-style form with a field named "action" (which shadows form.action in
            # the DOM): the lead still goes to the form's action attribute, and shows its rep.
            html["page"] = _page(
                stack, fields='<input type="hidden" name="action" value="demo_request">'
            )
            page.goto(f"{origin}/")
            page.fill("input[name=email]", "lee@prospect.io")
            page.click("button[type=submit]")
            expect(owner).to_have_attribute("data-leadrouter-state", "owner", timeout=15_000)
            expect(owner).to_have_text("Your rep is Ana \u2014 book a time")
            assert errors == []
        finally:
            browser.close()


# --- The script when LeadRouter is slow, down or answers nonsense ----------------------------

DEADLINE = 3  # data-leadrouter-wait on the form pages below, in seconds


@pytest.fixture
def stall() -> Iterator[tuple[str, list[bytes]]]:
    """A server that takes every connection and never answers a byte (what it was sent is
    kept): a status process or intake that hangs."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []
    held: list[socket.socket] = []
    closed = threading.Event()

    def hold(conn: socket.socket) -> None:
        conn.settimeout(0.2)
        while not closed.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            received.append(data)

    def accept() -> None:
        while not closed.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            threading.Thread(target=hold, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", received
    finally:
        closed.set()
        listener.close()
        for conn in held:
            with contextlib.suppress(OSError):
                conn.close()


@pytest.fixture
def intake(stall: tuple[str, list[bytes]], form_site: tuple[str, dict[str, str]]) -> Iterator[str]:
    """gunicorn alone, handing out status URLs on the stalling server (no worker routes), and
    the form page's source (CORS for the form site)."""
    SourceFactory(slug="website", allow_query_token=True, cors_origins=form_site[0])
    with _gunicorn(stall[0]) as base:
        yield base


@contextlib.contextmanager
def _browser(chromium: str) -> Iterator[tuple[Any, list[str]]]:
    """A fresh page of headless Chromium, and the errors its scripts throw. (Playwright's sync
    API runs an event loop in this thread: no ORM call inside, Django refuses them there.)"""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            yield page, errors
        finally:
            browser.close()


def _submit_and_time_the_fallback(page: Any, origin: str) -> float:
    """Submit the form page at ``origin``; seconds until the fallback shows (asserted)."""
    from playwright.sync_api import expect

    page.goto(f"{origin}/")
    page.fill("input[name=email]", "pat@prospect.io")
    started = time.monotonic()
    page.click("button[type=submit]")
    owner = page.locator("#owner")
    expect(owner).to_have_attribute("data-leadrouter-state", "fallback", timeout=15_000)
    took = time.monotonic() - started
    expect(owner).to_have_text(FALLBACK)
    expect(owner).to_be_visible()
    return took


def _within_the_deadline(took: float) -> None:
    assert took < DEADLINE + 1.0, f"the fallback came {took:.1f} s after the submit"


def test_the_fallback_shows_by_the_deadline_when_the_intake_post_hangs(
    intake: str,
    stall: tuple[str, list[bytes]],
    form_site: tuple[str, dict[str, str]],
    chromium: str,
) -> None:
    origin, html = form_site
    html["page"] = _page(
        intake,
        action=f"{stall[0]}/api/v1/intake/website/?token=token-website",
        attributes=f'data-leadrouter-wait="{DEADLINE}"',
    )
    with _browser(chromium) as (page, errors):
        took = _submit_and_time_the_fallback(page, origin)
    _within_the_deadline(took)
    assert took >= DEADLINE - 0.5  # it did wait for the POST, as long as it was told
    assert any(b"POST /api/v1/intake/website/" in data for data in stall[1])
    assert errors == []


def test_the_fallback_shows_at_once_when_the_intake_refuses_the_post(
    intake: str, form_site: tuple[str, dict[str, str]], chromium: str
) -> None:
    origin, html = form_site
    html["page"] = _page(
        intake,
        action=f"{intake}/api/v1/intake/website/?token=not-the-token",
        attributes=f'data-leadrouter-wait="{DEADLINE}"',
    )
    with _browser(chromium) as (page, errors):
        took = _submit_and_time_the_fallback(page, origin)
    assert took < 2.0
    assert errors == []


def test_the_fallback_shows_by_the_deadline_when_the_status_url_stalls(
    intake: str,
    stall: tuple[str, list[bytes]],
    form_site: tuple[str, dict[str, str]],
    chromium: str,
) -> None:
    origin, html = form_site
    html["page"] = _page(intake, attributes=f'data-leadrouter-wait="{DEADLINE}"')
    with _browser(chromium) as (page, errors):
        took = _submit_and_time_the_fallback(page, origin)
    _within_the_deadline(took)
    assert took >= DEADLINE - 0.5
    asked = [data for data in stall[1] if b"GET /api/v1/status/" in data]
    assert len(asked) == 1  # one status request, hanging; the script gave up on it in time
    wait = re.search(rb"[?&]wait=(\d+)", asked[0])
    assert wait is not None
    assert 1 <= int(wait[1]) < DEADLINE  # asked to answer before the deadline
    assert Lead.objects.count() == 1
    assert errors == []


@pytest.mark.parametrize(
    ("answer", "most_requests"),
    [
        # Garbage: no JSON, JSON that is no status document, a 5xx: asked again, at most once
        # a second, until the deadline; then the fallback.
        ({"status": 200, "body": "<html>oops</html>", "content_type": "text/html"}, DEADLINE + 1),
        ({"status": 200, "body": "null"}, DEADLINE + 1),
        ({"status": 200, "body": "[1, 2]"}, DEADLINE + 1),
        ({"status": 502, "body": "Bad gateway", "content_type": "text/plain"}, DEADLINE + 1),
        # A server that answers "received" at once (it ignores ?wait=): paced, never hammered.
        ({"status": 200, "body": '{"id": "x", "status": "received", "owner": null}'}, DEADLINE + 1),
        # The link expired: nothing to wait for.
        ({"status": 404, "body": '{"error": {"code": "not_found"}}'}, 1),
    ],
    ids=["html", "null", "array", "502", "instant-received", "404"],
)
def test_the_fallback_shows_by_the_deadline_whatever_the_status_url_answers(
    intake: str,
    stall: tuple[str, list[bytes]],
    form_site: tuple[str, dict[str, str]],
    chromium: str,
    answer: dict[str, Any],
    most_requests: int,
) -> None:
    origin, html = form_site
    html["page"] = _page(intake, attributes=f'data-leadrouter-wait="{DEADLINE}"')
    asked: list[str] = []

    def status_answer(route: Any) -> None:
        asked.append(route.request.url)
        route.fulfill(
            status=answer["status"],
            body=answer["body"],
            content_type=answer.get("content_type", "application/json"),
            headers={"Access-Control-Allow-Origin": origin},
        )

    with _browser(chromium) as (page, errors):
        page.route(f"{stall[0]}/api/v1/status/**", status_answer)
        took = _submit_and_time_the_fallback(page, origin)
        time.sleep(1.0)  # nothing more is asked after the fallback
    _within_the_deadline(took)
    assert 1 <= len(asked) <= most_requests, asked
    if most_requests == 1:
        assert took < 2.0
    assert errors == []


def test_a_script_included_twice_and_a_submit_fired_twice_send_one_lead(
    intake: str,
    stall: tuple[str, list[bytes]],
    form_site: tuple[str, dict[str, str]],
    chromium: str,
) -> None:
    from playwright.sync_api import expect

    origin, html = form_site
    html["page"] = _page(intake, attributes=f'data-leadrouter-wait="{DEADLINE}"', scripts=2)
    posts: list[str] = []
    statuses: list[str] = []

    def status_answer(route: Any) -> None:
        statuses.append(route.request.url)
        route.fulfill(
            status=200,
            body='{"id": "x", "status": "not_assigned", "owner": null}',
            content_type="application/json",
            headers={"Access-Control-Allow-Origin": origin},
        )

    with _browser(chromium) as (page, errors):
        page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
        page.route(f"{stall[0]}/api/v1/status/**", status_answer)
        page.goto(f"{origin}/")
        page.wait_for_load_state("load")  # both copies of the script have run
        page.fill("input[name=email]", "pat@prospect.io")
        # Submits fired again and again, as a double click or a page's own handler may.
        page.evaluate(
            """() => {
                const form = document.forms[0];
                form.requestSubmit();
                form.requestSubmit();
                form.dispatchEvent(new Event("submit", {bubbles: true, cancelable: true}));
            }"""
        )
        owner = page.locator("#owner")
        expect(owner).to_have_attribute("data-leadrouter-state", "fallback", timeout=15_000)
        time.sleep(0.5)  # anything sent twice would have been sent by now
        assert page.url == f"{origin}/"
    assert len(posts) == 1, posts
    assert len(statuses) == 1, statuses
    assert Lead.objects.count() == 1
    assert errors == []
