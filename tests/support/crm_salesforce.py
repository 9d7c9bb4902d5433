"""A stand-in Salesforce org over HTTPS, for tests of ``routing.crm.salesforce``.

It implements what the module uses, as Salesforce documents it:
- ``POST /services/oauth2/token``: the OAuth 2.0 client credentials flow (``grant_type=
  client_credentials``, ``client_id``, ``client_secret``; Salesforce Help "OAuth 2.0 Client
  Credentials Flow for Server-to-Server Integration") and the JWT bearer flow (``grant_type=
  urn:ietf:params:oauth:grant-type:jwt-bearer``, ``assertion`` signed RS256, ``iss`` = consumer
  key, ``sub`` = username, ``aud`` = https://login.salesforce.com or https://test.salesforce.com,
  ``exp``; Salesforce Help "OAuth 2.0 JWT Bearer Flow for Server-to-Server Integration"). The
  answer is ``access_token``, ``signature``, ``scope``, ``instance_url``, ``id``,
  ``token_type``, ``issued_at`` (no ``expires_in``); errors are ``{"error", "error_description"}``
  (``invalid_client`` 401, ``invalid_grant`` 400, ``unsupported_grant_type`` 400).
- ``GET /services/data/vXX.X/query?q=`` (REST API Developer Guide "Execute a SOQL Query"): the
  SOQL subset the module sends, parsed honestly (SELECT fields FROM object [WHERE cond AND ...]
  [ORDER BY field [ASC|DESC]] [LIMIT n]; cond is ``=``, ``!=``, ``>``, ``<``, ``IN (...)``,
  ``LIKE``; string literals with the documented escapes, case-insensitive comparison). Paging
  with ``totalSize``, ``done``, ``nextRecordsUrl`` (``/services/data/vXX.X/query/<locator>``).
  Errors in the REST error array ``[{"message", "errorCode"}]``: MALFORMED_QUERY (syntax),
  INVALID_FIELD (an unknown field), INVALID_TYPE (an unknown object).
- ``POST /services/data/vXX.X/sobjects/<Object>`` ("Create a Record"): 201 ``{"id", "success",
  "errors"}``; REQUIRED_FIELD_MISSING (Lead: LastName, Company; Contact: LastName).
- ``GET|PATCH /services/data/vXX.X/sobjects/<Object>/<id>`` ("Get Field Values", "Update a
  Record"): ``?fields=`` honoured; PATCH answers 204; 404 NOT_FOUND.
- ``GET|PATCH /services/data/vXX.X/sobjects/<Object>/<ExternalIdField>/<value>`` ("Insert or
  Update (Upsert) a Record Using an External ID"): 201 ``{"id", "success", "errors",
  "created": true}`` when created; when updated 200 with ``"created": false`` from API 46.0, 204
  before.
- A converted Lead (``convert_lead``: ``IsConverted`` true, ``ConvertedContactId`` the Contact
  made from it) refuses every PATCH with ``400 CANNOT_UPDATE_CONVERTED_LEAD`` (Salesforce Help
  "Convert Leads": a converted Lead cannot be edited through the API).
- A duplicate rule (``lead_duplicate_rule(True)``, like the standard Lead duplicate rule set to
  block): creating a Lead that matches an unconverted Lead or a Contact by e-mail, or an
  unconverted Lead by first name, last name and company, answers ``400 DUPLICATES_DETECTED``
  with the ``duplicateResult`` the REST API documents (``matchResults[].matchRecords[].record``
  with ``attributes`` and ``Id``), and creates nothing.
- An object the integration user's profile or permission sets cannot read (``hide_object``) is
  invisible to the API, as Salesforce makes it: a query on it answers ``400 INVALID_TYPE``
  "sObject type 'Account' is not supported." and its ``sobjects`` resources ``404 NOT_FOUND``.
- ``401 [{"message": "Session expired or invalid", "errorCode": "INVALID_SESSION_ID"}]`` for a
  missing, unknown or expired token; ``403 REQUEST_LIMIT_EXCEEDED`` ("API Request Limits";
  Salesforce's REST API documents no 429, so there is no ``rate_limit_next``).

Record Ids are in Salesforce's 18-character form (15 + the case-sensitivity checksum) with the
standard key prefixes (Lead 00Q, Contact 003, Account 001, User 005, Task 00T, Event 00U).

Its connections are ``TCP_NODELAY`` (an answer's headers and body go in two sends; with
Nagle's algorithm the body would wait ~40 ms for the client's delayed ACK, so tests and
benchmarks would measure that instead of the client).

Use it through the ``salesforce_standin`` fixture: ``standin.url`` is the My Domain,
``standin.ca_file`` the certificate to pass as ``ca_bundle``, ``standin.client_id`` /
``standin.client_secret`` the connected app, and ``jwt_key_pair()`` + ``register_jwt_key()``
the JWT bearer flow. ``requests`` is the request log (no secrets), ``max_per_second()`` the most
requests seen in a one-second window.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
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
from urllib.parse import parse_qs, unquote, urlsplit

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

PREFIX = {"Lead": "00Q", "Contact": "003", "Account": "001", "User": "005", "Task": "00T"}
PREFIX["Event"] = "00U"
FIELDS: dict[str, set[str]] = {
    "Lead": {
        "Id", "Email", "FirstName", "LastName", "Company", "Phone", "Title", "Country",
        "OwnerId", "Status", "IsConverted", "ConvertedContactId", "LastModifiedDate",
        "CreatedDate", "LastActivityDate",
    },
    "Contact": {
        "Id", "Email", "FirstName", "LastName", "Phone", "Title", "AccountId", "OwnerId",
        "LastModifiedDate", "CreatedDate", "LastActivityDate",
    },
    "Account": {"Id", "Name", "Website", "OwnerId", "LastModifiedDate", "CreatedDate"},
    "User": {"Id", "Email", "Name", "Username", "IsActive", "UserType", "LastModifiedDate"},
    "Task": {"Id", "WhoId", "Subject", "OwnerId", "CreatedDate", "ActivityDate"},
    "Event": {"Id", "WhoId", "Subject", "OwnerId", "CreatedDate", "ActivityDate"},
}  # fmt: skip
REQUIRED = {"Lead": ("LastName", "Company"), "Contact": ("LastName",)}
READ_ONLY = {
    "Id", "IsConverted", "ConvertedContactId", "LastModifiedDate", "CreatedDate",
    "LastActivityDate",
}  # fmt: skip
# "Update a Record" of a converted Lead (Salesforce refuses any edit of one).
CONVERTED_LEAD = [
    {
        "message": "cannot reference converted lead",
        "errorCode": "CANNOT_UPDATE_CONVERTED_LEAD",
        "fields": [],
    }
]
LEAD_DUPLICATE_RULE = "Standard_Lead_Duplicate_Rule"
AUDIENCES = ("https://login.salesforce.com", "https://test.salesforce.com")
SESSION_EXPIRED = [{"message": "Session expired or invalid", "errorCode": "INVALID_SESSION_ID"}]
NOT_FOUND = [{"errorCode": "NOT_FOUND", "message": "The requested resource does not exist"}]
_CHECKSUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def sf_id(prefix: str, number: int) -> str:
    """An 18-character Salesforce Id: 15 characters plus the documented 3-character suffix."""
    digits = ""
    for _ in range(6):
        number, rest = divmod(number, 62)
        digits = _B62[rest] + digits
    base = f"{prefix}5e0000{digits}"[:15].ljust(15, "0")
    suffix = ""
    for chunk in range(3):
        flags = sum(1 << i for i, c in enumerate(base[chunk * 5 : chunk * 5 + 5]) if c.isupper())
        suffix += _CHECKSUM[flags]
    return base + suffix


def sf_time(value: dt.datetime) -> str:
    """Salesforce's dateTime format in REST answers: ``2024-05-01T12:00:00.000+0000``."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000+0000")


def jwt_key_pair() -> tuple[str, str]:
    """(private PEM for the client, public PEM to register with ``register_jwt_key``)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


def _certificate(directory: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file = directory / "standin-ca.pem"
    key_file = directory / "standin-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


class SoqlError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^'\\]|\\.)*')|(?P<num>\d+(?:\.\d+)?(?![\d:-]))"
    r"|(?P<dt>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d))"
    r"|(?P<op>!=|<=|>=|=|<|>|\(|\)|,)|(?P<word>[A-Za-z_][A-Za-z0-9_.]*))"
)
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", '"': '"', "'": "'", "\\": "\\"}


def _tokens(soql: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    soql = soql.rstrip()
    while pos < len(soql):
        match = _TOKEN.match(soql, pos)
        if match is None or match.end() == pos:
            raise SoqlError(
                "MALFORMED_QUERY", f"unexpected token at {pos}: {soql[pos : pos + 20]!r}"
            )
        pos = match.end()
        kind = match.lastgroup or ""
        text = match.group(kind)
        if kind == "str":
            body, value, i = text[1:-1], "", 0
            while i < len(body):
                if body[i] == "\\":
                    nxt = body[i + 1]
                    if nxt in "%_":
                        value += "\\" + nxt  # kept for LIKE
                    elif nxt in _ESCAPES:
                        value += _ESCAPES[nxt]
                    else:
                        raise SoqlError("MALFORMED_QUERY", f"invalid escape \\{nxt}")
                    i += 2
                else:
                    value += body[i]
                    i += 1
            out.append(("str", value))
        elif kind == "dt":
            out.append(("dt", dt.datetime.fromisoformat(text.replace("Z", "+00:00"))))
        elif kind == "num":
            out.append(("num", float(text)))
        else:
            out.append((kind, text))
    return out


@dataclass
class Query:
    object: str
    fields: list[str]
    where: list[tuple[str, str, Any]] = field(default_factory=list)
    order: tuple[str, bool] | None = None
    limit: int | None = None


def parse_soql(soql: str, schema: dict[str, set[str]] | None = None) -> Query:
    """The SOQL subset the module sends; SoqlError for anything else."""
    schema = schema if schema is not None else FIELDS
    toks = _tokens(soql)
    pos = 0

    def peek_word(*words: str) -> bool:
        return pos < len(toks) and toks[pos][0] == "word" and toks[pos][1].upper() in words

    def take(kind: str, value: str | None = None) -> Any:
        nonlocal pos
        if (
            pos >= len(toks)
            or toks[pos][0] != kind
            or (value is not None and str(toks[pos][1]).upper() != value)
        ):
            got = toks[pos][1] if pos < len(toks) else "end of query"
            raise SoqlError("MALFORMED_QUERY", f"unexpected token: '{got}'")
        pos += 1
        return toks[pos - 1][1]

    def literal() -> Any:
        nonlocal pos
        if pos >= len(toks):
            raise SoqlError("MALFORMED_QUERY", "unexpected end of query")
        kind, value = toks[pos]
        pos += 1
        if kind in ("str", "dt", "num"):
            return value
        if kind == "word" and value.lower() in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[value.lower()]
        raise SoqlError("MALFORMED_QUERY", f"unexpected token: '{value}'")

    take("word", "SELECT")
    fields = [take("word")]
    while pos < len(toks) and toks[pos] == ("op", ","):
        pos += 1
        fields.append(take("word"))
    take("word", "FROM")
    obj = take("word")
    if obj not in schema:
        raise SoqlError("INVALID_TYPE", f"sObject type '{obj}' is not supported.")
    query = Query(obj, fields)
    if peek_word("WHERE"):
        pos += 1
        while True:
            name = take("word")
            if peek_word("IN"):
                pos += 1
                take("op", "(")
                values = [literal()]
                while pos < len(toks) and toks[pos] == ("op", ","):
                    pos += 1
                    values.append(literal())
                take("op", ")")
                query.where.append((name, "IN", values))
            elif peek_word("LIKE"):
                pos += 1
                value = literal()
                if not isinstance(value, str):
                    raise SoqlError("MALFORMED_QUERY", "LIKE needs a string")
                query.where.append((name, "LIKE", value))
            else:
                op = take("op")
                if op not in ("=", "!=", "<", ">", "<=", ">="):
                    raise SoqlError("MALFORMED_QUERY", f"unexpected token: '{op}'")
                query.where.append((name, op, literal()))
            if not peek_word("AND"):
                break
            pos += 1
    if peek_word("ORDER"):
        pos += 1
        take("word", "BY")
        name = take("word")
        descending = False
        if peek_word("ASC", "DESC"):
            descending = toks[pos][1].upper() == "DESC"
            pos += 1
        query.order = (name, descending)
    if peek_word("LIMIT"):
        pos += 1
        value = take("num")
        query.limit = int(value)
    if pos != len(toks):
        raise SoqlError("MALFORMED_QUERY", f"unexpected token: '{toks[pos][1]}'")
    known = schema[obj]
    for name in [*fields, *(w[0] for w in query.where), *([query.order[0]] if query.order else [])]:
        if name not in known:
            raise SoqlError("INVALID_FIELD", f"No such column '{name}' on entity '{obj}'.")
    return query


def _like(pattern: str, value: str) -> bool:
    regex, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            regex += re.escape(pattern[i + 1])
            i += 2
            continue
        regex += ".*" if c == "%" else "." if c == "_" else re.escape(c)
        i += 1
    return re.fullmatch(regex, value, flags=re.IGNORECASE | re.DOTALL) is not None


def _comparable(value: Any) -> Any:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            if re.match(r"^\d{4}-\d\d-\d\dT", value):
                return dt.datetime.fromisoformat(value)
        return value.lower()
    return value


def _matches(record: dict[str, Any], cond: tuple[str, str, Any]) -> bool:
    name, op, wanted = cond
    value = record.get(name)
    if op == "LIKE":
        return isinstance(value, str) and _like(wanted, value)
    if op == "IN":
        return _comparable(value) in [_comparable(w) for w in wanted]
    left, right = _comparable(value), _comparable(wanted)
    if op == "=":
        return left == right
    if op == "!=":
        return left != right
    if left is None or right is None:
        return False
    try:
        return bool(
            {"<": left < right, ">": left > right, "<=": left <= right, ">=": left >= right}[op]
        )
    except TypeError:
        return False


@dataclass
class LoggedRequest:
    """One request as the stand-in saw it (the Authorization header and secrets left out)."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    at: float
    auto_assign: str = ""  # the Sforce-Auto-Assign header as sent ("" when absent)


class SalesforceStandIn:
    """A threaded HTTPS server acting as one Salesforce org (see the module docstring)."""

    def __init__(
        self,
        *,
        client_id: str = "3MVG9standinConsumerKey",
        client_secret: str = "standin-consumer-secret",  # noqa: S107 (a test value)
        username: str = "integration@acme.example",
        page_size: int = 2000,
        versions: tuple[str, ...] = ("45.0", "59.0", "60.0", "61.0", "62.0", "63.0"),
    ) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.username = username
        self.page_size = page_size
        self.versions = versions
        self.jwt_keys: list[str] = []
        self.fields = {name: set(names) for name, names in FIELDS.items()}
        self.audiences = list(AUDIENCES)
        self.external_id_fields: set[str] = set()
        self.records: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in self.fields}
        self.requests: list[LoggedRequest] = []
        self.token_grants: list[str] = []
        self.token_extra: dict[str, Any] = {}
        self._tokens: dict[str, bool] = {}
        self._cursors: dict[str, tuple[str, list[dict[str, Any]], int]] = {}
        self._counter = 0
        self._lock = threading.RLock()
        self._fail: list[int] = []
        self._limit = 0
        self._garbage = 0
        self._raw: list[tuple[int, bytes, str]] = []
        self._delay = 0.0
        self._slow: list[float] = []
        self._login_delay = 0.0
        self._trickle: list[float] = []
        self.hidden: set[str] = set()  # objects the integration user cannot read
        self.duplicate_rule_on = False
        self._dir = tempfile.TemporaryDirectory(prefix="sf-standin-")
        self.ca_file, self._key_file = (str(p) for p in _certificate(Path(self._dir.name)))
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.integration_user_id = self.add_user(email=username, name="Integration User")

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> SalesforceStandIn:
        handler = _handler(self)
        server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca_file, self._key_file)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def down(self) -> None:
        """Stop listening: connections are refused until ``up()`` (same port)."""
        self.stop()

    def up(self) -> None:
        if self._server is None:
            self.start()

    # -- state -----------------------------------------------------------------------------

    def _new_id(self, obj: str) -> str:
        with self._lock:
            self._counter += 1
            return sf_id(PREFIX[obj], self._counter)

    def add(self, obj: str, **fields: Any) -> str:
        """Add a record of ``obj`` with ``fields`` (datetimes become Salesforce's format)."""
        now = dt.datetime.now(dt.UTC)
        record_id = fields.pop("Id", None) or self._new_id(obj)
        record: dict[str, Any] = {"Id": record_id}
        for name, value in fields.items():
            if name not in self.fields[obj] and name not in self.external_id_fields:
                raise KeyError(f"{obj} has no field {name}")
            if isinstance(value, dt.datetime):
                value = sf_time(value)
            elif isinstance(value, dt.date):
                value = value.isoformat()
            record[name] = value
        record.setdefault("CreatedDate", sf_time(now))
        if "LastModifiedDate" in self.fields[obj]:
            record.setdefault("LastModifiedDate", record["CreatedDate"])
        if obj == "Lead":
            record.setdefault("IsConverted", False)
            record.setdefault("Status", "Open - Not Contacted")
        if obj == "User":
            record.setdefault("IsActive", True)
            record.setdefault("UserType", "Standard")
        if obj in ("Lead", "Contact", "Account") and "OwnerId" not in record:
            record["OwnerId"] = self.integration_user_id
        with self._lock:
            self.records[obj][record_id] = record
        return record_id

    def add_lead(self, **fields: Any) -> str:
        return self.add("Lead", **fields)

    def add_contact(self, **fields: Any) -> str:
        return self.add("Contact", **fields)

    def add_account(self, **fields: Any) -> str:
        return self.add("Account", **fields)

    def add_user(self, *, email: str, name: str = "", active: bool = True, **fields: Any) -> str:
        return self.add(
            "User", Email=email, Name=name or email, Username=email, IsActive=active, **fields
        )

    def add_task(self, **fields: Any) -> str:
        return self.add("Task", **fields)

    def add_event(self, **fields: Any) -> str:
        return self.add("Event", **fields)

    def record(self, obj: str, record_id: str) -> dict[str, Any] | None:
        with self._lock:
            found = self.records[obj].get(record_id)
            return dict(found) if found is not None else None

    def edit(self, obj: str, record_id: str, **fields: Any) -> None:
        """Change a record as a user in Salesforce would (LastModifiedDate moves)."""
        with self._lock:
            record = self.records[obj][record_id]
            record.update(fields)
            if "LastModifiedDate" in self.fields[obj]:
                record["LastModifiedDate"] = sf_time(dt.datetime.now(dt.UTC))

    def convert_lead(self, lead_id: str, **contact_fields: Any) -> str:
        """Convert a Lead as a user in Salesforce would: a Contact made from it (same e-mail,
        name and owner unless ``contact_fields`` say otherwise), the Lead ``IsConverted`` with
        ``ConvertedContactId``. Returns the Contact's id."""
        with self._lock:
            lead = self.records["Lead"][lead_id]
            fields = {
                name: lead[name]
                for name in ("Email", "FirstName", "LastName", "Phone", "Title", "OwnerId")
                if name in lead
            }
            contact = self.add("Contact", **{**fields, **contact_fields})
            self.edit("Lead", lead_id, IsConverted=True, ConvertedContactId=contact)
        return contact

    def lead_duplicate_rule(self, on: bool = True) -> None:
        """Switch the (blocking) Lead duplicate rule on or off."""
        self.duplicate_rule_on = on

    def _duplicates(self, body: dict[str, Any], version: str) -> tuple[int, Any] | None:
        if not self.duplicate_rule_on:
            return None

        def same(a: Any, b: Any) -> bool:
            return (
                bool(str(a or "").strip())
                and str(a).strip().lower() == str(b or "").strip().lower()
            )

        email = body.get("Email")
        with self._lock:
            leads = [r for r in self.records["Lead"].values() if not r.get("IsConverted")]
            contacts = list(self.records["Contact"].values())
        lead_matches = [
            r
            for r in leads
            if same(email, r.get("Email"))
            or all(same(body.get(n), r.get(n)) for n in ("FirstName", "LastName", "Company"))
        ]
        contact_matches = [r for r in contacts if same(email, r.get("Email"))]
        results = [
            {
                "entityType": obj,
                "errors": [],
                "matchEngine": "FuzzyMatchEngine",
                "matchRecords": [
                    {
                        "additionalInformation": [],
                        "fieldDiffs": [],
                        "matchConfidence": 100.0,
                        "record": {
                            "attributes": {
                                "type": obj,
                                "url": f"/services/data/v{version}/sobjects/{obj}/{r['Id']}",
                            },
                            "Id": r["Id"],
                        },
                    }
                    for r in rows
                ],
                "rule": rule,
                "size": len(rows),
                "success": True,
            }
            for obj, rule, rows in (
                ("Lead", "Standard_Lead_Match_Rule_v1_0", lead_matches),
                ("Contact", "Standard_Contact_Match_Rule_v1_1", contact_matches),
            )
            if rows
        ]
        if not results:
            return None
        message = "Use one of these records?"
        return 400, [
            {
                "duplicateResult": {
                    "allowSave": False,
                    "duplicateRule": LEAD_DUPLICATE_RULE,
                    "duplicateRuleEntityType": "Lead",
                    "errorMessage": message,
                    "matchResults": results,
                },
                "errorCode": "DUPLICATES_DETECTED",
                "fields": [],
                "message": message,
            }
        ]

    def add_external_id_field(self, name: str) -> None:
        """Declare an External ID field on Lead (e.g. ``LeadRouter_Id__c``)."""
        self.external_id_fields.add(name)
        self.fields["Lead"].add(name)

    def register_jwt_key(self, public_pem: str) -> None:
        """The certificate's public key uploaded to the connected app."""
        self.jwt_keys.append(public_pem)

    # -- controls --------------------------------------------------------------------------

    def expire_tokens(self) -> None:
        """Every access token issued so far now answers 401 INVALID_SESSION_ID."""
        with self._lock:
            for token in self._tokens:
                self._tokens[token] = False

    def fail_next(self, n: int = 1, status: int = 503) -> None:
        with self._lock:
            self._fail += [status] * n

    def hide_object(self, *objects: str) -> None:
        """The integration user loses Read on ``objects`` (its profile or permission set)."""
        with self._lock:
            self.hidden |= set(objects)

    def show_object(self, *objects: str) -> None:
        with self._lock:
            self.hidden -= set(objects)

    def limit_next(self, n: int = 1) -> None:
        """The next ``n`` API requests answer 403 REQUEST_LIMIT_EXCEEDED."""
        with self._lock:
            self._limit += n

    def garbage_next(self, n: int = 1) -> None:
        """The next ``n`` requests answer 200 with an HTML page or truncated JSON (alternating)."""
        with self._lock:
            self._garbage += n

    def respond_next(self, body: Any, status: int = 200, n: int = 1) -> None:
        """The next ``n`` data requests answer ``body`` (JSON-encoded unless bytes) as is."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        with self._lock:
            self._raw += [(status, raw, "application/json;charset=UTF-8")] * n

    def set_delay(self, seconds: float) -> None:
        self._delay = seconds

    def delay_next(self, seconds: float, n: int = 1) -> None:
        """The next ``n`` requests (whichever client sends them) answer after ``seconds``."""
        with self._lock:
            self._slow += [seconds] * n

    def trickle_next(self, n: int = 1, every: float = 0.5) -> None:
        """The next ``n`` answers (the token's included) are sent one byte every ``every``
        seconds, status line first: each read gets a byte in time, the answer never ends."""
        with self._lock:
            self._trickle += [every] * n

    def take_trickle(self) -> float:
        with self._lock:
            return self._trickle.pop(0) if self._trickle else 0.0

    def add_to_token_answer(self, **fields: Any) -> None:
        """Fields the token endpoint's answer carries besides Salesforce's own (e.g. an
        ``expires_in`` that some orgs' proxies add, in whatever shape)."""
        with self._lock:
            self.token_extra.update(fields)

    def set_login_delay(self, seconds: float) -> None:
        """The token endpoint answers after ``seconds`` (a busy login server): concurrent
        callers that each log in pile up there."""
        self._login_delay = seconds

    def queries(self) -> list[str]:
        """The SOQL of every query request, in order."""
        return [
            r.query["q"][0]
            for r in self.requests
            if r.path.rstrip("/").endswith("/query") and r.query.get("q")
        ]

    def max_per_second(self) -> int:
        """The most requests that arrived within any one-second window."""
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
            self.token_grants.clear()

    # -- the endpoints ---------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: Any, raw: bytes):
        if self._delay:
            time.sleep(self._delay)
        with self._lock:
            slow = self._slow.pop(0) if self._slow else 0.0
        if slow:
            time.sleep(slow)
        body: Any = None
        form = parse_qs(raw.decode("utf-8", "replace")) if path == "/services/oauth2/token" else {}
        if path == "/services/oauth2/token":
            body = {
                k: ("<redacted>" if k in ("client_secret", "assertion") else v[0])
                for k, v in form.items()
            }
        elif raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        with self._lock:
            self.requests.append(
                LoggedRequest(
                    method,
                    path,
                    query,
                    body,
                    time.monotonic(),
                    str(headers.get("Sforce-Auto-Assign") or ""),
                )
            )
            if self._fail:
                status = self._fail.pop(0)
                return status, [{"message": "Service unavailable", "errorCode": "SERVER_ERROR"}]
            if self._garbage:
                self._garbage -= 1
                if self._garbage % 2 == 0:
                    return 200, b"<html><body>Maintenance</body></html>", "text/html"
                return 200, b'{"totalSize": 1, "done": true, "records": [{"Id": "00Q', ""
        if path == "/services/oauth2/token":
            if self._login_delay:
                time.sleep(self._login_delay)
            return self._token(method, form)
        match = re.fullmatch(r"/services/data/v(\d+\.\d)(/.*)?", path)
        if match is None or match.group(1) not in self.versions:
            return 404, NOT_FOUND
        version, rest = match.group(1), (match.group(2) or "/").rstrip("/")
        auth = headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        with self._lock:
            if not self._tokens.get(token):
                return 401, SESSION_EXPIRED
            if self._limit:
                self._limit -= 1
                return 403, [
                    {
                        "message": "TotalRequests Limit exceeded.",
                        "errorCode": "REQUEST_LIMIT_EXCEEDED",
                    }
                ]
            if self._raw:
                return self._raw.pop(0)
        if rest == "/query" and method == "GET":
            return self._query(version, query.get("q", [""])[0])
        paged = re.fullmatch(r"/query/([A-Za-z0-9]+-\d+)", rest)
        if paged and method == "GET":
            return self._more(version, paged.group(1))
        sobject = re.fullmatch(r"/sobjects/([A-Za-z]+)(?:/([^/]+))?(?:/([^/]+))?", rest)
        if sobject is None:
            return 404, NOT_FOUND
        obj, first, second = sobject.groups()
        if obj not in self.fields or obj in self.hidden:
            return 404, NOT_FOUND
        if first is None and method == "POST":
            return self._create(obj, body, headers)
        if first is not None and second is None and method in ("GET", "PATCH"):
            return self._by_id(method, obj, unquote(first), query, body, headers)
        if first is not None and second is not None and method in ("GET", "PATCH"):
            return self._by_external(method, version, obj, first, unquote(second), query, body)
        return 405, [
            {"errorCode": "METHOD_NOT_ALLOWED", "message": f"HTTP Method '{method}' not allowed"}
        ]

    def _token(self, method: str, form: dict[str, list[str]]) -> tuple[int, Any]:
        def one(name: str) -> str:
            return form.get(name, [""])[0]

        if method != "POST":
            return 405, {"error": "invalid_request", "error_description": "must use HTTP POST"}
        grant = one("grant_type")
        if grant == "client_credentials":
            if one("client_id") != self.client_id or one("client_secret") != self.client_secret:
                return 401, {
                    "error": "invalid_client",
                    "error_description": "invalid client credentials",
                }
        elif grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            claims: dict[str, Any] = {}
            for key in self.jwt_keys:
                try:
                    claims = jwt.decode(
                        one("assertion"),
                        key,
                        algorithms=["RS256"],
                        audience=self.audiences,
                        options={"require": ["iss", "sub", "aud", "exp"]},
                    )
                    break
                except jwt.PyJWTError:
                    continue
            if not claims:
                return 400, {"error": "invalid_grant", "error_description": "invalid assertion"}
            if claims.get("iss") != self.client_id:
                return 400, {
                    "error": "invalid_client_id",
                    "error_description": "client identifier invalid",
                }
            if claims.get("exp", 0) > time.time() + 300:
                return 400, {"error": "invalid_grant", "error_description": "expiration is too far"}
            if claims.get("sub") != self.username:
                return 400, {
                    "error": "invalid_grant",
                    "error_description": "user hasn't approved this consumer",
                }
        else:
            return 400, {
                "error": "unsupported_grant_type",
                "error_description": "grant type not supported",
            }
        with self._lock:
            self._counter += 1
            token = f"00D5e0000000001!AQ4AQ.standin.{self._counter}.{time.time_ns()}"
            self._tokens[token] = True
            self.token_grants.append(grant)
        return 200, {
            "access_token": token,
            "signature": "c3RhbmRpbg==",
            "scope": "api",
            "instance_url": self.url,
            "id": f"{self.url}/id/00D5e0000000001EAA/{self.integration_user_id}",
            "token_type": "Bearer",
            "issued_at": str(int(time.time() * 1000)),
            **self.token_extra,
        }

    def _shape(
        self, obj: str, version: str, record: dict[str, Any], fields: list[str]
    ) -> dict[str, Any]:
        shaped: dict[str, Any] = {
            "attributes": {
                "type": obj,
                "url": f"/services/data/v{version}/sobjects/{obj}/{record['Id']}",
            }
        }
        for name in fields:
            shaped[name] = record.get(name)
        return shaped

    def _query(self, version: str, soql: str) -> tuple[int, Any]:
        with self._lock:
            visible = {k: v for k, v in self.fields.items() if k not in self.hidden}
        try:
            q = parse_soql(soql, visible)
        except SoqlError as exc:
            return 400, [{"message": str(exc), "errorCode": exc.code}]
        with self._lock:
            rows = [dict(r) for r in self.records[q.object].values()]
        rows = [r for r in rows if all(_matches(r, c) for c in q.where)]
        if q.order is not None:
            name, descending = q.order
            rows.sort(
                key=lambda r: (r.get(name) is None, _comparable(r.get(name)) or ""),
                reverse=descending,
            )
        if q.limit is not None:
            rows = rows[: q.limit]
        shaped = [self._shape(q.object, version, r, q.fields) for r in rows]
        return self._page(version, shaped, 0)

    def _page(self, version: str, rows: list[dict[str, Any]], start: int) -> tuple[int, Any]:
        chunk = rows[start : start + self.page_size]
        done = start + self.page_size >= len(rows)
        answer: dict[str, Any] = {"totalSize": len(rows), "done": done, "records": chunk}
        if not done:
            with self._lock:
                self._counter += 1
                locator = f"01g5e{self._counter:010d}"
                self._cursors[locator] = (version, rows, start + self.page_size)
            answer["nextRecordsUrl"] = (
                f"/services/data/v{version}/query/{locator}-{start + self.page_size}"
            )
        return 200, answer

    def _more(self, version: str, ident: str) -> tuple[int, Any]:
        locator, _, offset = ident.partition("-")
        with self._lock:
            cursor = self._cursors.get(locator)
        if cursor is None or int(offset) != cursor[2]:
            return 400, [{"message": "invalid query locator", "errorCode": "INVALID_QUERY_LOCATOR"}]
        return self._page(version, cursor[1], cursor[2])

    def _check_fields(self, obj: str, body: Any, headers: Any) -> tuple[int, Any] | None:
        if "application/json" not in headers.get("Content-Type", ""):
            return 415, [
                {"errorCode": "UNSUPPORTED_MEDIA_TYPE", "message": "Content-Type must be JSON"}
            ]
        if not isinstance(body, dict):
            return 400, [
                {"errorCode": "JSON_PARSER_ERROR", "message": "the body is no JSON object"}
            ]
        for name, value in body.items():
            if name not in self.fields[obj]:
                return 400, [
                    {
                        "errorCode": "INVALID_FIELD",
                        "message": f"No such column '{name}' on sobject of type {obj}",
                    }
                ]
            if name in READ_ONLY:
                return 400, [
                    {
                        "errorCode": "INVALID_FIELD_FOR_INSERT_UPDATE",
                        "message": f"Unable to create/update fields: {name}.",
                        "fields": [name],
                    }
                ]
            if name == "OwnerId":
                owner = self.record("User", str(value))
                if owner is None:
                    return 400, [
                        {
                            "errorCode": "INVALID_CROSS_REFERENCE_KEY",
                            "message": "invalid cross reference id",
                            "fields": ["OwnerId"],
                        }
                    ]
                if owner.get("IsActive") is False:
                    return 400, [
                        {
                            "errorCode": "INACTIVE_OWNER_OR_USER",
                            "message": "operation performed with inactive user",
                            "fields": ["OwnerId"],
                        }
                    ]
        return None

    def _create(self, obj: str, body: Any, headers: Any) -> tuple[int, Any]:
        problem = self._check_fields(obj, body, headers)
        if problem:
            return problem
        missing = [n for n in REQUIRED.get(obj, ()) if not str(body.get(n) or "").strip()]
        if missing:
            return 400, [
                {
                    "message": f"Required fields are missing: [{', '.join(missing)}]",
                    "errorCode": "REQUIRED_FIELD_MISSING",
                    "fields": missing,
                }
            ]
        if obj == "Lead":
            duplicate = self._duplicates(body, "62.0")
            if duplicate:
                return duplicate
        record_id = self.add(obj, **body)
        return 201, {"id": record_id, "success": True, "errors": []}

    def _by_id(
        self,
        method: str,
        obj: str,
        record_id: str,
        query: dict[str, list[str]],
        body: Any,
        headers: Any,
    ) -> tuple[int, Any]:
        record = self.record(obj, record_id)
        if record is None:
            return 404, NOT_FOUND
        if method == "GET":
            wanted = query.get("fields", [""])[0]
            names = [n.strip() for n in wanted.split(",") if n.strip()] or sorted(self.fields[obj])
            unknown = [n for n in names if n not in self.fields[obj]]
            if unknown:
                return 400, [
                    {
                        "errorCode": "INVALID_FIELD",
                        "message": f"No such column '{unknown[0]}' on entity '{obj}'.",
                    }
                ]
            return 200, self._shape(obj, "62.0", record, names)
        problem = self._check_fields(obj, body, headers)
        if problem:
            return problem
        if obj == "Lead" and record.get("IsConverted"):
            return 400, CONVERTED_LEAD
        with self._lock:
            self.records[obj][record_id].update(body)
            self.records[obj][record_id]["LastModifiedDate"] = sf_time(dt.datetime.now(dt.UTC))
        return 204, None

    def _by_external(
        self,
        method: str,
        version: str,
        obj: str,
        name: str,
        value: str,
        query: dict[str, list[str]],
        body: Any,
    ) -> tuple[int, Any]:
        if obj != "Lead" or name not in self.external_id_fields:
            return 404, [
                {
                    "errorCode": "NOT_FOUND",
                    "message": "Provided external ID field does not exist or is not accessible: "
                    + name,
                }
            ]
        with self._lock:
            found = [r for r in self.records[obj].values() if str(r.get(name)) == value]
        if len(found) > 1:
            return 300, [f"/services/data/v{version}/sobjects/{obj}/{r['Id']}" for r in found]
        if method == "GET":
            if not found:
                return 404, NOT_FOUND
            wanted = query.get("fields", [""])[0]
            names = [n.strip() for n in wanted.split(",") if n.strip()] or sorted(self.fields[obj])
            return 200, self._shape(obj, version, found[0], names)
        headers = {"Content-Type": "application/json"}
        if isinstance(body, dict) and ("Id" in body or name in body):
            return 400, [
                {
                    "errorCode": "INVALID_FIELD",
                    "message": "the body may not hold the record's Id or external id",
                }
            ]
        problem = self._check_fields(obj, body, headers)
        if problem:
            return problem
        if not found:
            missing = [n for n in REQUIRED.get(obj, ()) if not str(body.get(n) or "").strip()]
            if missing:
                return 400, [
                    {
                        "message": f"Required fields are missing: [{', '.join(missing)}]",
                        "errorCode": "REQUIRED_FIELD_MISSING",
                        "fields": missing,
                    }
                ]
            duplicate = self._duplicates(body, version)
            if duplicate:
                return duplicate
            record_id = self.add(obj, **body, **{name: value})
            return 201, {"id": record_id, "success": True, "errors": [], "created": True}
        record_id = found[0]["Id"]
        if found[0].get("IsConverted"):
            return 400, CONVERTED_LEAD
        with self._lock:
            self.records[obj][record_id].update(body)
            self.records[obj][record_id]["LastModifiedDate"] = sf_time(dt.datetime.now(dt.UTC))
        if float(version) < 46:
            return 204, None
        return 200, {"id": record_id, "success": True, "errors": [], "created": False}


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


def _handler(standin: SalesforceStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # An answer's headers and body go out in two sends: with Nagle's algorithm the body
        # waits for the client's delayed ACK (~40 ms) on every kept-alive answer.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            answer = standin.handle(
                self.command, parts.path, parse_qs(parts.query), self.headers, raw
            )
            status, body = answer[0], answer[1]
            content_type = answer[2] if len(answer) > 2 else "application/json;charset=UTF-8"
            if body is None:
                data = b""
            elif isinstance(body, bytes):
                data = body
            else:
                data = json.dumps(body).encode()
            every = standin.take_trickle()
            if every:
                sent = [("Content-Type", content_type or "application/json")] if data else []
                _trickle(self, status, [*sent, ("Content-Length", str(len(data)))], data, every)
                return
            try:
                self.send_response(status)
                if data:
                    self.send_header("Content-Type", content_type or "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                return

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

    return Handler


@pytest.fixture
def salesforce_standin() -> Iterator[SalesforceStandIn]:
    """A running stand-in org; stopped (and its certificate removed) after the test."""
    standin = SalesforceStandIn().start()
    try:
        yield standin
    finally:
        standin.close()
