"""Issue 20 in real headless Chromium against the real stack: a plain HTML form page on its own
origin posts to a source, and the embed script shows the prospect their rep.

gunicorn accepts the lead, a celery worker routes it, uvicorn serves the status URL the script
waits on (woken by the worker); the page is served from a third origin the source lists for CORS.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

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


def _page(web: str) -> str:
    # What a marketing site would write: a form, a fallback line, one script tag.
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Book a demo</title></head>
<body>
  <h1>Book a demo</h1>
  <form method="post" action="{web}/api/v1/intake/website/?token=token-website" data-leadrouter>
    <label>Work e-mail <input name="email" type="email" required></label>
    <label>Company <input name="company"></label>
    <button type="submit">Book a demo</button>
  </form>
  <p id="owner" data-leadrouter-owner hidden>{FALLBACK}</p>
  <script src="{web}/embed/owner.js" async></script>
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


@pytest.fixture
def stack() -> Iterator[str]:
    """gunicorn (intake), uvicorn (status URLs) and a celery worker; yields the web origin."""
    import urllib.request

    with status_server() as status_base:
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
            with celery_worker(queues=["routing.realtime", "routing"]):
                yield base
        finally:
            web.stop()


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
        finally:
            browser.close()
