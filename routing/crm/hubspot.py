"""HubSpot: contacts, companies and owners through ``hubspot-api-client``. No Django here.

Authentication: a private app's access token (``Authorization: Bearer pat-...``), which does
not expire; a revoked token or one without a scope answers 401/403, an ``auth`` error.
Scopes used: ``crm.objects.contacts.read``/``.write`` (lookup, write-back, first touch),
``crm.objects.companies.read`` (company by domain), ``crm.objects.owners.read`` (the roster).

Calls (HubSpot CRM API v3, https://developers.hubspot.com/docs/guides/api/crm/):
- a person: ``POST /crm/v3/objects/contacts/search`` by ``email``, or ``hs_additional_emails``
  (a contact's other addresses), most recently modified first. Search is eventually consistent:
  a contact created a moment ago may not be found yet, so a create that answers ``409 Contact
  already exists. Existing ID: N`` reads and updates contact N instead;
- a company: ``POST /crm/v3/objects/companies/search`` by ``domain`` (with and without
  ``www.``);
- write-back: ``PATCH /crm/v3/objects/contacts/{id}`` (``hubspot_owner_id``) or ``POST
  /crm/v3/objects/contacts``;
- first touch: ``POST /crm/v3/objects/contacts/batch/read`` (up to 100 ids; ``207`` leaves out
  deleted contacts);
- the roster: ``GET /crm/v3/owners/`` (every page, active owners then ``archived=true``);
- the portal id and UI host for record links: ``GET /account-info/v3/details``, once per
  process and connection (no link when it fails).

The client library's own retries are off: every HTTP request spends one token of the shared
rate limit first (``settings.spend(1)``), so a retry must go through the stages' limit too.
``settings.timeout_seconds`` applies to each socket operation, ``settings.deadline_seconds`` to
the whole of each request (``routing.deadline``: a server trickling its answer is cut off), and
``settings.ca_bundle`` is trusted when set.

First touch: HubSpot keeps the *latest* time a rep reached the contact: ``notes_last_contacted``
("Last contacted": a call, sales e-mail or meeting logged) and
``hs_last_sales_activity_timestamp`` ("Last engagement date"). A value after ``since`` means
the contact was touched after the assignment; the earliest such value is reported (the job
polls every minute, so it is the first touch within that minute's precision). ``hs_lead_status``
is the status the first-touch job compares with the one seen before; ``hubspot_owner_assigneddate``
says when the owner last changed.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import urllib3
from hubspot import HubSpot
from hubspot.crm.companies import ApiException as CompaniesApiException
from hubspot.crm.companies import Filter as CompanyFilter
from hubspot.crm.companies import FilterGroup as CompanyFilterGroup
from hubspot.crm.companies import PublicObjectSearchRequest as CompanySearchRequest
from hubspot.crm.contacts import ApiException as ContactsApiException
from hubspot.crm.contacts import (
    BatchReadInputSimplePublicObjectId,
    Filter,
    FilterGroup,
    PublicObjectSearchRequest,
    SimplePublicObjectId,
    SimplePublicObjectInput,
    SimplePublicObjectInputForCreate,
)
from hubspot.crm.owners import ApiException as OwnersApiException
from urllib3.util.retry import Retry

from routing.crm.base import (
    ACTIVITY_BATCH,
    HUBSPOT,
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

__all__ = ["HubSpotClient", "clear_account_cache"]

DEFAULT_BASE_URL = "https://api.hubapi.com"
# HubSpot sends no Retry-After on a 429; its body's policyName says which window was full.
# SECONDLY (the search endpoints' 5 a second) clears within a second, TEN_SECONDLY_ROLLING
# (the private app's 100-190 per 10 s) within ten, DAILY in the next day: wait that long.
POLICY_RETRY_AFTER = {"SECONDLY": 1.0, "TEN_SECONDLY_ROLLING": 10.0, "DAILY": 3600.0}
DEFAULT_RETRY_AFTER = 1.0  # a 429 naming no known policy: as for the secondly limit
OWNERS_PAGE = 500
MAX_PAGES = 200
_CONTACT_PROPERTIES = [
    "email",
    "hubspot_owner_id",
    "hubspot_owner_assigneddate",
    "lastmodifieddate",
    "hs_lead_status",
    "associatedcompanyid",
]
_TOUCH_PROPERTIES = ["notes_last_contacted", "hs_last_sales_activity_timestamp"]
_COMPANY_PROPERTIES = ["name", "domain", "hubspot_owner_id", "hs_lastmodifieddate"]
_CREATE = (
    ("email", "email"),
    ("first_name", "firstname"),
    ("last_name", "lastname"),
    ("company", "company"),
    ("phone", "phone"),
    ("title", "jobtitle"),
    ("country", "country"),
)
_EXISTING_ID = re.compile(r"Existing ID:\s*(\d+)")
_NUMERIC = re.compile(r"^\d{1,20}$")
_API_EXCEPTIONS = (ContactsApiException, CompaniesApiException, OwnersApiException)

T = TypeVar("T")

# (connection id, base URL, token hash) -> (UI host, portal id), or None when unknown.
_accounts: dict[tuple[Any, ...], tuple[str, str] | None] = {}
_accounts_lock = threading.Lock()


def clear_account_cache() -> None:
    """Forget the portal ids read for record links (tests; a new token is a new key anyway)."""
    with _accounts_lock:
        _accounts.clear()


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return ""


def _when(value: Any) -> datetime | None:
    """A HubSpot datetime property: ISO 8601 (v3), or epoch milliseconds (older properties)."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    text = _text(value).strip()
    if not text:
        return None
    if text.isdigit():
        try:
            return datetime.fromtimestamp(int(text) / 1000, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _body(exc: Any) -> Mapping[str, Any] | None:
    try:
        body = json.loads(exc.body) if exc.body else None
    except (TypeError, ValueError):
        body = None
    return body if isinstance(body, Mapping) else None


def _error_body(exc: Any) -> tuple[str, str, str]:
    """(category, message, policyName) from HubSpot's error body, or empty strings."""
    body = _body(exc)
    if body is None:
        return "", "", ""
    category = _text(body.get("category")) or _text(body.get("errorType"))
    return category, _text(body.get("message"))[:300], _text(body.get("policyName"))


def _required_scopes(exc: Any) -> list[str]:
    """The scopes a 403 MISSING_SCOPES names (``errors[].context.requiredGranularScopes``, or
    ``requiredScopes`` in older answers)."""
    body = _body(exc)
    errors = body.get("errors") if body is not None else None
    scopes: list[str] = []
    for error in errors if isinstance(errors, list) else []:
        context = error.get("context") if isinstance(error, Mapping) else None
        if not isinstance(context, Mapping):
            continue
        for key in ("requiredGranularScopes", "requiredScopes"):
            values = context.get(key)
            for value in values if isinstance(values, list) else []:
                if isinstance(value, str) and re.fullmatch(r"[a-z0-9._-]{1,100}", value):
                    scopes.append(value)
    return list(dict.fromkeys(scopes))[:10]


def _retry_after(exc: Any, policy: str) -> float:
    headers = getattr(exc, "headers", None) or {}
    raw = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        seconds = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        seconds = None
    if seconds is not None and 0 <= seconds <= 86_400:
        return seconds
    return POLICY_RETRY_AFTER.get(policy.upper(), DEFAULT_RETRY_AFTER)


def _mapped(exc: Any) -> CrmError:
    status = int(getattr(exc, "status", 0) or 0)
    category, message, policy = _error_body(exc)
    said = f"{category}: {message}" if category else (message or "no error body")
    if status == 401:
        return CrmError("auth", f"HubSpot refused the token ({said})", status=status)
    if status == 403:
        scopes = _required_scopes(exc)
        if scopes:
            said = f"{category or 'MISSING_SCOPES'}: the token lacks {', '.join(scopes)}"
        return CrmError(
            "auth", f"HubSpot refused the request ({said})", status=status, permission=True
        )
    if status == 429:
        return CrmError(
            "rate_limited",
            f"HubSpot rate limit ({policy or 'unknown'} policy)",
            status=status,
            retry_after=_retry_after(exc, policy),
        )
    if status >= 500 or status == 0:
        return CrmError("unavailable", f"HubSpot failed ({said})", status=status or None)
    if not category and not message:
        return CrmError(
            "malformed", "HubSpot answered an error without its error body", status=status
        )
    return CrmError("rejected", f"HubSpot rejected the request ({said})", status=status)


def _classified(exc: Exception) -> CrmError:
    """A failure of the client library (or of its answer) as the ``CrmError`` it means."""
    if isinstance(exc, _API_EXCEPTIONS):
        return _mapped(exc)
    if isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError):
        return CrmError("unavailable", "HubSpot timed out")
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        if isinstance(getattr(exc, "reason", None), urllib3.exceptions.TimeoutError):
            return CrmError("unavailable", "HubSpot timed out")
        return CrmError("unavailable", f"HubSpot unreachable ({type(exc).__name__})")
    if isinstance(exc, ValueError | TypeError | KeyError | AttributeError | IndexError):
        return CrmError(
            "malformed", f"HubSpot answered what it does not document ({type(exc).__name__})"
        )
    raise exc


def _properties(obj: Any) -> dict[str, Any]:
    properties = getattr(obj, "properties", None)
    if not isinstance(properties, Mapping):
        raise CrmError("malformed", "a HubSpot object without properties")
    return dict(properties)


def _object_id(obj: Any) -> str:
    object_id = _text(getattr(obj, "id", None))
    if not _NUMERIC.match(object_id):
        raise CrmError("malformed", "a HubSpot object without a numeric id")
    return object_id


class HubSpotClient:
    """``CrmClient`` for one HubSpot account, reached with a private app's token."""

    kind = HUBSPOT

    def __init__(self, settings: CrmSettings) -> None:
        if not settings.secret.strip():
            raise CrmError("config", "no HubSpot private app token")
        self.settings = settings
        self.base_url = (settings.base_url or DEFAULT_BASE_URL).rstrip("/")
        options: dict[str, Any] = {
            "access_token": settings.secret.strip(),
            "host": self.base_url,
            # One request per call: a retry goes through the shared rate limit like any call.
            "retry": Retry(total=0, connect=0, read=0, redirect=0, status=0, other=0),
        }
        if settings.ca_bundle:
            options["ssl_ca_cert"] = settings.ca_bundle
        api = HubSpot(**options)
        self._contacts_search = api.crm.contacts.search_api
        self._contacts_basic = api.crm.contacts.basic_api
        self._contacts_batch = api.crm.contacts.batch_api
        self._companies_search = api.crm.companies.search_api
        self._owners = api.crm.owners.owners_api
        for endpoint in (
            self._contacts_search,
            self._contacts_basic,
            self._contacts_batch,
            self._companies_search,
            self._owners,
        ):
            deadline_pools(endpoint.api_client.rest_client.pool_manager)
        self._timeout = settings.timeout_seconds
        digest = hashlib.sha256(settings.secret.encode()).hexdigest()
        self._account_key = (settings.connection_id, self.base_url, digest)

    # -- calls ---------------------------------------------------------------------------

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One HTTP request through the client library, every failure mapped to ``CrmError``."""
        self.settings.spend(1)
        with within(self.settings.deadline_seconds) as deadline:
            try:
                return fn(*args, _request_timeout=self._timeout, **kwargs)
            except CrmError:
                raise
            except Exception as exc:
                if deadline.passed:
                    raise CrmError(
                        "unavailable",
                        f"HubSpot gave no complete answer within {deadline.seconds:g} s",
                    ) from None
                raise _classified(exc) from None

    def _results(self, answer: Any) -> list[Any]:
        results = getattr(answer, "results", None)
        if not isinstance(results, list):
            raise CrmError("malformed", "a HubSpot answer without results")
        return results

    # -- record links --------------------------------------------------------------------

    def _account(self) -> tuple[str, str] | None:
        with _accounts_lock:
            if self._account_key in _accounts:
                return _accounts[self._account_key]
        found: tuple[str, str] | None = None
        try:
            details = self._call(
                self._owners.api_client.call_api,
                "/account-info/v3/details",
                "GET",
                header_params={"Accept": "application/json"},
                response_types_map={200: "object"},
                auth_settings=["oauth2"],
                _return_http_data_only=True,
            )
        except CrmError as exc:
            if exc.kind in ("unavailable", "rate_limited"):
                return None  # try again on a later call
            details = None
        if isinstance(details, Mapping):
            portal = _text(details.get("portalId"))
            ui = _text(details.get("uiDomain")) or "app.hubspot.com"
            if _NUMERIC.match(portal) and re.fullmatch(r"[a-z0-9.-]{3,100}", ui):
                found = (ui, portal)
        with _accounts_lock:
            _accounts[self._account_key] = found
        return found

    def _link(self, object_type: str, object_id: str) -> str:
        account = self._account()
        if account is None:
            return ""
        ui, portal = account
        return f"https://{ui}/contacts/{portal}/record/{object_type}/{object_id}"

    # -- values --------------------------------------------------------------------------

    def _person(self, obj: Any) -> Person:
        object_id = _object_id(obj)
        properties = _properties(obj)
        modified = _when(properties.get("lastmodifieddate")) or _when(
            getattr(obj, "updated_at", None)
        )
        return Person(
            object="contact",
            id=object_id,
            email=_text(properties.get("email")).lower(),
            owner_id=_text(properties.get("hubspot_owner_id")),
            owner_changed_at=_when(properties.get("hubspot_owner_assigneddate")),
            modified_at=modified,
            status=_text(properties.get("hs_lead_status")),
            company_id=_text(properties.get("associatedcompanyid")),
            url=self._link("0-1", object_id),
        )

    # -- the protocol --------------------------------------------------------------------

    def check(self) -> str:
        """The calls every stage makes, once each, cheaply: the owners (the roster), a contact
        search and a company search (the lookup), so that a token lacking a scope one of them
        needs is found here; every missing scope is named."""

        def search(api: Any, request_type: Any) -> Any:
            request = request_type(filter_groups=[], properties=["hs_object_id"], limit=1)
            return self._call(api.do_search, public_object_search_request=request)

        probes: list[tuple[str, Callable[[], Any]]] = [
            ("owners", lambda: self._call(self._owners.get_page, limit=1, archived=False)),
            ("contacts search", lambda: search(self._contacts_search, PublicObjectSearchRequest)),
            ("companies search", lambda: search(self._companies_search, CompanySearchRequest)),
        ]
        refused: list[str] = []
        for what, probe in probes:
            try:
                self._results(probe())
            except CrmError as exc:
                if not exc.permission:
                    raise  # an expired token, HubSpot down: the same for every call
                refused.append(f"{what}: {exc.args[0]}")
        if refused:
            raise CrmError("auth", "; ".join(refused), status=403, permission=True)
        account = self._account()
        where = f"portal {account[1]}" if account else "portal id not readable"
        return f"HubSpot: private app token accepted ({where}, {self.base_url})"

    def find_person(self, email: str) -> Person | None:
        email = (email or "").strip().lower()
        if not email or "@" not in email:
            return None
        request = PublicObjectSearchRequest(
            filter_groups=[
                FilterGroup(filters=[Filter(property_name="email", operator="EQ", value=email)]),
                FilterGroup(
                    filters=[
                        Filter(
                            property_name="hs_additional_emails",
                            operator="CONTAINS_TOKEN",
                            value=email,
                        )
                    ]
                ),
            ],
            sorts=[{"propertyName": "lastmodifieddate", "direction": "DESCENDING"}],
            properties=_CONTACT_PROPERTIES,
            limit=1,
        )
        results = self._results(
            self._call(self._contacts_search.do_search, public_object_search_request=request)
        )
        return self._person(results[0]) if results else None

    def find_company(self, domain: str) -> Company | None:
        wanted = domain_of(domain)
        if not wanted or "." not in wanted:
            return None
        request = CompanySearchRequest(
            filter_groups=[
                CompanyFilterGroup(
                    filters=[CompanyFilter(property_name="domain", operator="EQ", value=value)]
                )
                for value in (wanted, f"www.{wanted}")
            ],
            sorts=[{"propertyName": "hs_lastmodifieddate", "direction": "DESCENDING"}],
            properties=_COMPANY_PROPERTIES,
            limit=1,
        )
        results = self._results(
            self._call(self._companies_search.do_search, public_object_search_request=request)
        )
        if not results:
            return None
        company_id = _object_id(results[0])
        properties = _properties(results[0])
        return Company(
            object="company",
            id=company_id,
            name=_text(properties.get("name")),
            domain=wanted,
            owner_id=_text(properties.get("hubspot_owner_id")),
            url=self._link("0-2", company_id),
        )

    def get_person(self, person_id: str, person_object: str = "") -> Person | None:
        if person_object not in ("", "contact"):
            raise CrmError("rejected", f"not a HubSpot contact: {person_object!r}")
        if not _NUMERIC.match(person_id or ""):
            raise CrmError("rejected", "not a HubSpot contact id")
        try:
            answer = self._call(
                self._contacts_basic.get_by_id,
                person_id,
                properties=_CONTACT_PROPERTIES,
                archived=False,
            )
        except CrmError as exc:
            if exc.kind == "rejected" and exc.status == 404:
                return None
            raise
        return self._person(answer)

    def write_owner(
        self,
        update: PersonUpdate,
        *,
        known_owner_id: str,
        before_write: Callable[[], None] = lambda: None,
    ) -> WriteResult:
        if not _NUMERIC.match(update.owner_id or ""):
            raise CrmError("rejected", "not a HubSpot owner id")
        person: Person | None = None
        if update.person_id and update.person_object in ("", "contact"):
            person = self.get_person(update.person_id)
        if person is None:
            person = self.find_person(update.email)
        if person is None:
            before_write()
            created = self._create(update)
            if isinstance(created, WriteResult):
                return created
            person = created  # it existed after all (search had not indexed it yet)
        if owner_is_foreign(
            person.owner_id,
            ours=update.owner_id,
            known=known_owner_id,
            earlier=update.earlier_owner_ids,
        ):
            return WriteResult("kept", person)
        if person.owner_id == update.owner_id:
            return WriteResult("updated", person)
        body = SimplePublicObjectInput(properties={"hubspot_owner_id": update.owner_id})
        before_write()
        try:
            answer = self._call(
                self._contacts_basic.update, person.id, simple_public_object_input=body
            )
        except CrmError as exc:
            if exc.kind == "rejected" and exc.status == 404:
                # Deleted since we read it: create it again rather than lose the write.
                before_write()
                again = self._create(update)
                if isinstance(again, WriteResult):
                    return again
                raise CrmError("rejected", "HubSpot contact deleted and re-found") from None
            raise
        return WriteResult("updated", self._person(answer))

    def _create(self, update: PersonUpdate) -> WriteResult | Person:
        """A new contact owned by ``update.owner_id``; the existing contact on a 409."""
        values = dict(update.fields)
        values.setdefault("email", update.email)
        properties: dict[str, str] = {}
        for key, name in _CREATE:
            value = values.get(key)
            if isinstance(value, str) and value.strip():
                properties[name] = value.strip()[:1000]
        if not properties.get("email"):
            raise CrmError("rejected", "a HubSpot contact needs an e-mail to be created")
        properties["hubspot_owner_id"] = update.owner_id
        body = SimplePublicObjectInputForCreate(properties=properties, associations=[])
        try:
            answer = self._call(
                self._contacts_basic.create, simple_public_object_input_for_create=body
            )
        except CrmError as exc:
            match = _EXISTING_ID.search(str(exc)) if exc.status == 409 else None
            if match is None:
                raise
            existing = self.get_person(match.group(1))
            if existing is None:
                raise CrmError(
                    "unavailable", "HubSpot says the contact exists but cannot read it"
                ) from None
            return existing
        person = self._person(answer)
        return WriteResult("created", person)

    def activity(
        self,
        people: Sequence[tuple[str, str]],
        since: datetime,
        since_by_id: Mapping[str, datetime] | None = None,
    ) -> list[Activity]:
        ids = []
        for obj, person_id in people[:ACTIVITY_BATCH]:
            if obj in ("", "contact") and _NUMERIC.match(person_id or "") and person_id not in ids:
                ids.append(person_id)
        if not ids:
            return []
        request = BatchReadInputSimplePublicObjectId(
            properties=_CONTACT_PROPERTIES + _TOUCH_PROPERTIES,
            properties_with_history=[],
            inputs=[SimplePublicObjectId(id=person_id) for person_id in ids],
        )
        answer = self._call(
            self._contacts_batch.read,
            batch_read_input_simple_public_object_id=request,
            archived=False,
        )
        result = []
        for obj in self._results(answer):
            person_id = _object_id(obj)
            if person_id not in ids:
                continue  # not what we asked for
            properties = _properties(obj)
            touched_at: datetime | None = None
            touch_kind = ""
            after = (since_by_id or {}).get(person_id, since)
            for name in _TOUCH_PROPERTIES:
                when = _when(properties.get(name))
                if when is not None and when > after and (touched_at is None or when < touched_at):
                    touched_at, touch_kind = when, name
            result.append(
                Activity(
                    person_id=person_id,
                    owner_id=_text(properties.get("hubspot_owner_id")),
                    touched_at=touched_at,
                    touch_kind=touch_kind,
                    status=_text(properties.get("hs_lead_status")),
                    owner_changed_at=_when(properties.get("hubspot_owner_assigneddate")),
                )
            )
        return result

    def users(self) -> list[CrmUser]:
        found: dict[str, CrmUser] = {}
        for archived in (False, True):
            for owner in self._owner_pages(archived):
                owner_id = _text(getattr(owner, "id", None))
                if not _NUMERIC.match(owner_id):
                    raise CrmError("malformed", "a HubSpot owner without a numeric id")
                name = " ".join(
                    part
                    for part in (
                        _text(getattr(owner, "first_name", None)).strip(),
                        _text(getattr(owner, "last_name", None)).strip(),
                    )
                    if part
                )
                # An owner listed as active wins over an archived copy of the same id.
                if owner_id not in found:
                    found[owner_id] = CrmUser(
                        id=owner_id,
                        email=_text(getattr(owner, "email", None)).strip().lower(),
                        name=name,
                        active=not archived and getattr(owner, "archived", False) is not True,
                    )
        return list(found.values())

    def _owner_pages(self, archived: bool) -> Iterable[Any]:
        after: str | None = None
        for _ in range(MAX_PAGES):
            kwargs: dict[str, Any] = {"limit": OWNERS_PAGE, "archived": archived}
            if after:
                kwargs["after"] = after
            answer = self._call(self._owners.get_page, **kwargs)
            yield from self._results(answer)
            paging = getattr(answer, "paging", None)
            following = getattr(getattr(paging, "next", None), "after", None)
            if not following:
                return
            if following == after:
                raise CrmError("malformed", "a HubSpot owners page pointing at itself")
            after = _text(following)
        raise CrmError("malformed", f"HubSpot owners with more than {MAX_PAGES} pages")
