"""A stand-in HubSpot account over HTTPS, for tests of ``routing.crm.hubspot``.

It speaks the REST contract HubSpot documents for what the module uses (CRM API v3), so the
official ``hubspot-api-client`` can be pointed at it (``host=standin.url``,
``ssl_ca_cert=standin.ca_file``, ``access_token=standin.token``):

- ``POST /crm/v3/objects/{contacts|companies}/search`` ("Search the CRM",
  https://developers.hubspot.com/docs/guides/api/crm/search): ``filterGroups`` are ORed, the
  ``filters`` of a group ANDed; operators EQ, NEQ, LT, LTE, GT, GTE, BETWEEN (``highValue``),
  IN / NOT_IN (``values``), HAS_PROPERTY, NOT_HAS_PROPERTY, CONTAINS_TOKEN / NOT_CONTAINS_TOKEN
  (``*`` wildcards; a ``;``-separated value such as ``hs_additional_emails`` matches on any of
  its elements). String comparisons are case-insensitive (as HubSpot's for email and domain);
  datetime properties compare as instants (filter values in epoch milliseconds or ISO 8601),
  number properties as numbers. ``sorts`` as ``{"propertyName", "direction"}`` objects or as
  strings (``"lastmodifieddate"``, ``"-lastmodifieddate"``); ``query`` (a text search over the
  default searchable properties); ``properties``; ``limit`` (default 10, at most 200);
  ``after`` (an offset; at most 10,000 results can be paged through). At most
  ``MAX_FILTER_GROUPS`` (5) groups, ``MAX_FILTERS_PER_GROUP`` (6) filters in a group and
  ``MAX_FILTERS`` (18) in all, the limits the guide states (the 2024-08 changelog "Expanded
  Filtering Capabilities" announced 5 / 10 / 25; set the class attributes to test those).
  Breaking a limit, an unknown property or operator answers ``400 VALIDATION_ERROR``. Answer:
  ``{"total", "results", "paging": {"next": {"after"}}}`` (paging only when there is more).
- ``GET /crm/v3/objects/{type}/{id}`` (``properties`` comma-separated and/or repeated;
  ``idProperty=email``, or ``leadrouter_lead_id``, a custom unique-value property;
  ``archived=true``): the object, or ``404 OBJECT_NOT_FOUND`` ("Object not found.  objectId are
  usually numeric."). ``GET /crm/v3/objects/{type}`` lists a page (``limit``, ``after``).
- ``POST /crm/v3/objects/{type}`` ``{"properties", "associations"?}``: ``201`` with the object.
  A contact whose primary ``email`` another contact has (case-insensitively; HubSpot stores
  emails in lower case) answers ``409 CONFLICT`` "Contact already exists. Existing ID: N".
  Invalid properties answer ``400 VALIDATION_ERROR`` "Property values were not valid: [...]"
  listing every bad one: PROPERTY_DOESNT_EXIST, READ_ONLY_VALUE (``hs_object_id``,
  ``lastmodifieddate``, ``hs_lastmodifieddate``, ``hubspot_owner_assigneddate``),
  INVALID_OPTION (an enumeration value, or a ``hubspot_owner_id`` that is no active owner's id),
  INVALID_DATETIME / INVALID_NUMBER.
- ``PATCH /crm/v3/objects/{type}/{id}`` (``idProperty`` too): ``200`` with the object; the same
  validation, 404 and 409. ``DELETE /crm/v3/objects/{type}/{id}``: archives it, ``204``.
  Every write moves ``lastmodifieddate`` (companies: ``hs_lastmodifieddate``) and setting a new
  ``hubspot_owner_id`` stamps ``hubspot_owner_assigneddate``, as HubSpot does.
- ``POST /crm/v3/objects/{type}/batch/read`` ``{"properties", "inputs": [{"id"}], "idProperty"?}``
  ("Batch read", https://developers.hubspot.com/docs/guides/api/crm/objects/contacts): at most
  100 inputs. ``200 {"status": "COMPLETE", "results", "startedAt", "completedAt"}``; when some
  are missing ``207`` with ``"numErrors"`` and ``"errors": [{"status": "error", "category":
  "OBJECT_NOT_FOUND", "message": "Could not get some CONTACT objects, ...", "context": {"ids"}}]``.
- ``GET /crm/v3/owners/`` (https://developers.hubspot.com/docs/guides/api/crm/owners):
  ``limit`` (default 100, at most 500), ``after`` (an opaque cursor), ``email``, ``archived``:
  ``false`` (the default) lists active owners only, ``true`` archived ones only.
  ``{"results": [{"id", "email", "type", "firstName", "lastName", "userId",
  "userIdIncludingInactive", "createdAt", "updatedAt", "archived", "teams"}], "paging": {"next":
  {"after", "link"}}}``. ``GET /crm/v3/owners/{ownerId}`` too.
- ``GET /account-info/v3/details`` ("Retrieve account details"): ``portalId``, ``uiDomain``,
  ``accountType``, ``timeZone``, ``companyCurrency``, ``additionalCurrencies``, ``utcOffset``,
  ``utcOffsetMilliseconds``, ``dataHostingLocation``; it needs no CRM scope.

Object ids are numeric strings (contacts from 101, companies from 5001, owners from 9001).
Property values are strings or null (a requested property that is not set is null, one not
requested is left out); ``hs_object_id``, ``createdate`` and ``lastmodifieddate`` (companies
``hs_lastmodifieddate``) always come back. Datetimes (properties, ``createdAt``, ``updatedAt``)
are ISO 8601 in UTC with milliseconds, ``2024-05-01T12:00:00.000Z``: HubSpot keeps datetimes in
epoch milliseconds, so a seeded or written value loses any microseconds.

Errors have HubSpot's body (https://developers.hubspot.com/docs/api-reference/error-handling):
``{"status": "error", "message", "correlationId", "category", "context"?, "errors"?}``:
- ``401 INVALID_AUTHENTICATION`` "Authentication credentials not found. ..." for a missing or
  unknown token; ``401 EXPIRED_AUTHENTICATION`` "The OAuth token used to make this call expired
  N second(s) ago." (``context: {"expire time": [...]}``) after ``expire_tokens()`` or for the
  token ``rotate_token()`` replaced; ``403 MISSING_SCOPES`` "This app hasn't been granted all
  required scopes ..." (``errors[0].context.requiredGranularScopes``) after ``revoke_scope()``.
- ``429 {"status": "error", "message": "You have reached your secondly limit.", "errorType":
  "RATE_LIMIT", "correlationId", "policyName": "SECONDLY"}`` ("API usage guidelines and
  limits", https://developers.hubspot.com/docs/guides/apps/api-usage/usage-details). HubSpot
  documents no ``Retry-After`` for a 429 (only for ``477 Migration in Progress``), so
  ``limit_next`` sends one only when asked to.
- ``5xx`` (``fail_next``): ``{"status": "error", "message": "internal error", "category":
  "INTERNAL_ERROR"}``, or for 502/504 an HTML page, as the load balancer in front answers.
- An unknown path answers ``404`` and a wrong method ``405`` (with ``Allow``), both with a
  message and no category (so a request to a wrong path is not mistaken for a missing object);
  an unknown object type ``400`` "Unable to infer object type from: ...".

Every answer but a search's carries the rate-limit headers HubSpot documents for private apps,
counted from the requests the stand-in saw: ``X-HubSpot-RateLimit-Daily``, ``-Daily-Remaining``,
``-Interval-Milliseconds``, ``-Max``, ``-Remaining``, ``-Secondly``, ``-Secondly-Remaining``
(the search endpoints are documented not to include them). With ``enforce_rate_limits=True``
the limits are enforced (burst ``Max`` per ``Interval-Milliseconds``: 429 TEN_SECONDLY_ROLLING;
search, 5 a second: 429 SECONDLY); by default they are only reported.

Its connections are ``TCP_NODELAY`` (an answer's headers and body go in two sends; with
Nagle's algorithm the body would wait ~40 ms for the client's delayed ACK, so tests and
benchmarks would measure that instead of the client).

Use it through the ``hubspot_standin`` fixture; ``requests`` is the request log (never the
Authorization header), ``max_per_second()`` the most requests seen in a one-second window, and
the controls (``down``, ``expire_tokens``, ``revoke_scope``, ``fail_next``, ``limit_next``,
``garbage_next``, ``respond_next``, ``set_delay``) break it in the ways HubSpot can break.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import re
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import pytest

from tests.support.crm_salesforce import _certificate

__all__ = ["HubSpotStandIn", "LoggedRequest", "hs_time", "hubspot_standin"]

# Property name -> type: string, datetime, number, enumeration, owner.
CONTACT_PROPERTIES: dict[str, str] = {
    "email": "string", "firstname": "string", "lastname": "string", "company": "string",
    "phone": "string", "jobtitle": "string", "country": "string",
    "hs_additional_emails": "string", "hubspot_owner_id": "owner",
    "hubspot_owner_assigneddate": "datetime", "hs_lead_status": "enumeration",
    "lifecyclestage": "enumeration", "notes_last_contacted": "datetime",
    "hs_last_sales_activity_timestamp": "datetime", "associatedcompanyid": "number",
    "createdate": "datetime", "lastmodifieddate": "datetime", "hs_object_id": "number",
    "leadrouter_lead_id": "string",
}  # fmt: skip
COMPANY_PROPERTIES: dict[str, str] = {
    "name": "string", "domain": "string", "website": "string", "hubspot_owner_id": "owner",
    "hubspot_owner_assigneddate": "datetime", "hs_lastmodifieddate": "datetime",
    "createdate": "datetime", "hs_object_id": "number",
}  # fmt: skip
OPTIONS: dict[str, tuple[str, ...]] = {
    "hs_lead_status": (
        "NEW", "OPEN", "IN_PROGRESS", "OPEN_DEAL", "UNQUALIFIED", "ATTEMPTED_TO_CONTACT",
        "CONNECTED", "BAD_TIMING",
    ),
    "lifecyclestage": (
        "subscriber", "lead", "marketingqualifiedlead", "salesqualifiedlead", "opportunity",
        "customer", "evangelist", "other",
    ),
}  # fmt: skip
READ_ONLY = frozenset(
    {"hs_object_id", "lastmodifieddate", "hs_lastmodifieddate", "hubspot_owner_assigneddate"}
)
AUTH_MISSING = (
    "Authentication credentials not found. This API supports OAuth 2.0 authentication and you "
    "can find more details at https://developers.hubspot.com/docs/methods/auth/oauth-overview"
)
SCOPES_MISSING = (
    "This app hasn't been granted all required scopes to make this call. Read more about "
    "required scopes here: https://developers.hubspot.com/scopes."
)
NOT_FOUND = "Object not found.  objectId are usually numeric."
SCOPES = (
    "crm.objects.contacts.read",
    "crm.objects.contacts.write",
    "crm.objects.companies.read",
    "crm.objects.companies.write",
    "crm.objects.owners.read",
)
OPERATORS = frozenset(
    {
        "EQ", "NEQ", "LT", "LTE", "GT", "GTE", "BETWEEN", "IN", "NOT_IN", "HAS_PROPERTY",
        "NOT_HAS_PROPERTY", "CONTAINS_TOKEN", "NOT_CONTAINS_TOKEN",
    }
)  # fmt: skip
RATE_LIMIT_POLICIES = {
    "SECONDLY": "You have reached your secondly limit.",
    "TEN_SECONDLY_ROLLING": "You have reached your ten_secondly_rolling limit.",
    "DAILY": "You have reached your daily limit.",
}
JSON_TYPE = "application/json;charset=utf-8"


@dataclass(frozen=True)
class ObjectType:
    name: str  # the path segment: contacts, companies
    label: str  # in batch errors: CONTACT, COMPANY
    type_id: str  # 0-1, 0-2
    properties: dict[str, str]
    modified: str  # the last-modified property
    defaults: tuple[str, ...]  # returned when no properties are asked for
    searchable: tuple[str, ...]  # what ``query`` searches
    id_properties: tuple[str, ...]  # allowed as ``idProperty``
    first_id: int

    @property
    def always(self) -> tuple[str, ...]:
        return ("hs_object_id", "createdate", self.modified)

    def scope(self, write: bool) -> str:
        return f"crm.objects.{self.name}.{'write' if write else 'read'}"


CONTACTS = ObjectType(
    name="contacts",
    label="CONTACT",
    type_id="0-1",
    properties=CONTACT_PROPERTIES,
    modified="lastmodifieddate",
    defaults=("createdate", "email", "firstname", "hs_object_id", "lastmodifieddate", "lastname"),
    searchable=("email", "firstname", "lastname", "phone", "company", "hs_additional_emails"),
    id_properties=("hs_object_id", "email", "leadrouter_lead_id"),
    first_id=101,
)
COMPANIES = ObjectType(
    name="companies",
    label="COMPANY",
    type_id="0-2",
    properties=COMPANY_PROPERTIES,
    modified="hs_lastmodifieddate",
    defaults=("createdate", "domain", "hs_lastmodifieddate", "hs_object_id", "name"),
    searchable=("name", "domain", "website"),
    id_properties=("hs_object_id",),
    first_id=5001,
)
OBJECT_TYPES = {"contacts": CONTACTS, "companies": COMPANIES}
_ALIASES = {
    "contacts": "contacts", "contact": "contacts", "0-1": "contacts",
    "companies": "companies", "company": "companies", "0-2": "companies",
}  # fmt: skip


def hs_time(value: dt.datetime) -> str:
    """HubSpot's datetime format in v3 answers: ``2024-05-01T12:00:00.000Z`` (UTC, ms)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    value = value.astimezone(dt.UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def _parse_instant(value: Any) -> dt.datetime | None:
    """A datetime from what HubSpot accepts: epoch milliseconds or ISO 8601 (a date: midnight)."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return dt.datetime.fromtimestamp(value / 1000, tz=dt.UTC)
    text = str(value).strip()
    if re.fullmatch(r"-?\d{1,15}", text):
        return dt.datetime.fromtimestamp(int(text) / 1000, tz=dt.UTC)
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _epoch_ms(text: str) -> int:
    instant = _parse_instant(text)
    if instant is None:
        raise ValueError(text)
    return int(instant.timestamp() * 1000)


class Problem(Exception):
    """An error answer, raised from deep inside a handler."""

    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or {}


def _error(status: int, message: str, category: str | None = None, **extra: Any) -> Problem:
    body: dict[str, Any] = {"status": "error", "message": message}
    body["correlationId"] = str(uuid.uuid4())
    if category:
        body["category"] = category
    body.update(extra)
    return Problem(status, body)


def _validation(message: str, **extra: Any) -> Problem:
    return _error(400, message, "VALIDATION_ERROR", **extra)


@dataclass
class LoggedRequest:
    """One request as the stand-in saw it: never the Authorization header (``bearer`` only says
    whether one came as ``Bearer <token>``)."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    at: float  # time.monotonic() on arrival
    headers: dict[str, str] = field(default_factory=dict)
    bearer: bool = False
    status: int = 0  # the status answered (0 while in flight or when the connection broke)


@dataclass
class Answer:
    status: int
    body: Any = None  # JSON-encoded unless bytes or None
    content_type: str = JSON_TYPE
    headers: dict[str, str] = field(default_factory=dict)
    rate_headers: bool = True


@dataclass
class _Record:
    id: str
    properties: dict[str, str]
    archived: bool = False
    archived_at: str | None = None
    companies: list[str] = field(default_factory=list)


@dataclass
class _Owner:
    id: str
    email: str
    first_name: str
    last_name: str
    user_id: int
    archived: bool
    created_at: str
    updated_at: str
    teams: list[dict[str, Any]] = field(default_factory=list)


class _Server(ThreadingHTTPServer):
    """Keeps the open connections, so ``down()`` can drop kept-alive ones too."""

    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def drop_connections(self) -> None:
        with self.connections_lock:
            connections, self.connections = self.connections, set()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


class HubSpotStandIn:
    """A threaded HTTPS server acting as one HubSpot account (see the module docstring)."""

    MAX_FILTER_GROUPS = 5
    MAX_FILTERS_PER_GROUP = 6
    MAX_FILTERS = 18
    MAX_SEARCH_LIMIT = 200
    MAX_SEARCH_RESULTS = 10_000
    MAX_BATCH_INPUTS = 100
    MAX_OWNERS_LIMIT = 500

    def __init__(
        self,
        *,
        portal_id: int = 24681357,
        ui_domain: str = "app.hubspot.com",
        region: str = "na1",
        daily_limit: int = 250_000,
        burst_limit: int = 100,
        burst_interval_ms: int = 10_000,
        secondly_limit: int = 10,
        search_per_second: int = 5,
        enforce_rate_limits: bool = False,
    ) -> None:
        self.portal_id = portal_id
        self.ui_domain = ui_domain
        self.region = region
        self.daily_limit = daily_limit
        self.burst_limit = burst_limit
        self.burst_interval_ms = burst_interval_ms
        self.secondly_limit = secondly_limit
        self.search_per_second = search_per_second
        self.enforce_rate_limits = enforce_rate_limits
        self.requests: list[LoggedRequest] = []
        self._lock = threading.RLock()
        self._records: dict[str, dict[str, _Record]] = {name: {} for name in OBJECT_TYPES}
        self._next_id = {name: t.first_id for name, t in OBJECT_TYPES.items()}
        self._owners: dict[str, _Owner] = {}
        self._next_owner = 9001
        self._tokens: dict[str, float | None] = {}  # token -> None (valid) or expiry (epoch s)
        self.token = self._new_token()
        self._granted: set[str] = set(SCOPES)
        self._last_stamp = dt.datetime.min.replace(tzinfo=dt.UTC)
        self._hits: list[tuple[float, bool]] = []  # (monotonic time, is a search) per request
        self._daily_used = 0
        self._fail: list[int] = []
        self._limit: list[tuple[float | None, str]] = []
        self._garbage = 0
        self._raw: list[tuple[Answer, re.Pattern[str] | None]] = []
        self._delay = 0.0
        self._trickle: list[float] = []
        self._dir = tempfile.TemporaryDirectory(prefix="hs-standin-")
        cert, key = _certificate(Path(self._dir.name))
        self.ca_file, self._key_file = str(cert), str(key)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> HubSpotStandIn:
        server = _Server(("127.0.0.1", self.port), _handler(self))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca_file, self._key_file)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: close the listening socket and drop open connections."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            server.drop_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def down(self) -> None:
        """Refuse connections (the listening socket is closed) until ``up()``."""
        self.stop()

    def up(self) -> None:
        """Listen again, on the same port."""
        if self._server is None:
            self.start()

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    # -- the account -----------------------------------------------------------------------

    def _stamp(self) -> dt.datetime:
        """Now, to the millisecond, and always later than the last stamp (so writes order)."""
        with self._lock:
            now = dt.datetime.now(dt.UTC)
            now = now.replace(microsecond=now.microsecond // 1000 * 1000)
            if now <= self._last_stamp:
                now = self._last_stamp + dt.timedelta(milliseconds=1)
            self._last_stamp = now
            return now

    def _normalize(self, kind: str, value: Any) -> str | None:
        """A property value as HubSpot keeps it (ValueError when it cannot be one)."""
        if value is None or value == "":
            return None
        if kind == "datetime":
            instant = _parse_instant(value)
            if instant is None:
                raise ValueError(f"{value} is not a valid datetime")
            return hs_time(instant)
        if isinstance(value, bool):
            return "true" if value else "false"
        if kind == "number":
            text = str(value).strip()
            try:
                number = float(text)
            except ValueError:
                raise ValueError(f"{value} is not a valid number") from None
            return str(int(number)) if number.is_integer() else text
        return str(value)

    def _seed(self, t: ObjectType, properties: dict[str, Any]) -> str:
        unknown = sorted(set(properties) - set(t.properties))
        if unknown:
            raise KeyError(f"{t.name} have no property {unknown[0]!r}")
        values = {n: self._normalize(t.properties[n], v) for n, v in properties.items()}
        props = {n: v for n, v in values.items() if v is not None}
        if t is CONTACTS and "email" in props:
            props["email"] = props["email"].strip().lower()
            existing = self._by_email(props["email"])
            if existing is not None:
                raise ValueError(f"a contact with {props['email']} exists: {existing.id}")
        now = hs_time(self._stamp())
        with self._lock:
            record_id = str(self._next_id[t.name])
            self._next_id[t.name] += 1
            props.setdefault("createdate", now)
            props.setdefault(t.modified, now)
            if props.get("hubspot_owner_id"):
                props.setdefault("hubspot_owner_assigneddate", now)
            props["hs_object_id"] = record_id
            self._records[t.name][record_id] = _Record(record_id, props)
        return record_id

    def add_contact(self, **properties: Any) -> str:
        """A contact with ``properties`` (datetimes may be ``datetime``, ISO or epoch ms);
        ``createdate``/``lastmodifieddate`` default to now, and an owner stamps
        ``hubspot_owner_assigneddate``. KeyError for an unknown property, ValueError for an
        email another contact has."""
        return self._seed(CONTACTS, properties)

    def add_company(self, **properties: Any) -> str:
        return self._seed(COMPANIES, properties)

    def add_owner(
        self, email: str, first_name: str = "", last_name: str = "", archived: bool = False
    ) -> str:
        now = hs_time(self._stamp())
        with self._lock:
            owner_id = str(self._next_owner)
            self._next_owner += 1
            self._owners[owner_id] = _Owner(
                id=owner_id,
                email=email,
                first_name=first_name,
                last_name=last_name,
                user_id=int(owner_id) + 7_000_000,
                archived=archived,
                created_at=now,
                updated_at=now,
            )
        return owner_id

    def archive_owner(self, owner_id: str) -> None:
        """The owner's user is deactivated: listed with ``archived=true`` only from now."""
        with self._lock:
            owner = self._owners[owner_id]
            owner.archived = True
            owner.updated_at = hs_time(self._stamp())

    def owner(self, owner_id: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._owners.get(owner_id)
            return self._owner_json(found) if found else None

    def _get(self, t: ObjectType, record_id: str) -> dict[str, str] | None:
        with self._lock:
            record = self._records[t.name].get(str(record_id))
            if record is None or record.archived:
                return None
            return dict(record.properties)

    def contact(self, contact_id: str) -> dict[str, str] | None:
        """The contact's stored properties (None when missing or deleted)."""
        return self._get(CONTACTS, contact_id)

    def company(self, company_id: str) -> dict[str, str] | None:
        return self._get(COMPANIES, company_id)

    def _edit(self, t: ObjectType, record_id: str, properties: dict[str, Any]) -> None:
        with self._lock:
            record = self._records[t.name][str(record_id)]
            unknown = sorted(set(properties) - set(t.properties))
            if unknown:
                raise KeyError(f"{t.name} have no property {unknown[0]!r}")
            values = {n: self._normalize(t.properties[n], v) for n, v in properties.items()}
            self._apply(t, record, values)

    def edit_contact(self, contact_id: str, **properties: Any) -> None:
        """Change a contact as a user in HubSpot would: ``lastmodifieddate`` moves, and
        ``hubspot_owner_assigneddate`` when the owner changes."""
        self._edit(CONTACTS, contact_id, properties)

    def edit_company(self, company_id: str, **properties: Any) -> None:
        self._edit(COMPANIES, company_id, properties)

    def delete_contact(self, contact_id: str) -> None:
        """Delete (archive) the contact, as a user in HubSpot would."""
        with self._lock:
            record = self._records["contacts"][str(contact_id)]
            record.archived = True
            record.archived_at = hs_time(self._stamp())

    def _apply(self, t: ObjectType, record: _Record, values: dict[str, str | None]) -> None:
        now = hs_time(self._stamp())
        props = record.properties
        owner_before = props.get("hubspot_owner_id")
        for name, value in values.items():
            if value is None:
                props.pop(name, None)
            else:
                props[name] = value
        owner_after = props.get("hubspot_owner_id")
        if (
            owner_after
            and owner_after != owner_before
            and "hubspot_owner_assigneddate" not in {n for n, v in values.items() if v is not None}
        ):
            props["hubspot_owner_assigneddate"] = now
        if values.get(t.modified) is None:
            props[t.modified] = now

    def _by_email(self, email: str, *, besides: str = "") -> _Record | None:
        with self._lock:
            for record in self._records["contacts"].values():
                if (
                    not record.archived
                    and record.id != besides
                    and record.properties.get("email", "").lower() == email.lower()
                ):
                    return record
        return None

    # -- controls --------------------------------------------------------------------------

    def _new_token(self) -> str:
        token = f"pat-{self.region}-{uuid.uuid4()}"
        with self._lock:
            self._tokens[token] = None
        return token

    def expire_tokens(self) -> None:
        """Every token issued so far (``token`` too) now answers 401 EXPIRED_AUTHENTICATION."""
        with self._lock:
            for token, expiry in self._tokens.items():
                if expiry is None:
                    self._tokens[token] = time.time()

    def rotate_token(self) -> str:
        """The private app's token is rotated: the old one expires now, the new one (returned,
        and now ``token``) is valid."""
        self.expire_tokens()
        self.token = self._new_token()
        return self.token

    def revoke_scope(self, *scopes: str) -> None:
        """Take ``scopes`` (every CRM scope when none is named) from the app: the calls that
        need one answer 403 MISSING_SCOPES."""
        with self._lock:
            self._granted -= set(scopes or SCOPES)

    def restore_scope(self, *scopes: str) -> None:
        with self._lock:
            self._granted |= set(scopes or SCOPES)

    def fail_next(self, n: int = 1, status: int = 503) -> None:
        """The next ``n`` requests answer ``status``: HubSpot's JSON error body, or for 502/504
        an HTML page as the load balancer sends."""
        with self._lock:
            self._fail += [status] * n

    def limit_next(
        self, n: int = 1, retry_after: float | None = None, policy: str = "SECONDLY"
    ) -> None:
        """The next ``n`` authorized requests answer 429 for ``policy`` (SECONDLY,
        TEN_SECONDLY_ROLLING, DAILY), with ``Retry-After: retry_after`` when it is given
        (HubSpot documents none)."""
        if policy not in RATE_LIMIT_POLICIES:
            raise ValueError(f"policy is one of {sorted(RATE_LIMIT_POLICIES)}")
        with self._lock:
            self._limit += [(retry_after, policy)] * n

    def garbage_next(self, n: int = 1) -> None:
        """The next ``n`` requests answer 200 with an HTML page or truncated JSON (alternating,
        the HTML first)."""
        with self._lock:
            self._garbage += n

    def respond_next(
        self,
        body: Any,
        status: int = 200,
        n: int = 1,
        *,
        path: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """The next ``n`` authorized requests (only those whose path matches the regular
        expression ``path``, when given) answer ``body`` (JSON-encoded unless bytes) as is."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        answer = Answer(status, raw, JSON_TYPE, dict(headers or {}))
        pattern = re.compile(path) if path else None
        with self._lock:
            self._raw += [(answer, pattern)] * n

    def trickle_next(self, n: int = 1, every: float = 0.5) -> None:
        """The next ``n`` answers are sent one byte every ``every`` seconds, status line first:
        each read gets a byte in time, the answer never ends."""
        with self._lock:
            self._trickle += [every] * n

    def take_trickle(self) -> float:
        with self._lock:
            return self._trickle.pop(0) if self._trickle else 0.0

    def set_delay(self, seconds: float) -> None:
        """Every answer is sent ``seconds`` late."""
        self._delay = seconds

    def paths(self, method: str | None = None) -> list[str]:
        """The path of every request (of ``method`` only, when given), in order."""
        with self._lock:
            return [r.path for r in self.requests if method is None or r.method == method]

    def max_per_second(self) -> int:
        """The most requests that arrived within any one-second window."""
        with self._lock:
            times = sorted(r.at for r in self.requests)
        best, start = 0, 0
        for end, at in enumerate(times):
            while at - times[start] >= 1.0:
                start += 1
            best = max(best, end - start + 1)
        return best

    def reset_log(self) -> None:
        with self._lock:
            self.requests.clear()
            self._hits.clear()

    # -- serving -----------------------------------------------------------------------------

    def handle(self, method: str, target: str, headers: Any, raw: bytes) -> Answer:
        parts = urlsplit(target)
        path = unquote(parts.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        auth = headers.get("Authorization", "") or ""
        logged_headers = {
            k: v
            for k, v in headers.items()
            if k.lower() not in ("authorization", "cookie", "proxy-authorization")
        }
        entry = LoggedRequest(
            method, path, query, body, time.monotonic(), logged_headers, auth.startswith("Bearer ")
        )
        search = method == "POST" and path.rstrip("/").endswith("/search")
        with self._lock:
            self.requests.append(entry)
            self._hits.append((entry.at, search))
            self._daily_used += 1
        if self._delay:
            time.sleep(self._delay)
        try:
            answer = self._answer(method, path, query, headers, raw, body, auth, search)
        except Problem as problem:
            answer = Answer(problem.status, problem.body, headers=problem.headers)
        if search:
            answer.rate_headers = False
        correlation = str(uuid.uuid4())
        if isinstance(answer.body, dict) and "correlationId" in answer.body:
            correlation = answer.body["correlationId"]
        answer.headers.setdefault("X-HubSpot-Correlation-Id", correlation)
        if answer.rate_headers:
            answer.headers = {**self._rate_headers(), **answer.headers}
        entry.status = answer.status
        return answer

    def _rate_headers(self, exhausted: bool = False) -> dict[str, str]:
        now = time.monotonic()
        with self._lock:
            burst = sum(
                1 for at, s in self._hits if not s and now - at < self.burst_interval_ms / 1e3
            )
            second = sum(1 for at, s in self._hits if not s and now - at < 1.0)
            daily = self._daily_used
        return {
            "X-HubSpot-RateLimit-Daily": str(self.daily_limit),
            "X-HubSpot-RateLimit-Daily-Remaining": str(max(0, self.daily_limit - daily)),
            "X-HubSpot-RateLimit-Interval-Milliseconds": str(self.burst_interval_ms),
            "X-HubSpot-RateLimit-Max": str(self.burst_limit),
            "X-HubSpot-RateLimit-Remaining": (
                "0" if exhausted else str(max(0, self.burst_limit - burst))
            ),
            "X-HubSpot-RateLimit-Secondly": str(self.secondly_limit),
            "X-HubSpot-RateLimit-Secondly-Remaining": (
                "0" if exhausted else str(max(0, self.secondly_limit - second))
            ),
        }

    def _answer(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: Any,
        raw: bytes,
        body: Any,
        auth: str,
        search: bool,
    ) -> Answer:
        with self._lock:
            if self._fail:
                return self._failure(self._fail.pop(0))
            if self._garbage:
                self._garbage -= 1
                if self._garbage % 2 == 0:
                    page = b"<html><body><h1>HubSpot is down for maintenance</h1></body></html>"
                    return Answer(200, page, "text/html; charset=utf-8", rate_headers=False)
                return Answer(200, b'{"total": 1, "results": [{"id": "10', rate_headers=False)
        self._authenticate(auth)
        route, scope = self._route(method, path)
        if scope is not None:
            with self._lock:
                granted = scope in self._granted
            if not granted:
                raise _error(
                    403,
                    SCOPES_MISSING,
                    "MISSING_SCOPES",
                    errors=[
                        {
                            "message": "One or more of the following scopes are required.",
                            "context": {"requiredGranularScopes": [scope]},
                        }
                    ],
                    links={"scopes": "https://developers.hubspot.com/scopes"},
                )
        self._check_rate(search)
        with self._lock:
            for i, (canned, pattern) in enumerate(self._raw):
                if pattern is None or pattern.search(path):
                    del self._raw[i]
                    return Answer(
                        canned.status, canned.body, canned.content_type, dict(canned.headers)
                    )
        if method in ("POST", "PATCH", "PUT"):
            content_type = headers.get("Content-Type", "") or ""
            if "json" not in content_type.lower():
                raise _error(415, "HTTP 415 Unsupported Media Type")
            if raw and isinstance(body, str):
                raise _validation(f"Invalid input JSON on line 1, column 1: {body[:40]!r}")
        return route(query, body)

    def _failure(self, status: int) -> Answer:
        if status in (502, 504):
            reason = "Bad Gateway" if status == 502 else "Gateway Timeout"
            page = (
                f"<html><head><title>{status} {reason}</title></head><body>"
                f"<center><h1>{status} {reason}</h1></center><hr><center>cloudflare</center>"
                "</body></html>"
            ).encode()
            return Answer(status, page, "text/html; charset=utf-8", rate_headers=False)
        return Answer(
            status,
            {
                "status": "error",
                "message": "internal error",
                "correlationId": str(uuid.uuid4()),
                "category": "INTERNAL_ERROR",
            },
            rate_headers=False,
        )

    def _authenticate(self, auth: str) -> None:
        token = auth[7:].strip() if auth.startswith("Bearer ") else ""
        with self._lock:
            known = token in self._tokens
            expiry = self._tokens.get(token)
        if not token or not known:
            raise _error(401, AUTH_MISSING, "INVALID_AUTHENTICATION")
        if expiry is not None:
            ago = max(0, int(time.time() - expiry))
            unit, amount = "second", ago
            for size, name in ((86_400, "day"), (3_600, "hour"), (60, "minute")):
                if ago >= size:
                    unit, amount = name, ago // size
                    break
            expired_at = hs_time(dt.datetime.fromtimestamp(expiry, tz=dt.UTC))
            raise _error(
                401,
                f"The OAuth token used to make this call expired {amount} {unit}(s) ago.",
                "EXPIRED_AUTHENTICATION",
                context={"expire time": [expired_at]},
            )

    def _check_rate(self, search: bool) -> None:
        with self._lock:
            limited = self._limit.pop(0) if self._limit else None
            if limited is None and self.enforce_rate_limits:
                # This request is already counted in _hits.
                now = time.monotonic()
                if search:
                    recent = sum(1 for at, s in self._hits if s and now - at < 1.0)
                    if recent > self.search_per_second:
                        limited = (None, "SECONDLY")
                else:
                    window = self.burst_interval_ms / 1000
                    recent = sum(1 for at, s in self._hits if not s and now - at < window)
                    if recent > self.burst_limit:
                        limited = (None, "TEN_SECONDLY_ROLLING")
                    elif self._daily_used > self.daily_limit:
                        limited = (None, "DAILY")
        if limited is None:
            return
        retry_after, policy = limited
        problem = Problem(
            429,
            {
                "status": "error",
                "message": RATE_LIMIT_POLICIES[policy],
                "errorType": "RATE_LIMIT",
                "correlationId": str(uuid.uuid4()),
                "policyName": policy,
            },
        )
        if not search:
            problem.headers.update(self._rate_headers(exhausted=True))
        if retry_after is not None:
            problem.headers["Retry-After"] = f"{retry_after:g}"
        raise problem

    # -- routes ------------------------------------------------------------------------------

    def _route(self, method: str, path: str) -> tuple[Any, str | None]:
        """(handler(query, body) -> Answer, the scope it needs); Problem for 400/404/405."""

        def allow(*methods: str) -> None:
            if method not in methods:
                problem = _error(405, f"HTTP 405 Method Not Allowed ({method} {path})")
                problem.headers["Allow"] = ", ".join(methods)
                raise problem

        clean = path.rstrip("/") or "/"
        if clean == "/account-info/v3/details":
            allow("GET")
            return (lambda q, b: Answer(200, self._account_details())), None
        if clean == "/crm/v3/owners":
            allow("GET")
            return self._owners_page, "crm.objects.owners.read"
        match = re.fullmatch(r"/crm/v3/owners/([^/]+)", clean)
        if match:
            allow("GET")
            owner_id = match.group(1)
            return (lambda q, b: self._owner_by_id(owner_id, q)), "crm.objects.owners.read"
        match = re.fullmatch(r"/crm/v3/objects/([^/]+)(?:/(.+))?", clean)
        if match is None:
            raise _error(404, f"HTTP 404 Not Found ({path})")
        name, rest = match.group(1), match.group(2)
        if _ALIASES.get(name.lower()) is None:
            raise _validation(f"Unable to infer object type from: {name}")
        t = OBJECT_TYPES[_ALIASES[name.lower()]]
        if rest is None:
            allow("GET", "POST")
            if method == "POST":
                return (lambda q, b: self._create(t, b)), t.scope(write=True)
            return (lambda q, b: self._list(t, q)), t.scope(write=False)
        if rest == "search":
            allow("POST")
            return (lambda q, b: self._search(t, b)), t.scope(write=False)
        if rest == "batch/read":
            allow("POST")
            return (lambda q, b: self._batch_read(t, q, b)), t.scope(write=False)
        if "/" in rest:
            raise _error(404, f"HTTP 404 Not Found ({path})")
        allow("GET", "PATCH", "DELETE")
        if method == "GET":
            return (lambda q, b: self._read(t, rest, q)), t.scope(write=False)
        if method == "PATCH":
            return (lambda q, b: self._update(t, rest, q, b)), t.scope(write=True)
        return (lambda q, b: self._archive(t, rest)), t.scope(write=True)

    def _account_details(self) -> dict[str, Any]:
        return {
            "portalId": self.portal_id,
            "accountType": "STANDARD",
            "timeZone": "US/Eastern",
            "companyCurrency": "USD",
            "additionalCurrencies": [],
            "utcOffset": "-05:00",
            "utcOffsetMilliseconds": -18_000_000,
            "uiDomain": self.ui_domain,
            "dataHostingLocation": self.region,
        }

    # -- objects -----------------------------------------------------------------------------

    def _shape(self, t: ObjectType, record: _Record, wanted: list[str] | None) -> dict[str, Any]:
        """The object as v3 returns it; ``wanted`` None: the written properties (create, PATCH)."""
        if wanted is None:
            names = [*record.properties, *t.always]
        else:
            names = [n for n in wanted if n in t.properties] or list(t.defaults)
            names += t.always
        shaped: dict[str, Any] = {
            "id": record.id,
            "properties": {n: record.properties.get(n) for n in dict.fromkeys(names)},
            "createdAt": record.properties["createdate"],
            "updatedAt": record.properties[t.modified],
            "archived": record.archived,
        }
        if record.archived:
            shaped["archivedAt"] = record.archived_at
        return shaped

    @staticmethod
    def _wanted(query: dict[str, list[str]], name: str = "properties") -> list[str]:
        return [p.strip() for v in query.get(name, []) for p in v.split(",") if p.strip()]

    @staticmethod
    def _flag(query: dict[str, list[str]], name: str) -> bool:
        value = (query.get(name) or ["false"])[0].strip().lower()
        if value not in ("true", "false"):
            raise _validation(f"{name} must be true or false, not {value!r}")
        return value == "true"

    def _find(
        self, t: ObjectType, ident: str, id_property: str, archived: bool = False
    ) -> _Record | None:
        with self._lock:
            records = self._records[t.name]
            if id_property in ("", "hs_object_id"):
                record = records.get(ident)
                return record if record is not None and record.archived == archived else None
            for record in records.values():
                value = record.properties.get(id_property)
                if (
                    record.archived == archived
                    and value is not None
                    and value.lower() == ident.strip().lower()
                ):
                    return record
        return None

    def _id_property(self, t: ObjectType, value: Any) -> str:
        id_property = str(value or "")
        if id_property and id_property not in t.id_properties:
            if id_property not in t.properties:
                raise _validation(f"Property {id_property} does not exist")
            raise _validation(f"{id_property} is not a unique identifier property")
        return id_property

    def _not_found(self, ident: str) -> Problem:
        return _error(404, NOT_FOUND, "OBJECT_NOT_FOUND", context={"id": [ident]})

    def _read(self, t: ObjectType, ident: str, query: dict[str, list[str]]) -> Answer:
        id_property = self._id_property(t, (query.get("idProperty") or [""])[0])
        record = self._find(t, ident, id_property, archived=self._flag(query, "archived"))
        if record is None:
            raise self._not_found(ident)
        with self._lock:
            return Answer(200, self._shape(t, record, self._wanted(query)))

    def _list(self, t: ObjectType, query: dict[str, list[str]]) -> Answer:
        limit = self._int(query, "limit", 10, 1, 100)
        after = self._int(query, "after", 0, 0, 10**9)
        archived = self._flag(query, "archived")
        with self._lock:
            records = sorted(
                (r for r in self._records[t.name].values() if r.archived == archived),
                key=lambda r: int(r.id),
            )
            page = [self._shape(t, r, self._wanted(query)) for r in records[after : after + limit]]
        answer: dict[str, Any] = {"results": page}
        if after + limit < len(records):
            link = f"{self.url}/crm/v3/objects/{t.name}?{urlencode({'after': after + limit})}"
            answer["paging"] = {"next": {"after": str(after + limit), "link": link}}
        return Answer(200, answer)

    @staticmethod
    def _int(query: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
        raw = (query.get(name) or [""])[0].strip()
        if not raw:
            return default
        if not re.fullmatch(r"\d+", raw) or not low <= int(raw) <= high:
            raise _validation(f"{name} must be an integer from {low} to {high}, not {raw!r}")
        return int(raw)

    def _invalid(self, name: str, message: str, error: str) -> dict[str, Any]:
        return {
            "isValid": False,
            "message": message,
            "error": error,
            "name": name,
            "localizedErrorMessage": message,
            "portalId": self.portal_id,
        }

    def _check_write(self, t: ObjectType, body: Any) -> dict[str, str | None]:
        """The normalized property values of a create or PATCH body, or 400 VALIDATION_ERROR."""
        if not isinstance(body, dict) or not isinstance(body.get("properties", {}), dict):
            raise _validation("Invalid input JSON: properties must be an object")
        problems: list[dict[str, Any]] = []
        values: dict[str, str | None] = {}
        with self._lock:
            active_owners = {o.id for o in self._owners.values() if not o.archived}
        for name, value in body.get("properties", {}).items():
            kind = t.properties.get(name)
            if kind is None:
                message = f'Property "{name}" does not exist'
                problems.append(self._invalid(name, message, "PROPERTY_DOESNT_EXIST"))
                continue
            if name in READ_ONLY:
                message = f"{name} is a read only property; its value cannot be set."
                problems.append(self._invalid(name, message, "READ_ONLY_VALUE"))
                continue
            if isinstance(value, dict | list):
                message = f"{json.dumps(value)} is not a valid property value"
                problems.append(self._invalid(name, message, "INVALID_PROPERTY_VALUE"))
                continue
            try:
                normalized = self._normalize(kind, value)
            except ValueError as exc:
                error = "INVALID_DATETIME" if kind == "datetime" else "INVALID_NUMBER"
                problems.append(self._invalid(name, str(exc), error))
                continue
            if normalized is not None and kind == "owner" and normalized not in active_owners:
                message = f"{normalized} was not one of the allowed options: the active owner ids"
                problems.append(self._invalid(name, message, "INVALID_OPTION"))
                continue
            if normalized is not None and name in OPTIONS and normalized not in OPTIONS[name]:
                allowed = ", ".join(OPTIONS[name])
                message = f"{normalized} was not one of the allowed options: [{allowed}]"
                problems.append(self._invalid(name, message, "INVALID_OPTION"))
                continue
            if name == "email" and normalized is not None:
                normalized = normalized.strip().lower()
            values[name] = normalized
        if problems:
            listed = json.dumps(problems, separators=(",", ":"))
            raise _validation(f"Property values were not valid: {listed}")
        return values

    def _conflict(self, t: ObjectType, values: dict[str, str | None], besides: str = "") -> None:
        email = values.get("email")
        if t is CONTACTS and email:
            existing = self._by_email(email, besides=besides)
            if existing is not None:
                raise _error(409, f"Contact already exists. Existing ID: {existing.id}", "CONFLICT")

    def _associated_companies(self, t: ObjectType, body: dict[str, Any]) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        for association in body.get("associations") or []:
            to = (association or {}).get("to") or {}
            target = str(to.get("id", ""))
            types = association.get("types") or [{}]
            type_ids = [int(x.get("associationTypeId") or 0) for x in types]
            if t is not CONTACTS or self.company(target) is None:
                raise _validation(f"Invalid association: no object {target!r} to associate with")
            found += [(target, type_id) for type_id in type_ids]
        return found

    def _create(self, t: ObjectType, body: Any) -> Answer:
        values = self._check_write(t, body)
        links = self._associated_companies(t, body)
        with self._lock:
            self._conflict(t, values)
            now = hs_time(self._stamp())
            record_id = str(self._next_id[t.name])
            self._next_id[t.name] += 1
            props = {n: v for n, v in values.items() if v is not None}
            props.setdefault("createdate", now)
            props[t.modified] = now
            props["hs_object_id"] = record_id
            if props.get("hubspot_owner_id"):
                props["hubspot_owner_assigneddate"] = now
            record = _Record(record_id, props)
            for company_id, type_id in links:
                record.companies.append(company_id)
                if type_id == 1 or "associatedcompanyid" not in props:
                    props["associatedcompanyid"] = company_id
            self._records[t.name][record_id] = record
            return Answer(201, self._shape(t, record, None))

    def _update(self, t: ObjectType, ident: str, query: dict[str, list[str]], body: Any) -> Answer:
        id_property = self._id_property(t, (query.get("idProperty") or [""])[0])
        values = self._check_write(t, body)
        with self._lock:
            record = self._find(t, ident, id_property)
            if record is None:
                raise self._not_found(ident)
            self._conflict(t, values, besides=record.id)
            self._apply(t, record, values)
            return Answer(200, self._shape(t, record, None))

    def _archive(self, t: ObjectType, ident: str) -> Answer:
        with self._lock:
            record = self._records[t.name].get(ident)
            if record is not None and not record.archived:
                record.archived = True
                record.archived_at = hs_time(self._stamp())
        return Answer(204, None)

    def _batch_read(self, t: ObjectType, query: dict[str, list[str]], body: Any) -> Answer:
        started = hs_time(dt.datetime.now(dt.UTC))
        if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
            raise _validation("Invalid input JSON: inputs must be an array")
        inputs = body["inputs"]
        if len(inputs) > self.MAX_BATCH_INPUTS:
            raise _validation(
                f"Batch input size {len(inputs)} exceeds the limit of {self.MAX_BATCH_INPUTS}"
            )
        id_property = self._id_property(t, body.get("idProperty"))
        wanted = [str(p) for p in body.get("properties") or []]
        archived = self._flag(query, "archived")
        results: list[dict[str, Any]] = []
        missing: list[str] = []
        seen: set[str] = set()
        with self._lock:
            for item in inputs:
                ident = str((item or {}).get("id", "")) if isinstance(item, dict) else ""
                if ident in seen:
                    continue
                seen.add(ident)
                record = self._find(t, ident, id_property, archived=archived)
                if record is None:
                    missing.append(ident)
                else:
                    results.append(self._shape(t, record, wanted))
        answer: dict[str, Any] = {"status": "COMPLETE", "results": results}
        if missing:
            answer["numErrors"] = 1
            answer["errors"] = [
                {
                    "status": "error",
                    "category": "OBJECT_NOT_FOUND",
                    "message": (
                        f"Could not get some {t.label} objects, they may be deleted or not "
                        "exist. Check that ids are valid."
                    ),
                    "context": {"ids": missing},
                }
            ]
        answer["startedAt"] = started
        answer["completedAt"] = hs_time(dt.datetime.now(dt.UTC))
        return Answer(207 if missing else 200, answer)

    # -- search ------------------------------------------------------------------------------

    def _search(self, t: ObjectType, body: Any) -> Answer:
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise _validation("Invalid input JSON: the search request must be an object")
        groups = body.get("filterGroups") or []
        if not isinstance(groups, list):
            raise _validation("filterGroups must be an array")
        if len(groups) > self.MAX_FILTER_GROUPS:
            raise _validation(
                f"Too many filter groups: {len(groups)}. The maximum is {self.MAX_FILTER_GROUPS}."
            )
        checked: list[list[dict[str, Any]]] = []
        total_filters = 0
        for group in groups:
            filters = (group or {}).get("filters") or [] if isinstance(group, dict) else None
            if not isinstance(filters, list):
                raise _validation("each filter group must have a filters array")
            if len(filters) > self.MAX_FILTERS_PER_GROUP:
                raise _validation(
                    f"Too many filters in a filter group: {len(filters)}. The maximum is "
                    f"{self.MAX_FILTERS_PER_GROUP}."
                )
            total_filters += len(filters)
            checked.append([self._check_filter(t, f) for f in filters])
        if total_filters > self.MAX_FILTERS:
            raise _validation(
                f"Too many filters: {total_filters}. The maximum is {self.MAX_FILTERS}."
            )
        sorts = [self._check_sort(t, s) for s in body.get("sorts") or []]
        limit = body.get("limit", 10)
        if limit is None:
            limit = 10
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise _validation(f"limit must be a non-negative integer, not {limit!r}")
        if limit > self.MAX_SEARCH_LIMIT:
            raise _validation(f"limit {limit} is too large: the maximum is {self.MAX_SEARCH_LIMIT}")
        after_raw = str(body.get("after") or "0")
        if not after_raw.isdigit():
            raise _validation(f"after must be a numeric offset, not {after_raw!r}")
        after = int(after_raw)
        if after >= self.MAX_SEARCH_RESULTS:
            raise _validation(
                f"after {after}: no more than {self.MAX_SEARCH_RESULTS} results can be paged"
            )
        text = str(body.get("query") or "").strip().lower()
        wanted = [str(p) for p in body.get("properties") or []]
        with self._lock:
            records = [r for r in self._records[t.name].values() if not r.archived]
            hits = [
                r
                for r in records
                if (not checked or any(all(self._match(t, r, f) for f in g) for g in checked))
                and (not text or any(text in r.properties.get(p, "").lower() for p in t.searchable))
            ]
            hits.sort(key=lambda r: int(r.id))
            for name, descending in reversed(sorts):
                present = [r for r in hits if r.properties.get(name) not in (None, "")]
                absent = [r for r in hits if r.properties.get(name) in (None, "")]
                kind = t.properties[name]
                present.sort(
                    key=lambda r, n=name, k=kind: self._key(k, r.properties[n]), reverse=descending
                )
                hits = present + absent
            page = [self._shape(t, r, wanted) for r in hits[after : after + limit]]
        answer: dict[str, Any] = {"total": len(hits), "results": page}
        following = after + limit
        if limit and following < len(hits) and following < self.MAX_SEARCH_RESULTS:
            answer["paging"] = {"next": {"after": str(following)}}
        return Answer(200, answer)

    def _check_sort(self, t: ObjectType, sort: Any) -> tuple[str, bool]:
        if isinstance(sort, str):
            name, descending = sort.lstrip("-"), sort.startswith("-")
        elif isinstance(sort, dict):
            name = str(sort.get("propertyName") or "")
            direction = str(sort.get("direction") or "ASCENDING").upper()
            if direction not in ("ASCENDING", "DESCENDING"):
                raise _validation(f"Invalid sort direction: {direction}")
            descending = direction == "DESCENDING"
        else:
            raise _validation(f"Invalid sort: {sort!r}")
        if name not in t.properties:
            raise _validation(f"There was a problem with the request: unknown sort {name!r}")
        return name, descending

    @staticmethod
    def _key(kind: str, text: str) -> Any:
        if kind == "datetime":
            return _epoch_ms(text)
        if kind == "number":
            return float(text)
        return text.lower()

    def _check_filter(self, t: ObjectType, raw: Any) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise _validation(f"Invalid filter: {raw!r}")
        name = str(raw.get("propertyName") or "")
        operator = str(raw.get("operator") or "EQ").upper()
        if name not in t.properties:
            raise _validation(
                f"There was a problem with the request. Property {name!r} does not exist on "
                f"{t.name} and cannot be used to filter."
            )
        if operator not in OPERATORS:
            raise _validation(f"Invalid operator {operator!r}")
        kind = t.properties[name]
        checked: dict[str, Any] = {"name": name, "operator": operator, "kind": kind}
        try:
            if operator in ("IN", "NOT_IN"):
                values = raw.get("values")
                if not isinstance(values, list) or not values:
                    raise _validation(f"The {operator} operator needs a values array")
                checked["values"] = [self._key(kind, str(v)) for v in values]
            elif operator in ("HAS_PROPERTY", "NOT_HAS_PROPERTY"):
                pass
            elif operator in ("CONTAINS_TOKEN", "NOT_CONTAINS_TOKEN"):
                checked["value"] = str(raw.get("value") or "").lower()
            else:
                if raw.get("value") is None:
                    raise _validation(f"The {operator} operator needs a value")
                checked["value"] = self._key(kind, str(raw["value"]))
                if operator == "BETWEEN":
                    if raw.get("highValue") is None:
                        raise _validation("The BETWEEN operator needs a highValue")
                    checked["high"] = self._key(kind, str(raw["highValue"]))
        except ValueError:
            raise _validation(f"Invalid value for the {kind} property {name}") from None
        return checked

    def _match(self, t: ObjectType, record: _Record, f: dict[str, Any]) -> bool:
        operator = f["operator"]
        text = record.properties.get(f["name"])
        has = text not in (None, "")
        if operator == "HAS_PROPERTY":
            return has
        if operator == "NOT_HAS_PROPERTY":
            return not has
        if operator in ("CONTAINS_TOKEN", "NOT_CONTAINS_TOKEN"):
            found = has and _token_match(f["value"], str(text))
            return found if operator == "CONTAINS_TOKEN" else not found
        value = self._key(f["kind"], str(text)) if has else None
        if operator == "NEQ":
            return value != f["value"]
        if operator == "NOT_IN":
            return value not in f["values"]
        if value is None:
            return False
        if operator == "EQ":
            return bool(value == f["value"])
        if operator == "IN":
            return value in f["values"]
        if operator == "BETWEEN":
            return bool(f["value"] <= value <= f["high"])
        try:
            return bool(
                {
                    "LT": lambda: value < f["value"],
                    "LTE": lambda: value <= f["value"],
                    "GT": lambda: value > f["value"],
                    "GTE": lambda: value >= f["value"],
                }[operator]()
            )
        except TypeError:
            return False

    # -- owners ------------------------------------------------------------------------------

    def _owner_json(self, owner: _Owner) -> dict[str, Any]:
        return {
            "id": owner.id,
            "email": owner.email,
            "type": "PERSON",
            "firstName": owner.first_name,
            "lastName": owner.last_name,
            "userId": owner.user_id,
            "userIdIncludingInactive": owner.user_id,
            "createdAt": owner.created_at,
            "updatedAt": owner.updated_at,
            "archived": owner.archived,
            "teams": list(owner.teams),
        }

    def _owners_page(self, query: dict[str, list[str]], body: Any) -> Answer:
        limit = self._int(query, "limit", 100, 1, self.MAX_OWNERS_LIMIT)
        archived = self._flag(query, "archived")
        email = (query.get("email") or [""])[0].strip().lower()
        cursor = (query.get("after") or [""])[0]
        offset = 0
        if cursor:
            try:
                offset = int(base64.urlsafe_b64decode(cursor.encode()).decode())
            except (ValueError, UnicodeDecodeError):
                raise _validation(f"Invalid after cursor: {cursor!r}") from None
        with self._lock:
            owners = sorted(
                (
                    o
                    for o in self._owners.values()
                    if o.archived == archived and (not email or o.email.lower() == email)
                ),
                key=lambda o: int(o.id),
            )
            page = [self._owner_json(o) for o in owners[offset : offset + limit]]
        answer: dict[str, Any] = {"results": page}
        if offset + limit < len(owners):
            after = base64.urlsafe_b64encode(str(offset + limit).encode()).decode()
            params = {"limit": limit, "after": after}
            if "archived" in query:
                params["archived"] = str(archived).lower()
            if email:
                params["email"] = email
            link = f"{self.url}/crm/v3/owners/?{urlencode(params)}"
            answer["paging"] = {"next": {"after": after, "link": link}}
        return Answer(200, answer)

    def _owner_by_id(self, owner_id: str, query: dict[str, list[str]]) -> Answer:
        archived = self._flag(query, "archived")
        id_property = (query.get("idProperty") or ["id"])[0]
        with self._lock:
            for owner in self._owners.values():
                key = str(owner.user_id) if id_property == "userId" else owner.id
                if key == owner_id and owner.archived == archived:
                    return Answer(200, self._owner_json(owner))
        raise _error(404, f"No owner found with {id_property} {owner_id}", "OBJECT_NOT_FOUND")


def _token_match(pattern: str, value: str) -> bool:
    """CONTAINS_TOKEN: the pattern (``*`` a wildcard) matches the whole value, one of its
    ``;``-separated elements, or one of its whitespace-separated words; case-insensitive."""
    value = value.lower()
    candidates = {value, *(p.strip() for p in value.split(";")), *value.split()}
    candidates.discard("")
    regex = ".*".join(re.escape(part) for part in pattern.lower().split("*"))
    return any(re.fullmatch(regex, c, flags=re.DOTALL) for c in candidates)


def _trickle(
    handler: BaseHTTPRequestHandler,
    status: int,
    headers: list[tuple[str, str]],
    data: bytes,
    every: float,
) -> None:
    """Send the whole answer, status line first, one byte every ``every`` seconds (at most a
    minute): a server no per-read timeout ever gives up on. Stops when the client hangs up."""
    reason = handler.responses.get(status, ("",))[0]
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    raw = (head + "\r\n").encode("latin-1") + data
    stop = time.monotonic() + 60
    handler.close_connection = True
    for i in range(len(raw)):
        if time.monotonic() > stop:
            return
        try:
            handler.wfile.write(raw[i : i + 1])
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            return
        time.sleep(every)


def _handler(standin: HubSpotStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # An answer's headers and body go out in two sends: with Nagle's algorithm the body
        # waits for the client's delayed ACK (~40 ms) on every kept-alive answer.
        disable_nagle_algorithm = True

        def setup(self) -> None:
            super().setup()
            server = self.server
            if isinstance(server, _Server):
                with server.connections_lock:
                    server.connections.add(self.connection)

        def finish(self) -> None:
            try:
                super().finish()
            finally:
                server = self.server
                if isinstance(server, _Server):
                    with server.connections_lock:
                        server.connections.discard(self.connection)

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            answer = standin.handle(self.command, self.path, self.headers, raw)
            if answer.body is None:
                data = b""
            elif isinstance(answer.body, bytes):
                data = answer.body
            else:
                data = json.dumps(answer.body).encode()
            every = standin.take_trickle()
            if every:
                sent = [("Content-Type", answer.content_type)] if data else []
                sent += [*answer.headers.items(), ("Content-Length", str(len(data)))]
                _trickle(self, answer.status, sent, data, every)
                return
            try:
                self.send_response(answer.status)
                if data:
                    self.send_header("Content-Type", answer.content_type)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
                self.close_connection = True

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

    return Handler


@pytest.fixture
def hubspot_standin() -> Iterator[HubSpotStandIn]:
    """A running stand-in HubSpot account; stopped (and its certificate removed) after."""
    standin = HubSpotStandIn().start()
    try:
        yield standin
    finally:
        standin.close()
