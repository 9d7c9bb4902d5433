"""The one protocol every CRM module speaks, and the values that cross it. No Django here.

A CRM module (``hubspot``, ``salesforce``) is a class built from a ``CrmSettings`` (where the
CRM is, its credentials, timeouts, a total deadline per request, and a ``spend`` callback) that
implements ``CrmClient``. It
calls the vendor through the vendor's own client library and turns every answer into the plain
values below, or raises ``CrmError`` with one of a few kinds the stages act on. It never touches
the database, the rate limit's store or the breaker: the stages do (``routing.crm.lookup``,
``routing.crm.writeback``, ``routing.crm.touches``, ``routing.crm.roster``).

``spend(n)`` is called before every HTTP request the module makes (``n`` = how many requests it
is about to send, normally 1). It takes tokens from the shared rate limit and raises
``CrmError("rate_limited", retry_after=...)`` when there are none, so the vendor's documented
limit is never exceeded, whichever worker asks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

ErrorKind = Literal["auth", "rate_limited", "unavailable", "malformed", "rejected", "config"]

# The CRM kinds LeadRouter speaks (the admin's choices and the registry's keys).
HUBSPOT = "hubspot"
SALESFORCE = "salesforce"


class CrmError(Exception):
    """A CRM call that did not give a usable answer.

    ``kind``:
    - ``auth``: 401/403 for the credential (expired, revoked, missing scope): an alert, no retry
      until the credential changes or the alert's probe succeeds;
    - ``rate_limited``: 429 or our own shared limit (``retry_after`` seconds when known);
    - ``unavailable``: timeout, connection error, 5xx: worth a retry, counted by the breaker;
    - ``malformed``: an answer that is not what the vendor documents (HTML, truncated JSON, a
      200 with an error body): logged with the lead, treated as "CRM unavailable for this lead";
    - ``rejected``: a 4xx about this request (a bad field, a record that was deleted): retrying
      will not help;
    - ``config``: our side is not set up (no secret, an invalid key): an alert.

    The message never contains a credential.
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        permission: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.status = status
        self.retry_after = retry_after
        # ``auth`` for one call only: the credential works, but lacks the scope or object
        # permission this call needs (other calls may still work).
        self.permission = permission

    def __str__(self) -> str:
        text = super().__str__()
        return f"{self.kind}: {text}" + (f" (HTTP {self.status})" if self.status else "")


@dataclass(frozen=True)
class CrmSettings:
    """Everything a CRM module needs to make calls, decrypted, from a ``CrmConnection``.

    ``base_url``: HubSpot's API host (default ``https://api.hubapi.com``) or the Salesforce
    My Domain URL (``https://acme.my.salesforce.com``). ``secret``: the HubSpot private app
    token, or the Salesforce client secret (client credentials) or PEM private key (JWT bearer).
    ``options``: the vendor's own settings (Salesforce: ``auth_flow``, ``client_id``,
    ``username``, ``api_version``, ``person_object``, ``external_id_field``).
    """

    kind: str
    base_url: str
    # Not in the repr: an error report's local variables (Sentry captures them) show it.
    secret: str = field(repr=False)
    options: Mapping[str, Any] = field(default_factory=dict)
    timeout_seconds: float = 10.0  # each socket operation (connect, each read)
    # The whole of one HTTP request, connect to last byte (``routing.deadline``): a server that
    # trickles its answer cannot hold a thread longer.
    deadline_seconds: float = 10.0
    ca_bundle: str = ""  # a CA file to trust instead of the system's (a TLS proxy, a test)
    spend: Callable[[int], None] = lambda n: None
    connection_id: int | None = None


@dataclass(frozen=True)
class Person:
    """A person found in the CRM: a HubSpot contact, a Salesforce Lead or Contact."""

    object: str  # "contact" (HubSpot), "Lead" or "Contact" (Salesforce)
    id: str
    email: str = ""
    owner_id: str = ""  # the CRM's owner/user id, "" when nobody owns it
    owner_changed_at: datetime | None = None  # when the owner last changed, when the CRM says
    modified_at: datetime | None = None
    status: str = ""  # HubSpot lead status / lifecycle stage; Salesforce Lead Status
    company_id: str = ""  # HubSpot primary company; Salesforce Contact's AccountId
    url: str = ""  # a link to the record in the CRM's UI, when it can be built

    def to_json(self) -> dict[str, Any]:
        return {
            "object": self.object,
            "id": self.id,
            "email": self.email,
            "owner_id": self.owner_id,
            "owner_changed_at": _iso(self.owner_changed_at),
            "modified_at": _iso(self.modified_at),
            "status": self.status,
            "company_id": self.company_id,
            "url": self.url,
        }


@dataclass(frozen=True)
class Company:
    """A company found in the CRM by domain: a HubSpot company, a Salesforce Account."""

    object: str  # "company" (HubSpot), "Account" (Salesforce)
    id: str
    name: str = ""
    domain: str = ""
    owner_id: str = ""
    url: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "object": self.object,
            "id": self.id,
            "name": self.name,
            "domain": self.domain,
            "owner_id": self.owner_id,
            "url": self.url,
        }


@dataclass(frozen=True)
class CrmUser:
    """Someone who can own records: a HubSpot owner, a Salesforce User."""

    id: str
    email: str
    name: str = ""
    active: bool = True


@dataclass(frozen=True)
class PersonUpdate:
    """What owner write-back sends: the person (by id when known, else by e-mail) and its owner.

    ``fields`` are the canonical lead values to create the person with when it does not exist
    (``email``, ``first_name``, ``last_name``, ``company``, ``phone``, ``title``, ``country``);
    an update sets only the owner. ``external_id`` is LeadRouter's lead id, for a Salesforce
    upsert by external id field when one is configured.
    """

    owner_id: str
    email: str
    person_id: str = ""
    person_object: str = ""
    external_id: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)
    # The owners of the lead's earlier assignments: LeadRouter wrote them, or may have (a write
    # the CRM made but whose answer was lost), so finding one is no owner set in the CRM.
    earlier_owner_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class WriteResult:
    """What a write did: ``created``, ``updated``, or ``kept`` (nothing written: the person has
    an owner LeadRouter neither wrote nor saw, and the CRM's owner wins)."""

    outcome: Literal["created", "updated", "kept"]
    person: Person


def owner_is_foreign(current: str, *, ours: str, known: str, earlier: Sequence[str] = ()) -> bool:
    """Does the person's ``current`` owner belong to someone LeadRouter did not put or see there?

    ``ours``: the owner being written; ``known``: the owner LeadRouter last wrote, else the one
    its lookup found ("" when it saw none: the lookup failed, timed out or found nobody). Any
    other owner was set in the CRM, before or after our assignment, and is never overwritten.
    No timestamp decides it: Salesforce's LastModifiedDate moves on any edit, and an owner set
    before the assignment is the CRM's all the same when the lookup did not see it.

    ``earlier``: the owners of the lead's earlier assignments, which LeadRouter wrote or may
    have written (a write that landed while its answer was lost is no owner set in the CRM).
    """
    return bool(current) and current not in (ours, known, *earlier)


@dataclass(frozen=True)
class Activity:
    """A person's state as the first-touch job reads it.

    ``touched_at``: the earliest sales activity the CRM reports after ``since`` (HubSpot last
    contacted / last sales activity / a lead status change; Salesforce the Lead's activity date
    or status change), None when none. ``touch_kind`` says which (e.g. ``notes_last_contacted``).
    """

    person_id: str
    owner_id: str = ""
    touched_at: datetime | None = None
    touch_kind: str = ""
    status: str = ""
    owner_changed_at: datetime | None = None


class CrmClient(Protocol):
    """What every CRM module offers. Each method makes at most a few documented calls, spends
    a rate-limit token before each one, and raises ``CrmError`` for anything unusable."""

    kind: str

    def check(self) -> str:
        """A cheap authenticated call; a line saying who we are connected as."""
        ...

    def find_person(self, email: str) -> Person | None:
        """The person whose e-mail is ``email`` (most recently modified when several)."""
        ...

    def find_company(self, domain: str) -> Company | None:
        """The company whose domain (or website's host) is ``domain``."""
        ...

    def get_person(self, person_id: str, person_object: str = "") -> Person | None:
        """A person by id (None when it was deleted)."""
        ...

    def write_owner(
        self,
        update: PersonUpdate,
        *,
        known_owner_id: str,
        before_write: Callable[[], None] = lambda: None,
    ) -> WriteResult:
        """Create or update the person with ``update.owner_id``, reading its current owner first:
        when that owner is foreign (``owner_is_foreign``: neither ``update.owner_id`` nor
        ``known_owner_id``), nothing is written and the answer is ``kept``. An update sets only
        the owner. ``before_write`` is called right before each request that writes (create,
        update, upsert) and may raise to stop it (the assignment was superseded meanwhile).
        Safe to repeat: a repeated create finds the person made the first time."""
        ...

    def activity(
        self,
        people: Sequence[tuple[str, str]],
        since: datetime,
        since_by_id: Mapping[str, datetime] | None = None,
    ) -> list[Activity]:
        """The current owner and first touch after ``since`` of each (object, id) in ``people``
        (at most ``ACTIVITY_BATCH`` per call; people the CRM no longer has are left out).
        ``since_by_id``: a later ``since`` for some people (their own assignment), so that an
        activity before it (a previous rep's) does not hide the first one after it."""
        ...

    def users(self) -> list[CrmUser]:
        """Every owner/user the CRM has (all pages), active and not."""
        ...


# How many people ``activity`` takes per call (HubSpot's batch read takes 100).
ACTIVITY_BATCH = 100


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def domain_of(value: str) -> str:
    """A bare host from a website or domain value: ``https://www.Acme.com/x`` -> ``acme.com``."""
    text = (value or "").strip().lower()
    if "://" in text:
        text = text.split("://", 1)[1]
    text = text.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0].split(":", 1)[0]
    if text.startswith("www."):
        text = text[4:]
    return text.strip(".")
