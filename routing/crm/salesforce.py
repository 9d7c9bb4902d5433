"""Salesforce: Leads, Contacts, Accounts and Users through ``simple-salesforce``. No Django here.

Authentication: the OAuth 2.0 client credentials flow or the JWT bearer flow, posted to the
org's My Domain (``<base_url>/services/oauth2/token``) ourselves, because simple-salesforce's
login helpers only reach ``https://<domain>.salesforce.com``. The access token is cached per
process (keyed by connection id, My Domain, consumer key and a hash of the secret) and replaced
at 80% of its lifetime (``expires_in`` when the answer has it, else the ``session_seconds``
option, default 7200 s: the org's session timeout), and at once on a 401 INVALID_SESSION_ID,
after which the call is retried once. Logins are single-flight per connection within a
process: threads that find the token missing, due or refused wait for the one that logs in and
take its token. Data calls go to the configured My Domain URL.

Every HTTP request, the token request included, goes through one ``requests.Session`` that
spends a rate-limit token first (``settings.spend(1)``), applies ``settings.timeout_seconds``
to each socket operation and ``settings.deadline_seconds`` to the whole request
(``routing.deadline``: a server trickling its answer is cut off), and trusts
``settings.ca_bundle`` when set.

First touch (``activity``), in order of precision:
1. the earliest Task or Event on the person (``WhoId``) created after ``since``: an exact time
   (``task`` / ``event``);
2. else ``LastActivityDate``, which Salesforce keeps as a *date* (no time): counted only when
   that date is after the day of ``since`` (a date on the same day may be before the
   assignment), as the start of that day in UTC (``last_activity_date``);
A Lead's ``Status`` is reported as it is; the first-touch job counts a status that moved away
from the one seen when the lead was looked up or written (``LastModifiedDate`` is no signal:
our own owner write-back moves it).
Write-back (``write_owner``): the person is the one known (a Lead converted since is the Contact
it became: ``IsConverted`` / ``ConvertedContactId`` read first, or a PATCH refused with
``CANNOT_UPDATE_CONVERTED_LEAD`` read again), else found by e-mail in the lookup's order (a
Contact, then an unconverted Lead: ``_person_by_email``), else created; a create a duplicate rule
blocks (``DUPLICATES_DETECTED``) takes the record it matched instead. Whichever it is, its owner
is read before anything is written, and one the CRM set is kept.
Salesforce does not say when the owner changed (only field history, when enabled, would), so
``owner_changed_at`` is None: the first-touch job compares the owner with the one we wrote.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from datetime import time as dtime
from typing import Any, TypeVar
from urllib.parse import quote

import jwt
import requests
from requests.adapters import HTTPAdapter
from simple_salesforce import Salesforce, SFType
from simple_salesforce.exceptions import (
    SalesforceError,
    SalesforceExpiredSession,
    SalesforceGeneralError,
    SalesforceMalformedRequest,
    SalesforceMoreThanOneRecord,
    SalesforceRefusedRequest,
    SalesforceResourceNotFound,
)
from simple_salesforce.format import format_soql

from routing.crm.base import (
    ACTIVITY_BATCH,
    SALESFORCE,
    Activity,
    Company,
    CrmError,
    CrmSettings,
    CrmUser,
    Person,
    PersonUpdate,
    WriteResult,
    domain_of,
    owner_is_foreign,
)
from routing.deadline import deadline_pools, within

__all__ = ["SalesforceClient", "clear_token_cache"]

DEFAULT_API_VERSION = "62.0"
DEFAULT_SESSION_SECONDS = 7200
DEFAULT_LEAD_STATUS = "Open - Not Contacted"
JWT_LIFETIME_SECONDS = 180
NOT_PROVIDED = "[not provided]"
MAX_PAGES = 500
_ID = re.compile(r"^[A-Za-z0-9]{15}([A-Za-z0-9]{3})?$")
_FIELD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")  # an API name: goes into SOQL as is
_PREFIX_OBJECT = {"00Q": "Lead", "003": "Contact"}
_PERSON_OBJECTS = ("Lead", "Contact")
_CREATE = (
    ("email", "Email"),
    ("first_name", "FirstName"),
    ("last_name", "LastName"),
    ("company", "Company"),
    ("phone", "Phone"),
    ("title", "Title"),
    ("country", "Country"),
)
_LEAD_FIELDS = "Id, Email, OwnerId, Status, LastModifiedDate"
# A Lead read by id at write time: a converted one is its Contact now (Salesforce refuses any
# edit of a converted Lead, 400 CANNOT_UPDATE_CONVERTED_LEAD).
_LEAD_READ_FIELDS = "Id, Email, OwnerId, Status, IsConverted, ConvertedContactId, LastModifiedDate"
# The REST API runs the org's active lead assignment rule on every Lead create and update unless
# told not to ("Assignment Rule Header", REST API Developer Guide): it would re-own what we write.
NO_AUTO_ASSIGN = {"Sforce-Auto-Assign": "FALSE"}
_CONTACT_FIELDS = "Id, Email, OwnerId, AccountId, LastModifiedDate"

T = TypeVar("T")


@dataclass
class _Token:
    access_token: str
    refresh_at: float


_tokens: dict[tuple[Any, ...], _Token] = {}
_tokens_lock = threading.Lock()


_login_locks: dict[tuple[Any, ...], threading.Lock] = {}


def _login_lock(key: tuple[Any, ...]) -> threading.Lock:
    """The lock one connection's logins queue on (one per cache key, made once)."""
    with _tokens_lock:
        return _login_locks.setdefault(key, threading.Lock())


def clear_token_cache() -> None:
    """Forget every cached access token (tests; a rotated credential is a new key anyway)."""
    with _tokens_lock:
        _tokens.clear()


class _DeadlineAdapter(HTTPAdapter):
    """requests' adapter whose connections join the call's deadline (``routing.deadline``)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        deadline_pools(self.poolmanager)


class _Session(requests.Session):
    """Spends a rate-limit token before every request; a default timeout and CA file, and a
    total deadline for each request."""

    def __init__(
        self, spend: Callable[[int], None], timeout: float, ca_bundle: str, deadline: float
    ) -> None:
        super().__init__()
        self._spend = spend
        self._timeout = timeout
        self._ca_bundle = ca_bundle
        self._deadline = deadline
        self.mount("https://", _DeadlineAdapter())
        self.mount("http://", _DeadlineAdapter())

    def request(self, method: Any, url: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", self._timeout)
        if self._ca_bundle:
            # Per request: a session-level verify loses to REQUESTS_CA_BUNDLE in requests.
            kwargs.setdefault("verify", self._ca_bundle)
        kwargs.setdefault("allow_redirects", False)
        self._spend(1)
        with within(self._deadline) as deadline:
            try:
                return super().request(method, url, *args, **kwargs)
            except requests.RequestException:
                if deadline.passed:
                    raise requests.Timeout(
                        f"no complete answer within {deadline.seconds:g} s"
                    ) from None
                raise


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _when(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _day(value: Any) -> date | None:
    if not isinstance(value, str):
        return None
    try:
        return date.fromisoformat(value[:10])
    except ValueError:
        return None


def _soql_time(value: datetime) -> str:
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _errors_of(content: Any) -> tuple[str, str]:
    """(errorCode, message) from Salesforce's error array, or ("", "")."""
    if isinstance(content, list) and content and isinstance(content[0], Mapping):
        return _text(content[0].get("errorCode")), _text(content[0].get("message"))[:300]
    return "", ""


class SalesforceClient:
    """``CrmClient`` for a Salesforce org reached at its My Domain URL."""

    kind = SALESFORCE

    def __init__(self, settings: CrmSettings) -> None:
        options = settings.options
        self.settings = settings
        self.base_url = settings.base_url.rstrip("/")
        self.auth_flow = str(options.get("auth_flow") or "client_credentials")
        self.client_id = str(options.get("client_id") or "")
        self.username = str(options.get("username") or "")
        self.api_version = str(options.get("api_version") or DEFAULT_API_VERSION)
        self.person_object = str(options.get("person_object") or "Lead")
        self.external_id_field = str(options.get("external_id_field") or "")
        self.default_lead_status = str(options.get("default_lead_status") or DEFAULT_LEAD_STATUS)
        self.session_seconds = float(options.get("session_seconds") or DEFAULT_SESSION_SECONDS)
        self.jwt_audience = str(options.get("jwt_audience") or self._default_audience())
        self.session = _Session(
            settings.spend, settings.timeout_seconds, settings.ca_bundle, settings.deadline_seconds
        )
        digest = hashlib.sha256(settings.secret.encode()).hexdigest()
        self._cache_key = (settings.connection_id, self.base_url, self.client_id, digest)

    # -- authentication ------------------------------------------------------------------

    def _default_audience(self) -> str:
        host = self.base_url.split("://", 1)[-1].split("/", 1)[0].lower()
        sandbox = ".sandbox.my.salesforce.com" in host or host.startswith("test.")
        return "https://test.salesforce.com" if sandbox else "https://login.salesforce.com"

    def _token_form(self) -> dict[str, str]:
        if not self.client_id:
            raise CrmError("config", "the connected app's consumer key is missing")
        if self.auth_flow == "jwt_bearer":
            if not self.username:
                raise CrmError("config", "the JWT bearer flow needs the integration username")
            now = int(time.time())
            claims = {
                "iss": self.client_id,
                "sub": self.username,
                "aud": self.jwt_audience,
                "exp": now + JWT_LIFETIME_SECONDS,
            }
            try:
                assertion = jwt.encode(claims, self.settings.secret, algorithm="RS256")
            except Exception as exc:  # PyJWT/cryptography: the key is not an RSA private key
                raise CrmError(
                    "config", "the JWT private key could not be used (not an RSA PEM key)"
                ) from exc
            return {
                "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                "assertion": assertion,
            }
        if self.auth_flow != "client_credentials":
            raise CrmError("config", f"unknown Salesforce auth flow {self.auth_flow!r}")
        return {
            "grant_type": "client_credentials",
            "client_id": self.client_id,
            "client_secret": self.settings.secret,
        }

    def _token(self, *, stale: str = "") -> str:
        """The cached access token, or a new one; ``stale``: the token the org just refused.

        Single-flight per connection within the process: the I/O worker runs many calls of
        one connection at once, and every one of them seeing an expired session (or no token
        yet) must not log in on its own. They queue on the connection's lock; the first logs
        in, the others find its token in the cache when they get the lock.
        """
        cached = self._cached(stale)
        if cached is not None:
            return cached
        with _login_lock(self._cache_key):
            cached = self._cached(stale)
            if cached is not None:
                return cached
            return self._login()

    def _cached(self, stale: str) -> str | None:
        with _tokens_lock:
            cached = _tokens.get(self._cache_key)
        if cached is None or cached.access_token == stale or time.time() >= cached.refresh_at:
            return None
        return cached.access_token

    def _login(self) -> str:
        form = self._token_form()
        url = f"{self.base_url}/services/oauth2/token"
        try:
            response = self.session.post(url, data=form, headers={"Accept": "application/json"})
        except requests.Timeout as exc:
            raise CrmError("unavailable", "Salesforce token request timed out") from exc
        except requests.RequestException as exc:
            raise CrmError(
                "unavailable", f"Salesforce token endpoint unreachable ({type(exc).__name__})"
            ) from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        status = response.status_code
        if status != 200:
            if status >= 500:
                raise CrmError("unavailable", "Salesforce token endpoint failed", status=status)
            if status == 429:
                raise CrmError("rate_limited", "Salesforce token endpoint throttled", status=status)
            if isinstance(body, Mapping) and isinstance(body.get("error"), str):
                text = f"{body['error']}: {_text(body.get('error_description'))[:200]}"
                raise CrmError("auth", f"Salesforce refused the credential ({text})", status=status)
            raise CrmError("malformed", "Salesforce token endpoint answered garbage", status=status)
        token = body.get("access_token") if isinstance(body, Mapping) else None
        if not isinstance(token, str) or not token:
            raise CrmError("malformed", "Salesforce token answer has no access_token", status=200)
        lifetime = self.session_seconds
        expires_in = body.get("expires_in") if isinstance(body, Mapping) else None
        given = _seconds(expires_in)
        if given is not None:
            lifetime = given
        entry = _Token(token, time.time() + 0.8 * lifetime)
        with _tokens_lock:
            _tokens[self._cache_key] = entry
        return token

    def _api(self, token: str) -> Salesforce:
        return Salesforce(
            instance_url=self.base_url,
            session_id=token,
            version=self.api_version,
            session=self.session,
        )

    def _call(self, fn: Callable[[Salesforce], T]) -> T:
        """Run ``fn`` with an authenticated client, mapping every failure to ``CrmError``."""
        token = self._token()
        try:
            try:
                return fn(self._api(token))
            except SalesforceExpiredSession:
                token = self._token(stale=token)
                return fn(self._api(token))
        except CrmError:
            raise
        except SalesforceError as exc:
            raise self._mapped(exc) from None
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise CrmError(
                "malformed", f"Salesforce answered what it does not document ({type(exc).__name__})"
            ) from None
        except requests.Timeout:
            raise CrmError("unavailable", "Salesforce timed out") from None
        except requests.RequestException as exc:
            raise CrmError(
                "unavailable", f"Salesforce unreachable ({type(exc).__name__})"
            ) from None

    def _mapped(self, exc: SalesforceError) -> CrmError:
        code, message = _errors_of(exc.content)
        status = exc.status
        said = f"{code}: {message}" if code else "no error body"
        if isinstance(exc, SalesforceExpiredSession):
            return CrmError(
                "auth", f"Salesforce session refused after a refresh ({said})", status=401
            )
        if isinstance(exc, SalesforceRefusedRequest):
            if code == "REQUEST_LIMIT_EXCEEDED":
                return CrmError("rate_limited", f"Salesforce API limit ({said})", status=403)
            return CrmError(
                "auth", f"Salesforce refused the request ({said})", status=403, permission=True
            )
        if isinstance(exc, SalesforceMalformedRequest) and code == "INVALID_TYPE":
            # Every object queried is a standard one: "not supported" means the integration
            # user cannot read it (Salesforce hides what a profile cannot see). A permission.
            return CrmError(
                "auth",
                f"Salesforce: the integration user cannot read it ({said})",
                status=status,
                permission=True,
            )
        if isinstance(exc, SalesforceMalformedRequest | SalesforceResourceNotFound):
            return CrmError("rejected", f"Salesforce rejected the request ({said})", status=status)
        if isinstance(exc, SalesforceMoreThanOneRecord):
            return CrmError("rejected", "Salesforce found more than one record", status=status)
        if isinstance(exc, SalesforceGeneralError) and status == 429:
            return CrmError("rate_limited", f"Salesforce throttled ({said})", status=status)
        if status >= 500:
            return CrmError("unavailable", f"Salesforce failed ({said})", status=status)
        return CrmError("rejected", f"Salesforce answered {status} ({said})", status=status)

    # -- queries -------------------------------------------------------------------------

    def _records(
        self, sf: Salesforce, soql: str, *, all_pages: bool = False
    ) -> list[dict[str, Any]]:
        result = sf.query(soql)
        records: list[dict[str, Any]] = []
        for _ in range(MAX_PAGES):
            if not isinstance(result, Mapping) or not isinstance(result.get("records"), list):
                raise CrmError("malformed", "a Salesforce query answer without records")
            for record in result["records"]:
                if not isinstance(record, Mapping):
                    raise CrmError("malformed", "a Salesforce query record that is no object")
                records.append(dict(record))
            if not all_pages or result.get("done") is not False:
                return records
            following = result.get("nextRecordsUrl")
            if not isinstance(following, str) or not following.startswith("/services/data/"):
                raise CrmError("malformed", "a Salesforce query page without a valid next page")
            result = sf.query_more(following, identifier_is_url=True)
        raise CrmError("malformed", f"a Salesforce query with more than {MAX_PAGES} pages")

    def _query(self, soql: str, *, all_pages: bool = False) -> list[dict[str, Any]]:
        return self._call(lambda sf: self._records(sf, soql, all_pages=all_pages))

    def _person(self, obj: str, record: Mapping[str, Any]) -> Person:
        record_id = _text(record.get("Id"))
        if not record_id:
            raise CrmError("malformed", f"a Salesforce {obj} without an Id")
        return Person(
            object=obj,
            id=record_id,
            email=_text(record.get("Email")),
            owner_id=_text(record.get("OwnerId")),
            owner_changed_at=None,
            modified_at=_when(record.get("LastModifiedDate")),
            status=_text(record.get("Status")) if obj == "Lead" else "",
            company_id=_text(record.get("AccountId")) if obj == "Contact" else "",
            url=f"{self.base_url}/{record_id}",
        )

    def _object_of(self, person_id: str, person_object: str = "") -> str:
        obj = person_object or _PREFIX_OBJECT.get(person_id[:3], "")
        if obj not in _PERSON_OBJECTS:
            raise CrmError("rejected", f"not a Salesforce Lead or Contact: {person_object!r}")
        if not _ID.match(person_id):
            raise CrmError("rejected", "not a Salesforce record id")
        return obj

    # -- the protocol --------------------------------------------------------------------

    def check(self) -> str:
        """One row of each object the stages read: Users (the roster), Leads, Contacts and
        Accounts (the lookup); every object the integration user cannot read is named."""
        unreadable: list[str] = []
        for obj in ("User", "Lead", "Contact", "Account"):
            try:
                self._query(format_soql("SELECT Id FROM {:literal} LIMIT 1", obj))
            except CrmError as exc:
                if not exc.permission:
                    raise  # a refused credential, Salesforce down: the same for every query
                unreadable.append(obj)
        if unreadable:
            raise CrmError(
                "auth",
                "the integration user cannot read "
                + ", ".join(unreadable)
                + " (INVALID_TYPE: give its profile or a permission set Read on "
                + ("them" if len(unreadable) > 1 else "it")
                + ")",
                status=400,
                permission=True,
            )
        who = self.username or self.client_id
        return f"Salesforce: connected as {who} ({self.base_url}, API v{self.api_version})"

    def find_person(self, email: str) -> Person | None:
        found = self._person_by_email(email)
        return found[0] if found is not None else None

    def _person_by_email(
        self, email: str, lead_extra: str = ""
    ) -> tuple[Person, dict[str, Any]] | None:
        """The person with ``email``, in the one order every path uses: the latest Contact,
        else the latest unconverted Lead (``lead_extra``: one more Lead field to read)."""
        email = (email or "").strip()
        if not email:
            return None
        contacts = self._query(
            format_soql(
                "SELECT {:literal} FROM Contact WHERE Email = {} "
                "ORDER BY LastModifiedDate DESC LIMIT 1",
                _CONTACT_FIELDS,
                email,
            )
        )
        if contacts:
            return self._person("Contact", contacts[0]), contacts[0]
        lead_fields = f"{_LEAD_FIELDS}, {lead_extra}" if lead_extra else _LEAD_FIELDS
        leads = self._query(
            format_soql(
                "SELECT {:literal} FROM Lead WHERE Email = {} AND IsConverted = false "
                "ORDER BY LastModifiedDate DESC LIMIT 1",
                lead_fields,
                email,
            )
        )
        return (self._person("Lead", leads[0]), leads[0]) if leads else None

    def find_company(self, domain: str) -> Company | None:
        wanted = domain_of(domain)
        if not wanted:
            return None
        rows = self._query(
            format_soql(
                "SELECT Id, Name, Website, OwnerId, LastModifiedDate FROM Account "
                "WHERE Website LIKE '%{:like}%' ORDER BY LastModifiedDate DESC LIMIT 200",
                wanted,
            )
        )
        for row in rows:
            host = domain_of(_text(row.get("Website")))
            if host == wanted or host.endswith("." + wanted):
                account_id = _text(row.get("Id"))
                if not account_id:
                    raise CrmError("malformed", "a Salesforce Account without an Id")
                return Company(
                    object="Account",
                    id=account_id,
                    name=_text(row.get("Name")),
                    domain=wanted,
                    owner_id=_text(row.get("OwnerId")),
                    url=f"{self.base_url}/{account_id}",
                )
        return None

    def _read(self, obj: str, person_id: str, fields: str) -> dict[str, Any] | None:
        params = {"fields": fields.replace(" ", "")}

        def read(sf: Salesforce) -> Any:
            try:
                return _sobject(sf, obj).get(person_id, params=params)
            except SalesforceResourceNotFound:
                return None

        record = self._call(read)
        if record is None:
            return None
        if not isinstance(record, Mapping):
            raise CrmError("malformed", f"a Salesforce {obj} that is no object")
        return dict(record)

    def _current(
        self, obj: str, person_id: str, extra: str = ""
    ) -> tuple[Person, dict[str, Any]] | None:
        """The person to write to, read now: a converted Lead is the Contact it became (None
        when that Contact is gone, or the record is). ``extra``: one more Lead field to read."""
        if obj == "Contact":
            record = self._read("Contact", person_id, _CONTACT_FIELDS)
            return (self._person("Contact", record), record) if record is not None else None
        fields = f"{_LEAD_READ_FIELDS}, {extra}" if extra else _LEAD_READ_FIELDS
        record = self._read("Lead", person_id, fields)
        if record is None:
            return None
        if record.get("IsConverted") is True:
            contact_id = _text(record.get("ConvertedContactId"))
            if not _ID.match(contact_id):
                return None
            return self._current("Contact", contact_id)
        return self._person("Lead", record), record

    def _get(self, obj: str, person_id: str) -> Person | None:
        fields = _CONTACT_FIELDS if obj == "Contact" else _LEAD_FIELDS
        record = self._read(obj, person_id, fields)
        return None if record is None else self._person(obj, record)

    def get_person(self, person_id: str, person_object: str = "") -> Person | None:
        return self._get(self._object_of(person_id, person_object), person_id)

    def write_owner(
        self,
        update: PersonUpdate,
        *,
        known_owner_id: str,
        before_write: Callable[[], None] = lambda: None,
    ) -> WriteResult:
        found: tuple[Person, dict[str, Any]] | None = None
        if update.person_id:
            found = self._current(
                self._object_of(update.person_id, update.person_object), update.person_id
            )
        if found is None and self.external_id_field and update.external_id:
            return self._upsert(update, known_owner_id, before_write)
        if found is None:
            found = self._person_by_email(update.email)
        if found is None:
            before_write()
            created = self._create(update)
            if isinstance(created, WriteResult):
                return created
            found = created
        return self._own(found[0], found[1], update, known_owner_id, before_write)

    def _own(
        self,
        person: Person,
        record: Mapping[str, Any],
        update: PersonUpdate,
        known_owner_id: str,
        before_write: Callable[[], None],
        converted_ok: bool = True,
    ) -> WriteResult:
        """Give an existing ``person`` our owner, unless the CRM set another (``kept``); a Lead
        without our external id (when one is configured) gets it too, nothing else."""
        if owner_is_foreign(
            person.owner_id,
            ours=update.owner_id,
            known=known_owner_id,
            earlier=update.earlier_owner_ids,
        ):
            return WriteResult("kept", person)
        changes: dict[str, Any] = {}
        if person.owner_id != update.owner_id:
            changes["OwnerId"] = update.owner_id
        field_name = self.external_id_field
        if (
            field_name
            and update.external_id
            and person.object == "Lead"
            and field_name in record
            and not record.get(field_name)
        ):
            changes[field_name] = update.external_id
        if changes:
            before_write()

            def patch(sf: Salesforce) -> bool:
                try:
                    _sobject(sf, person.object).update(person.id, changes, headers=NO_AUTO_ASSIGN)
                except SalesforceMalformedRequest as exc:
                    if _errors_of(exc.content)[0] != "CANNOT_UPDATE_CONVERTED_LEAD":
                        raise
                    return False
                return True

            if not self._call(patch):
                # Converted since it was read: the owner goes to the Contact it became, by the
                # same rules (its owner read first).
                converted = self._current("Lead", person.id) if converted_ok else None
                if converted is None or converted[0].object != "Contact":
                    raise CrmError(
                        "unavailable",
                        f"Salesforce Lead {person.id} was converted while its owner was being "
                        "written (CANNOT_UPDATE_CONVERTED_LEAD); tried again later",
                        status=400,
                    )
                return self._own(
                    converted[0], converted[1], update, known_owner_id, before_write, False
                )
        return WriteResult("updated", _with_owner(person, update.owner_id))

    def _duplicate_of(self, content: Any, extra: str = "") -> tuple[Person, dict[str, Any]]:
        """The person a duplicate rule matched (``DUPLICATES_DETECTED``: the REST error's
        ``duplicateResult.matchResults[].matchRecords[].record.Id``), a Contact before a Lead;
        a ``rejected`` CrmError naming the rule when no match can be read."""
        first = content[0] if isinstance(content, list) and content else {}
        result = first.get("duplicateResult") if isinstance(first, Mapping) else None
        result = result if isinstance(result, Mapping) else {}
        rule = _text(result.get("duplicateRule")) or "a duplicate rule"
        ids: list[str] = []
        matches = result.get("matchResults")
        for match in matches if isinstance(matches, list) else []:
            records = match.get("matchRecords") if isinstance(match, Mapping) else None
            for entry in records if isinstance(records, list) else []:
                record = entry.get("record") if isinstance(entry, Mapping) else None
                record_id = _text(record.get("Id")) if isinstance(record, Mapping) else ""
                if _ID.match(record_id) and record_id[:3] in _PREFIX_OBJECT:
                    ids.append(record_id)
        for record_id in sorted(ids, key=lambda i: _PREFIX_OBJECT[i[:3]] != "Contact"):
            found = self._current(_PREFIX_OBJECT[record_id[:3]], record_id, extra)
            if found is not None:
                return found
        raise CrmError(
            "rejected",
            f"Salesforce's duplicate rule {rule} blocks creating this {self.person_object} "
            "(DUPLICATES_DETECTED) and names no Lead or Contact the integration user can read: "
            "give the integration user access to the matching records, or set the rule to "
            "allow (and report) API creates",
            status=400,
        )

    def _duplicate_content(self, exc: SalesforceError) -> Any:
        code, _ = _errors_of(exc.content)
        return exc.content if code == "DUPLICATES_DETECTED" else None

    def _create_body(self, update: PersonUpdate, obj: str) -> dict[str, Any]:
        values = dict(update.fields)
        values.setdefault("email", update.email)
        body: dict[str, Any] = {}
        for key, field_name in _CREATE:
            value = values.get(key)
            if field_name == "Company" and obj != "Lead":
                continue
            if isinstance(value, str) and value.strip():
                body[field_name] = value.strip()
        if obj == "Lead":
            body.setdefault("Company", NOT_PROVIDED)
        body.setdefault("LastName", NOT_PROVIDED)
        body["OwnerId"] = update.owner_id
        return body

    def _created(self, obj: str, answer: Any, update: PersonUpdate) -> Person:
        if not isinstance(answer, Mapping) or not _text(answer.get("id")):
            raise CrmError("malformed", f"a Salesforce {obj} create answer without an id")
        record_id = _text(answer["id"])
        return Person(
            object=obj,
            id=record_id,
            email=update.email,
            owner_id=update.owner_id,
            url=f"{self.base_url}/{record_id}",
        )

    def _create(self, update: PersonUpdate) -> WriteResult | tuple[Person, dict[str, Any]]:
        """Create the person; a duplicate rule that blocks it gives the person it matched."""
        obj = self.person_object
        body = self._create_body(update, obj)

        def create(sf: Salesforce) -> Any:
            try:
                return _sobject(sf, obj).create(body, headers=NO_AUTO_ASSIGN)
            except SalesforceMalformedRequest as exc:
                duplicate = self._duplicate_content(exc)
                if duplicate is None:
                    raise
                return _Duplicate(duplicate)

        answer = self._call(create)
        if isinstance(answer, _Duplicate):
            return self._duplicate_of(answer.content)
        return WriteResult("created", self._created(obj, answer, update))

    def _upsert(
        self, update: PersonUpdate, known_owner_id: str, before_write: Callable[[], None]
    ) -> WriteResult:
        """The external id path: the person found by e-mail (a Contact, then an unconverted
        Lead: ``_person_by_email``, the lookup's order) gets only its owner (and, a Lead
        without one, our external id), never its other fields; only a person who is absent is
        created, by an upsert on the external id (a repeat finds what the first made), or, when
        a duplicate rule blocks that, the person the rule matched is given the owner instead."""
        field_name = self.external_id_field
        if not _FIELD_NAME.match(field_name):
            raise CrmError("config", "the external id field is not a Salesforce field name")
        found = self._person_by_email(update.email, lead_extra=field_name)
        if found is not None:
            return self._own(found[0], found[1], update, known_owner_id, before_write)
        body = self._create_body(update, "Lead")
        before_write()
        path = f"{self.external_id_field}/{quote(update.external_id, safe='')}"

        def upsert(sf: Salesforce) -> Any:
            try:
                return _sobject(sf, "Lead").upsert(
                    path, body, raw_response=True, headers=NO_AUTO_ASSIGN
                )
            except SalesforceMalformedRequest as exc:
                duplicate = self._duplicate_content(exc)
                if duplicate is None:
                    raise
                return _Duplicate(duplicate)

        response = self._call(upsert)
        if isinstance(response, _Duplicate):
            person, record = self._duplicate_of(response.content, extra=field_name)
            return self._own(person, record, update, known_owner_id, before_write)
        status = response.status_code
        if status == 201:
            return WriteResult("created", self._created("Lead", self._json(response), update))
        if status == 200:
            return WriteResult("updated", self._created("Lead", self._json(response), update))
        # 204 (API 45.0 and earlier): no body, so read the record's id by its external id.
        record = self._call(
            lambda sf: _sobject(sf, "Lead").get_by_custom_id(
                self.external_id_field, update.external_id, params={"fields": "Id"}
            )
        )
        return WriteResult("updated", self._created("Lead", _id_answer(record), update))

    @staticmethod
    def _json(response: Any) -> Any:
        try:
            return response.json()
        except ValueError:
            raise CrmError("malformed", "a Salesforce upsert answer that is no JSON") from None

    def activity(
        self,
        people: Sequence[tuple[str, str]],
        since: datetime,
        since_by_id: Mapping[str, datetime] | None = None,
    ) -> list[Activity]:
        def since_of(person_id: str) -> datetime:
            return (since_by_id or {}).get(person_id, since)

        by_object: dict[str, list[str]] = {"Lead": [], "Contact": []}
        for obj, person_id in people[:ACTIVITY_BATCH]:
            try:
                by_object[self._object_of(person_id, obj)].append(person_id)
            except CrmError:
                continue
        ids = by_object["Lead"] + by_object["Contact"]
        if not ids:
            return []
        rows: list[tuple[str, dict[str, Any]]] = []
        for obj, extra in (("Lead", ", Status"), ("Contact", "")):
            if by_object[obj]:
                soql = format_soql(
                    "SELECT Id, OwnerId{:literal}, LastActivityDate FROM {:literal} WHERE Id IN {}",
                    extra,
                    obj,
                    by_object[obj],
                )
                rows += [(obj, row) for row in self._query(soql, all_pages=True)]
        first: dict[str, tuple[datetime, str]] = {}
        after = _soql_time(since)
        for activity_object in ("Task", "Event"):
            soql = format_soql(
                "SELECT WhoId, CreatedDate FROM {:literal} WHERE WhoId IN {} "
                "AND CreatedDate > {:literal} ORDER BY CreatedDate ASC",
                activity_object,
                ids,
                after,
            )
            for row in self._query(soql, all_pages=True):
                who, created = _text(row.get("WhoId")), _when(row.get("CreatedDate"))
                if (
                    who
                    and created is not None
                    and created > since_of(who)
                    and (who not in first or created < first[who][0])
                ):
                    first[who] = (created, activity_object.lower())
        result = []
        for obj, row in rows:
            person_id = _text(row.get("Id"))
            if not person_id:
                raise CrmError("malformed", f"a Salesforce {obj} without an Id")
            touched_at: datetime | None = None
            touch_kind = ""
            status = _text(row.get("Status")) if obj == "Lead" else ""
            if person_id in first:
                touched_at, touch_kind = first[person_id]
            else:
                day = _day(row.get("LastActivityDate"))
                if day is not None and day > since_of(person_id).astimezone(UTC).date():
                    touched_at = datetime.combine(day, dtime.min, tzinfo=UTC)
                    touch_kind = "last_activity_date"
            result.append(
                Activity(
                    person_id=person_id,
                    owner_id=_text(row.get("OwnerId")),
                    touched_at=touched_at,
                    touch_kind=touch_kind,
                    status=status,
                    owner_changed_at=None,
                )
            )
        return result

    def users(self) -> list[CrmUser]:
        rows = self._query(
            "SELECT Id, Email, Name, IsActive FROM User WHERE UserType = 'Standard'",
            all_pages=True,
        )
        return list(_users(rows))


def _users(rows: list[dict[str, Any]]) -> Iterator[CrmUser]:
    for row in rows:
        user_id = _text(row.get("Id"))
        if not user_id:
            raise CrmError("malformed", "a Salesforce User without an Id")
        yield CrmUser(
            id=user_id,
            email=_text(row.get("Email")).lower(),
            name=_text(row.get("Name")),
            active=row.get("IsActive") is not False,
        )


@dataclass(frozen=True)
class _Duplicate:
    """A create a duplicate rule blocked: the REST error array, with its ``duplicateResult``."""

    content: Any


def _with_owner(person: Person, owner_id: str) -> Person:
    return Person(
        object=person.object,
        id=person.id,
        email=person.email,
        owner_id=owner_id,
        owner_changed_at=person.owner_changed_at,
        modified_at=person.modified_at,
        status=person.status,
        company_id=person.company_id,
        url=person.url,
    )


def _id_answer(record: Any) -> dict[str, Any]:
    if not isinstance(record, Mapping) or not _text(record.get("Id")):
        raise CrmError("malformed", "a Salesforce Lead read by external id without an Id")
    return {"id": record["Id"]}


def _sobject(sf: Salesforce, name: str) -> SFType:
    """The REST resource of one sObject (``sf.Lead``), typed."""
    return SFType(name, sf.session_id, sf.sf_instance, sf.sf_version, session=sf.session)


def _seconds(value: Any) -> float | None:
    """A token answer's ``expires_in`` as seconds, or None when it is not a plain count: a
    whole number (or a string of ASCII digits) from 0 to a year. ``str.isdigit`` let "²" and
    other Unicode digits through to ``float()``, which raised."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        if not (value.isascii() and value.isdigit() and len(value) <= 9):
            return None
        value = int(value)
    if isinstance(value, int | float) and 0 <= value <= 366 * 86400:
        return float(value)
    return None
