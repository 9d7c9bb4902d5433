"""Issue 20: the status URL answered in front of Django's ASGI handler (leads.status_asgi), and
the status process's shared reads (leads.status_api._Reads).

The fast path is driven here as uvicorn drives it, by ASGI messages, with the Django view's
answers as the reference: same status, document and headers. tests/leads/test_status_wake.py
runs the real uvicorn process with config.asgi (the fast path in front) end to end.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from django.utils import timezone

from leads import status_api
from leads.models import Lead, LeadStatus
from leads.status import status_link_make
from leads.status_asgi import status_fast_path
from leads.status_wake import status_waiters
from tests.leads.factories import LeadFactory, SourceFactory
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db(transaction=True)


class Django:
    """What stands behind the fast path: records the requests passed through to it."""

    def __init__(self) -> None:
        self.passed: list[tuple[str, str]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.passed.append((scope["method"], scope["path"]))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def _call(
    app: Any, method: str, path: str, query: str = "", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    all_headers = {"host": "127.0.0.1", **(headers or {})}
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in all_headers.items()],
        "server": ("127.0.0.1", 8001),
        "client": ("127.0.0.1", 50000),
    }
    sent: list[dict[str, Any]] = []
    received: list[bool] = []

    async def receive() -> dict[str, Any]:
        if received:  # as a server does: nothing more until the client goes away
            await asyncio.Event().wait()
        received.append(True)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = sent[0]
    response_headers = {k.decode().title(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], response_headers, body


@pytest.fixture
def website():
    return SourceFactory(slug="website", cors_origins="https://www.example.com")


def _path(lead: Lead) -> str:
    url = status_link_make(lead_id=lead.id, source=lead.source, now=timezone.now()).url
    return url[url.index("/api/v1/status/") :]


def test_the_fast_path_answers_as_the_django_view_does(client, website):
    lead = LeadFactory(source=website)
    path = _path(lead)
    django = Django()
    app = status_fast_path(django)
    origin = {"origin": "https://www.example.com"}

    status, headers, body = _call(app, "GET", path, headers=origin)
    reference = client.get(path, HTTP_ORIGIN="https://www.example.com")
    assert status == reference.status_code == 200
    assert (
        json.loads(body)
        == reference.json()
        == {
            "id": str(lead.id),
            "status": "received",
            "owner": None,
        }
    )
    for name in (
        "Cache-Control",
        "Access-Control-Allow-Origin",
        "Vary",
        "X-Content-Type-Options",
        "X-Frame-Options",
        "Referrer-Policy",
    ):
        assert headers[name] == reference[name], name
    assert headers["Content-Type"] == "application/json"

    status, headers, body = _call(app, "OPTIONS", path, headers=origin)
    assert (status, body) == (204, b"")
    assert headers["Access-Control-Allow-Methods"] == "GET, OPTIONS"
    status, headers, body = _call(app, "HEAD", path)
    assert (status, body) == (200, b"")
    assert "Access-Control-Allow-Origin" not in headers  # no origin, no CORS
    assert django.passed == []


def test_forged_and_bad_waits_and_hosts_get_the_views_json_errors(client, website, settings):
    lead = LeadFactory(source=website)
    path = _path(lead)
    app = status_fast_path(Django())
    forged = path[:-3] + ("A" if path[-3] != "A" else "B") + path[-2:]
    other = f"/api/v1/status/{uuid.uuid4()}/{path.rstrip('/').rsplit('/', 1)[1]}/"
    for bad in (forged, other, "/api/v1/status/not-a-uuid/x/"):
        status, headers, body = _call(app, "GET", bad)
        assert status == client.get(bad).status_code == 404
        assert json.loads(body)["error"]["code"] == "not_found"
        assert headers["Cache-Control"] == "no-store"
        assert headers["Access-Control-Allow-Origin"] == "*"
    status, _, body = _call(app, "GET", path, query="wait=soon")
    assert status == 400
    assert json.loads(body)["error"]["code"] == "invalid_wait"
    settings.ALLOWED_HOSTS = ["leads.example.com"]
    status, _, body = _call(app, "GET", path, headers={"host": "evil.example"})
    assert status == 400
    assert json.loads(body)["error"]["code"] == "bad_request"
    status, _, _ = _call(app, "GET", path, headers={"host": "leads.example.com"})
    assert status == 200


def test_other_urls_and_methods_go_to_django_unchanged(website):
    lead = LeadFactory(source=website)
    path = _path(lead)
    django = Django()
    app = status_fast_path(django)
    assert _call(app, "POST", path)[0] == 299
    assert _call(app, "GET", "/api/v1/leads/")[0] == 299
    assert _call(app, "GET", path + "extra/")[0] == 299
    assert django.passed == [("POST", path), ("GET", "/api/v1/leads/"), ("GET", path + "extra/")]


def test_a_database_outage_is_a_503_with_retry_after(website, settings):
    lead = LeadFactory(source=website)
    path = _path(lead)
    settings.DB_UNAVAILABLE_RETRY_AFTER_SECONDS = 7
    from django.db import connections

    real = connections["default"].settings_dict.copy()
    app = status_fast_path(Django())

    def unreachable() -> None:
        # The read thread's connection, pointed where no database answers.
        from django.db import connection

        connection.close()
        if connection.vendor == "postgresql":
            connection.settings_dict.update({"HOST": "127.0.0.1", "PORT": "1"})
        else:
            connection.settings_dict.update({"NAME": "/nonexistent/folder/db.sqlite3"})

    asyncio.run(_in_readers(unreachable))
    try:
        status, headers, body = _call(app, "GET", path)
    finally:
        asyncio.run(_in_readers(lambda: _restore(real)))
    assert status == 503
    assert headers["Retry-After"] == "7"
    assert json.loads(body)["error"]["code"] == "service_unavailable"


def _restore(real: dict[str, Any]) -> None:
    from django.db import connection

    connection.close()
    connection.settings_dict.clear()
    connection.settings_dict.update(real)


async def _in_readers(function: Any) -> None:
    """Run ``function`` once in every read thread of the status process."""
    loop = asyncio.get_running_loop()
    barrier_size = status_api._readers._max_workers
    import threading

    barrier = threading.Barrier(barrier_size)

    def each() -> None:
        function()
        barrier.wait(10)

    await asyncio.gather(
        *(loop.run_in_executor(status_api._readers, each) for _ in range(barrier_size))
    )


class CountingReads:
    """The real read, counted (how many times the status process read a lead)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = status_api.lead_status_read_pooled

        def counted(lead_id: uuid.UUID) -> Any:
            self.calls += 1
            return real(lead_id)

        monkeypatch.setattr(status_api, "lead_status_read_pooled", counted)


def test_pages_woken_for_one_lead_share_one_read(website, monkeypatch, settings):
    """200 pages waiting for one lead are woken together: one read answers them all (each
    also read it once on arriving — also shared when they arrive together)."""
    settings.STATUS_MAX_WAITERS_PER_LEAD = 200  # past the per-lead bound on purpose
    lead = LeadFactory(source=website)
    reads = CountingReads(monkeypatch)

    async def scenario() -> list[Any]:
        waiting = [asyncio.ensure_future(status_api._status(lead.id, 5.0)) for _ in range(200)]
        while status_waiters.waiting() < 200:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # every page has read the lead once and waits
        arrived = reads.calls
        await asyncio.get_running_loop().run_in_executor(
            status_api._readers,
            lambda: Lead.objects.filter(pk=lead.id).update(status=LeadStatus.EXCLUDED),
        )
        status_waiters.wake(str(lead.id))
        answers = await asyncio.gather(*waiting)
        return [arrived, *answers]

    arrived, *answers = asyncio.run(scenario())
    assert all(a is not None and a.document["status"] == "not_assigned" for a in answers)
    assert arrived < 200  # the arrivals' reads were shared too (a handful, not 200)
    assert reads.calls - arrived == 1


def test_a_read_started_before_a_page_registered_is_not_shared_with_it(website, monkeypatch):
    """A page joins only a read that began after it registered: an older read may predate an
    outcome whose announcement the page never heard."""
    lead = LeadFactory(source=website)
    reads = CountingReads(monkeypatch)

    async def scenario() -> tuple[Any, Any]:
        loop = asyncio.get_running_loop()
        early = asyncio.ensure_future(status_api._reads.read(lead.id, loop.time()))
        await asyncio.sleep(0)  # the early read is in flight
        later = asyncio.ensure_future(status_api._reads.read(lead.id, loop.time() + 0.001))
        return await early, await later

    asyncio.run(scenario())
    assert reads.calls == 2


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_a_write_through_the_asgi_application_is_a_json_405(website, method):
    """config.asgi's application (the fast path in front of Django's handler, CSRF middleware
    and all): a write to a status URL is the view's JSON 405 with its Allow header."""
    from django.core.asgi import get_asgi_application

    app = status_fast_path(get_asgi_application())
    status, headers, body = _call(app, method, _path(LeadFactory(source=website)))
    assert status == 405, body
    assert headers["Content-Type"].startswith("application/json")
    assert headers["Allow"] == "GET, HEAD, OPTIONS"
    assert json.loads(body)["error"]["code"] == "method_not_allowed"


def test_a_query_with_too_many_fields_is_the_django_views_400(client, website, settings):
    """The fast path parses the query string under DATA_UPLOAD_MAX_NUMBER_FIELDS, as Django's
    QueryDict does (TooManyFieldsSent): past it, the same JSON 400, never parsed unbounded."""
    path = _path(LeadFactory(source=website))
    limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
    query = "&".join(f"f{i}=x" for i in range(limit)) + "&wait=0"
    reference = client.get(f"{path}?{query}")
    status, headers, body = _call(status_fast_path(Django()), "GET", path, query=query)
    assert status == reference.status_code == 400, body
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == reference.json()
    assert json.loads(body)["error"]["code"] == "bad_request"
    at_limit = "&".join(f"f{i}=x" for i in range(limit - 1)) + "&wait=0"
    status, _, body = _call(status_fast_path(Django()), "GET", path, query=at_limit)
    assert status == client.get(f"{path}?{at_limit}").status_code == 200, body


def test_while_the_listener_cannot_reach_redis_a_final_outcome_is_answered_at_once(
    website, settings
):
    """A waiting request reads the lead before it waits for the listener: with Redis away (the
    listener is not hearing), an outcome already written is answered at once, not after the
    second the request gives the listener to subscribe; a pending lead still waits its bound."""
    settings.STATUS_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    done = LeadFactory(source=website, status=LeadStatus.EXCLUDED)
    pending = LeadFactory(source=website)

    async def scenario() -> tuple[float, Any, float, Any]:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(status_api._status(pending.id, 1.0))  # starts the listener
        await asyncio.sleep(0.3)  # its first attempt is refused (Redis answers no connect)
        started = loop.time()
        final = await status_api._status(done.id, 5.0)
        final_took = loop.time() - started
        await first
        started = loop.time()
        waiting = await status_api._status(pending.id, 1.5)
        return final_took, final, loop.time() - started, waiting

    final_took, final, pending_took, waiting = asyncio.run(scenario())
    assert final is not None
    assert final.document["status"] == "not_assigned"
    assert final_took < 0.5, final_took
    assert waiting is not None
    assert waiting.document["status"] == "received"
    assert pending_took >= 1.4, pending_took
