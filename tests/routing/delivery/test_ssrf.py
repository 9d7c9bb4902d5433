"""Webhook URLs into the private network are refused at save and at send (SSRF)."""

from __future__ import annotations

import contextlib
import errno
import http.client
import select
import socket
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils.deprecation import RemovedInDjango60Warning
from pytest_httpserver import HTTPServer

from audit.models import Event
from routing.delivery import egress
from routing.delivery.admin import WebhookEndpointForm
from routing.delivery.models import DeliveryStatus, WebhookEndpoint
from routing.delivery.services import delivery_attempt, endpoint_send_test
from routing.models import Assignment
from routing.monitoring.alerts import notify_webhook
from tests.routing.delivery.conftest import webhook_delivery

pytestmark = pytest.mark.reliability

_real_getaddrinfo = socket.getaddrinfo

# Names a resolver of ours answers, so no test depends on the real DNS.
FAKE_DNS = {
    "hooks.example.com": ["93.184.216.34"],
    "v6hooks.example.com": ["2606:4700:4700::1111"],
    "internal.example.com": ["10.1.2.3"],
    "metadata.example.com": ["169.254.169.254"],
    "mixed.example.com": ["93.184.216.34", "192.168.0.10"],
    "mapped.example.com": ["::ffff:127.0.0.1"],
}


def fake_resolver(table: dict[str, list[str]]) -> Callable[..., Any]:
    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host in table:
            out = []
            for address in table[host]:
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                sockaddr = (address, port, 0, 0) if ":" in address else (address, port)
                out.append((family, socket.SOCK_STREAM, 6, "", sockaddr))
            return out
        return _real_getaddrinfo(host, port, *args, **kwargs)

    return getaddrinfo


@pytest.fixture(autouse=True)
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    table = {name: list(addresses) for name, addresses in FAKE_DNS.items()}
    monkeypatch.setattr(socket, "getaddrinfo", fake_resolver(table))
    return table


REFUSED = [
    "http://127.0.0.1/hook",
    "http://127.1.2.3:8080/hook",
    "http://localhost/hook",
    "http://LOCALHOST/hook",
    "http://10.0.0.1/",
    "http://172.16.5.4/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://100.64.0.1/",  # carrier-grade NAT
    "http://0.0.0.0/",
    "http://224.0.0.1/",  # multicast
    "http://240.0.0.1/",  # reserved
    "http://2130706433/",  # 127.0.0.1 as a decimal number
    "http://0x7f000001/",  # ... in hex
    "http://017700000001/",  # ... in octal
    "http://127.1/",  # ... shortened
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",  # IPv4-mapped IPv6
    "http://[::ffff:a9fe:a9fe]/",  # 169.254.169.254, mapped
    "http://[64:ff9b::a00:1]/",  # NAT64 of 10.0.0.1
    "http://[2002:7f00:1::]/",  # 6to4 of 127.0.0.1
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://[::]/",
    "http://internal.example.com/hook",
    "http://metadata.example.com/",
    "http://mixed.example.com/",  # one private address is enough to refuse
    "http://mapped.example.com/",
]


@pytest.mark.parametrize("url", REFUSED)
def test_urls_into_the_private_network_are_refused(url: str) -> None:
    with pytest.raises(egress.UrlRefused) as refused:
        egress.url_resolve(url, allow_private=False)
    assert not isinstance(refused.value, egress.HostUnresolved), refused.value


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/leadrouter",
        "http://hooks.example.com:8443/x?y=1",
        "https://v6hooks.example.com/",
        "https://93.184.216.34/",
        "https://[2606:4700:4700::1111]/",
    ],
)
def test_public_urls_are_allowed(url: str) -> None:
    assert egress.url_resolve(url, allow_private=False)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://hooks.example.com/", "only http"),
        ("file:///etc/passwd", "only http"),
        ("gopher://127.0.0.1:6379/_INFO", "only http"),
        ("https://user:pass@hooks.example.com/", "credentials"),
        ("http:///path-only", "no host"),
        ("http://hooks.example.com:99999/", "not a valid URL"),
    ],
)
def test_malformed_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(egress.UrlRefused, match=message):
        egress.url_resolve(url, allow_private=True)


def test_allow_private_lets_loopback_through() -> None:
    assert egress.url_resolve("http://127.0.0.1/", allow_private=True)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:6379/",
        "http://169.254.169.254/",
        "http://localhost/",
        "http://[::1]/",
        "http://2130706433/",
        "http://[::ffff:127.0.0.1]/",
        "http://internal.example.com/",
    ],
)
def test_refused_at_save_by_the_model_and_the_admin_form(url: str) -> None:
    endpoint = WebhookEndpoint(name="x", url=url)
    with pytest.raises(ValidationError) as invalid:
        endpoint.full_clean()
    assert "url" in invalid.value.message_dict
    form = WebhookEndpointForm(
        data={"name": "x", "url": url, "active": "on", "events": ["lead.assigned"]}
    )
    assert not form.is_valid()
    assert "url" in form.errors


@pytest.mark.django_db
def test_a_public_url_saves(settings: Any) -> None:
    form = WebhookEndpointForm(
        data={"name": "CRM", "url": "https://hooks.example.com/x", "events": ["lead.assigned"]}
    )
    assert form.is_valid(), form.errors
    endpoint = form.save()
    assert endpoint.secret.startswith("whsec_")
    assert endpoint.events == ["lead.assigned"]


@pytest.mark.django_db
def test_refused_at_send_when_the_url_was_stored_without_the_check(
    assignment: Assignment, httpserver: HTTPServer, published: list[int]
) -> None:
    """E.g. saved while DELIVERY_ALLOW_PRIVATE_URLS was on: the send checks again."""
    httpserver.expect_request("/hook").respond_with_data("")
    endpoint = WebhookEndpoint.objects.create(name="CRM", url=httpserver.url_for("/hook"))
    delivery = webhook_delivery(assignment, endpoint)

    assert delivery_attempt(delivery_id=delivery.pk) == "failed"

    assert httpserver.log == []  # nothing reached the loopback server
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.FAILED
    assert "refused" in delivery.last_error
    assert delivery.attempt_log.get().outcome == "refused"
    assert Event.objects.filter(lead_id=assignment.lead_id, type="delivery_failed").exists()


@pytest.mark.django_db
def test_a_name_that_resolves_public_at_save_and_loopback_at_send_is_refused(
    assignment: Assignment,
    httpserver: HTTPServer,
    published: list[int],
    dns: dict[str, list[str]],
) -> None:
    """DNS rebinding: the check runs again at send, and the connection uses what it checked."""
    httpserver.expect_request("/hook").respond_with_data("")
    dns["rebind.example.com"] = ["93.184.216.34"]
    endpoint = WebhookEndpoint(name="CRM", url=f"http://rebind.example.com:{httpserver.port}/hook")
    endpoint.full_clean()
    endpoint.save()
    delivery = webhook_delivery(assignment, endpoint)

    dns["rebind.example.com"] = ["127.0.0.1"]
    assert delivery_attempt(delivery_id=delivery.pk) == "failed"
    assert httpserver.log == []
    assert "127.0.0.1 is a loopback address" in delivery.attempt_log.get().error


@pytest.mark.django_db
def test_a_name_that_stops_resolving_is_retried_not_failed(
    assignment: Assignment, published: list[int]
) -> None:
    endpoint = WebhookEndpoint.objects.create(name="CRM", url="https://gone.invalid/hook")
    delivery = webhook_delivery(assignment, endpoint)
    assert delivery_attempt(delivery_id=delivery.pk) == "retry"
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.PENDING
    assert "does not resolve" in delivery.last_error


def test_the_pinned_request_sends_the_original_host_header(httpserver: HTTPServer) -> None:
    """The connection goes to the checked address, the Host header keeps the name."""
    httpserver.expect_request("/h").respond_with_data("ok")
    response = egress.post(
        httpserver.url_for("/h"), body=b"{}", headers={}, timeout=5, allow_private=True
    )
    assert response.status == 200
    ((request, _),) = httpserver.log
    assert request.headers["Host"] == f"localhost:{httpserver.port}"


# --- At send, nothing connects (the guide's "0 packets to internal ports") ------------------------


class Trap:
    """Listening sockets on 127.0.0.1 and [::1], one port, that count every connection made to
    them: a TCP handshake that completed sits in the backlog until accepted, so ``connections``
    (which drains it) misses none, however short-lived. Stands in for tcpdump on ``lo``."""

    def __init__(self) -> None:
        self.accepted = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        for _ in range(20):  # a port free on both loopbacks
            v4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            v4.bind(("127.0.0.1", 0))
            self.port = int(v4.getsockname()[1])
            v6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                v6.bind(("::1", self.port))
            except OSError:
                v4.close()
                v6.close()
                continue
            break
        else:
            raise AssertionError("no port free on both 127.0.0.1 and ::1")
        self.sockets = [v4, v6]
        for sock in self.sockets:
            sock.listen(64)
            sock.setblocking(False)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _accept_all(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return
                raise
            # Counted before the close: the close is what ends the client's request, and a
            # count made after it raced the test's next read (a flaky 0 under load).
            with self._lock:
                self.accepted += 1
            conn.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select(self.sockets, [], [], 0.05)
            for sock in ready:
                with contextlib.suppress(OSError):
                    self._accept_all(sock)

    def connections(self) -> int:
        """Connections made so far, the backlog drained first."""
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                self._accept_all(sock)
        with self._lock:
            return self.accepted

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def trap() -> Iterator[Trap]:
    found = Trap()
    yield found
    found.close()


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every address this process tries to connect a socket to (for the targets no listener of
    the test can stand in for: the machine's Redis on 6379, the metadata address)."""
    tried: list[Any] = []
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def connect(self: socket.socket, address: Any) -> None:
        tried.append(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        tried.append(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    return tried


# (URL, the address a connection would go to). {port} is the trap's.
INTERNAL = [
    ("http://127.0.0.1:6379/", ("127.0.0.1", 6379)),
    ("http://127.0.0.1:{port}/hook", ("127.0.0.1", "{port}")),
    ("http://169.254.169.254/latest/meta-data/", ("169.254.169.254", 80)),
    ("http://localhost:{port}/hook", ("localhost", "{port}")),
    ("http://[::1]:{port}/hook", ("::1", "{port}")),
]


def _targets(tried: list[Any], host: str, port: int) -> list[Any]:
    hosts = {"127.0.0.1", "::1"} if host == "localhost" else {host}
    return [a for a in tried if isinstance(a, tuple) and a[0] in hosts and a[1] == port]


def _send_everywhere(url: str, assignment: Assignment, settings: Any) -> None:
    """Every outbound path at send, with ``url`` stored past the save check (saved while the
    private-URL setting was on, or edited in the database): a delivery attempt, the admin's
    signed test message, and the alert webhook. Each refuses."""
    endpoint = WebhookEndpoint.objects.create(name="CRM", url=url)
    delivery = webhook_delivery(assignment, endpoint)
    assert delivery_attempt(delivery_id=delivery.pk) == "failed"
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.FAILED
    attempt = delivery.attempt_log.get()
    assert attempt.outcome == "refused", attempt.error
    assert attempt.status_code is None
    assert "refused" in endpoint_send_test(endpoint=endpoint)
    settings.ALERT_WEBHOOK_URL = url
    settings.ALERT_ALLOW_PRIVATE_URLS = False
    assert notify_webhook(text="x", payload={}) is False


@pytest.mark.django_db
@pytest.mark.parametrize(("template", "target"), INTERNAL)
def test_internal_urls_are_refused_at_save_and_at_send_and_nothing_connects(
    template: str,
    target: tuple[str, Any],
    assignment: Assignment,
    published: list[int],
    trap: Trap,
    connects: list[Any],
    settings: Any,
) -> None:
    url = template.format(port=trap.port)
    port = trap.port if target[1] == "{port}" else int(target[1])
    settings.DELIVERY_ALLOW_PRIVATE_URLS = False

    with pytest.raises(ValidationError) as invalid:  # at save
        WebhookEndpoint(name="x", url=url).full_clean()
    assert "url" in invalid.value.message_dict

    _send_everywhere(url, assignment, settings)  # at send
    assert _targets(connects, target[0], port) == []
    assert trap.connections() == 0

    if port == trap.port:  # the control: allowed, the same URL does reach the trap
        with contextlib.suppress(OSError, http.client.HTTPException):
            egress.post(url, body=b"{}", headers={}, timeout=2, allow_private=True)
        assert trap.connections() >= 1
        assert _targets(connects, target[0], port) != []


@pytest.mark.django_db
@pytest.mark.parametrize("rebound_to", ["127.0.0.1", "::1", "169.254.169.254"])
def test_dns_rebinding_public_at_save_internal_at_send_connects_to_nothing(
    rebound_to: str,
    assignment: Assignment,
    published: list[int],
    dns: dict[str, list[str]],
    trap: Trap,
    connects: list[Any],
    settings: Any,
) -> None:
    """The name is public when saved (the save check passes, as it must), then answers an
    internal address: refused at send (the name is resolved again, at the product's one point
    of resolution, ``socket.getaddrinfo`` in egress.url_resolve), and no socket is opened."""
    settings.DELIVERY_ALLOW_PRIVATE_URLS = False
    url = f"http://rebind.example.com:{trap.port}/hook"
    dns["rebind.example.com"] = ["93.184.216.34"]
    WebhookEndpoint(name="x", url=url).full_clean()  # public at save: accepted

    dns["rebind.example.com"] = [rebound_to]
    with pytest.raises(ValidationError):  # saving it again now is refused too
        WebhookEndpoint(name="y", url=url).full_clean()
    _send_everywhere(url, assignment, settings)
    assert [a for a in connects if isinstance(a, tuple) and a[1] == trap.port] == []
    assert trap.connections() == 0

    if rebound_to in ("127.0.0.1", "::1"):  # the control: allowed, the name reaches the trap
        with contextlib.suppress(OSError, http.client.HTTPException):
            egress.post(url, body=b"{}", headers={}, timeout=2, allow_private=True)
        assert trap.connections() >= 1
        assert _targets(connects, rebound_to, trap.port) != []


@pytest.mark.django_db
def test_the_admin_form_reads_a_url_typed_without_scheme_as_https() -> None:
    # Django 6 changes URLField's default scheme from http to https; the form names it, so an
    # endpoint typed as "hooks.example.com/x" is the same today as after the upgrade, without
    # Django's deprecation warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error", RemovedInDjango60Warning)
        form = WebhookEndpointForm(
            data={"name": "CRM", "url": "hooks.example.com/x", "events": ["lead.assigned"]}
        )
        assert form.is_valid(), form.errors
    assert form.cleaned_data["url"] == "https://hooks.example.com/x"
