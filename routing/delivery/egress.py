"""Outbound URLs: which ones we refuse (SSRF), and a POST pinned to the address we checked.

A webhook URL is checked when it is saved and again before every attempt: host names are
resolved and every address they resolve to must be public, unless
``DELIVERY_ALLOW_PRIVATE_URLS`` is on. The request then connects to the address that was
checked (with the original host name in ``Host`` and for TLS), so a DNS answer that changes
between the check and the connection cannot send it into the private network. Redirects are
never followed. The whole answer, status line and headers included, must come within the
timeout (``routing.deadline``): deliveries run on the I/O worker's threads, and a receiver that
trickles its answer must not hold one.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from routing.deadline import Deadline, DeadlinePassed, within

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

RESPONSE_EXCERPT_CHARS = 1000
_MAX_READ_BYTES = 64 * 1024


class UrlRefused(Exception):
    """The URL may not be called: bad form, or it leads to a non-public address."""


class HostUnresolved(UrlRefused):
    """The host name does not resolve (now): possibly transient, so worth a retry at send."""


def address_refusal(address: IPAddress) -> str | None:
    """Why this address may not be called, or None when it is a public unicast address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in ipaddress.IPv6Network("64:ff9b::/96"):  # NAT64
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            reason = address_refusal(embedded)
            return f"{address} embeds {embedded}: {reason}" if reason else None
    for check, what in (
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (address.is_unspecified, "unspecified"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
        (not address.is_global, "not globally routable"),
    ):
        if check:
            return f"{address} is a {what} address"
    return None


def _parse(url: str) -> SplitResult:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise UrlRefused(f"not a valid URL: {exc}") from None
    if parts.scheme not in {"http", "https"}:
        raise UrlRefused("only http:// and https:// URLs can receive webhooks")
    if not parts.hostname:
        raise UrlRefused("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("credentials in the URL are not allowed: they would leak into logs")
    return parts


def url_resolve(url: str, *, allow_private: bool) -> list[IPAddress]:
    """The addresses ``url`` would connect to; raises UrlRefused if any may not be called.

    Every resolved address must pass, not just the first: otherwise a name with one public
    and one internal address would get through on the luck of the draw.
    """
    parts = _parse(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise HostUnresolved(f"the host {host!r} does not resolve: {exc}") from None
    addresses: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise HostUnresolved(f"the host {host!r} does not resolve")
    if not allow_private:
        for address in addresses:
            reason = address_refusal(address)
            if reason:
                raise UrlRefused(f"{host} resolves to {reason}")
    return addresses


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    excerpt: str


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to a fixed address, verifying the certificate for the URL's host name."""

    def __init__(self, address: str, port: int, *, server_hostname: str, timeout: float) -> None:
        super().__init__(address, port, timeout=timeout, context=ssl.create_default_context())
        self._server_hostname = server_hostname

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(  # type: ignore[attr-defined]
            sock, server_hostname=self._server_hostname
        )


def _connect(
    scheme: str, addresses: list[IPAddress], port: int, *, host: str, timeout: float
) -> http.client.HTTPConnection:
    """A connection to the first of the checked addresses that accepts one (like a browser)."""
    last_error: OSError | None = None
    for address in addresses:
        connection: http.client.HTTPConnection
        if scheme == "https":
            connection = _PinnedHTTPSConnection(
                str(address), port, server_hostname=host, timeout=timeout
            )
        else:
            connection = http.client.HTTPConnection(str(address), port, timeout=timeout)
        try:
            connection.connect()
        except OSError as exc:
            connection.close()
            last_error = exc
            continue
        return connection
    raise last_error or HostUnresolved(f"the host {host!r} has no address")


def post(
    url: str,
    *,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
    allow_private: bool,
) -> Response:
    """POST ``body`` to ``url`` once: checked, pinned, no redirects, bounded in time and size.

    Raises UrlRefused (or HostUnresolved), or OSError / http.client.HTTPException /
    TimeoutError on a network failure.
    """
    parts = _parse(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    connection = _connect(
        parts.scheme,
        url_resolve(url, allow_private=allow_private),
        port,
        host=host,
        timeout=timeout,
    )
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    host_header = f"[{host}]" if ":" in host else host
    if parts.port:
        host_header += f":{parts.port}"
    with within(timeout) as deadline:
        try:
            deadline.join(connection)
            return _exchange(connection, path, host_header, body, headers, deadline)
        except (OSError, http.client.HTTPException):
            if deadline.passed:
                raise DeadlinePassed(f"no complete answer within {timeout:g} s") from None
            raise
        finally:
            connection.close()


def _exchange(
    connection: http.client.HTTPConnection,
    path: str,
    host_header: str,
    body: bytes,
    headers: dict[str, str],
    deadline: Deadline,
) -> Response:
    """Send the request and read the answer within ``deadline``: its watchdog shuts the socket
    down when it passes, so a receiver trickling its status line or headers cannot hold the
    thread; a body still arriving then is cut where it is (the status is what counts)."""
    connection.request(
        "POST",
        path,
        body=body,
        headers={
            "Host": host_header,
            "Content-Type": "application/json",
            "User-Agent": "LeadRouter-Webhooks/1",
            **headers,
        },
    )
    response = connection.getresponse()
    chunks: list[bytes] = []
    read = 0
    while read < _MAX_READ_BYTES and not deadline.passed:
        try:
            chunk = response.read1(8192) if hasattr(response, "read1") else response.read(8192)
        except (OSError, http.client.HTTPException):
            if deadline.passed:
                break
            raise
        if not chunk:
            break
        chunks.append(chunk)
        read += len(chunk)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    return Response(
        status=response.status,
        headers={k.lower(): v for k, v in response.getheaders()},
        excerpt=text[:RESPONSE_EXCERPT_CHARS],
    )
