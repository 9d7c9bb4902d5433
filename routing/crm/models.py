"""CRM connections and the roster mirrored from them.

A ``CrmConnection`` says where a CRM is and how to authenticate (the secret encrypted at rest,
``routing.crm.secrets``), which stages use it (lookup, write-back, first touch) and at what
pace (the vendor's documented rate limit, shared by every worker). At most one is active per
kind. A ``CrmOwner`` is one of the CRM's users/owners as the last roster sync saw it, mapped to
a rep by e-mail: that is how a CRM owner id becomes a rep and a rep becomes an owner id.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from routing.crm.base import HUBSPOT, SALESFORCE

__all__ = ["CrmConnection", "CrmKind", "CrmOwner", "SalesforceAuthFlow"]


class CrmKind(models.TextChoices):
    HUBSPOT = HUBSPOT, "HubSpot"
    SALESFORCE = SALESFORCE, "Salesforce"


class SalesforceAuthFlow(models.TextChoices):
    CLIENT_CREDENTIALS = "client_credentials", "OAuth 2.0 client credentials"
    JWT_BEARER = "jwt_bearer", "OAuth 2.0 JWT bearer"


# The vendors' documented limits, as defaults (docs/operations.md says where they come from).
# HubSpot: the CRM search endpoints allow 5 requests per second per account, the rest of the
# API 100-190 per 10 s for a private app; our lookups are searches. A token bucket lets burst +
# rate through in any one second, so 3/s with a burst of 2 keeps that to 5 (and a lookup's two
# searches can still be reserved together).
# Salesforce: no per-second limit, a daily allocation per org (100,000 + per licence); a
# default of 10/s keeps a spike from spending a day's allocation in minutes.
HUBSPOT_SEARCHES_PER_SECOND = 5
DEFAULT_RATE_PER_MINUTE = {HUBSPOT: 180, SALESFORCE: 600}
DEFAULT_BURST = {HUBSPOT: 2, SALESFORCE: 10}
DEFAULT_BASE_URL = {HUBSPOT: "https://api.hubapi.com", SALESFORCE: ""}


class CrmConnection(models.Model):
    """How LeadRouter reaches one CRM. The secret is write-only: stored encrypted, never shown."""

    kind = models.CharField(max_length=16, choices=CrmKind.choices)
    name = models.CharField(max_length=200, unique=True)
    active = models.BooleanField(
        default=True, help_text="At most one active connection per kind; inactive ones are kept."
    )
    base_url = models.URLField(
        max_length=500,
        blank=True,
        help_text="HubSpot: the API host (empty = https://api.hubapi.com). Salesforce: your My "
        "Domain URL, e.g. https://acme.my.salesforce.com (a sandbox's works too).",
    )
    auth_flow = models.CharField(
        max_length=32,
        choices=SalesforceAuthFlow.choices,
        blank=True,
        help_text="Salesforce only: how the connected app authenticates.",
    )
    client_id = models.CharField(
        max_length=300, blank=True, help_text="Salesforce only: the connected app's consumer key."
    )
    username = models.CharField(
        max_length=300,
        blank=True,
        help_text="Salesforce JWT bearer only: the integration user's username (the subject).",
    )
    secret_encrypted = models.TextField(blank=True, editable=False)
    secret_hint = models.CharField(max_length=100, blank=True, editable=False)
    secret_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    api_version = models.CharField(
        max_length=10, blank=True, help_text='Salesforce only: REST API version, e.g. "62.0".'
    )
    person_object = models.CharField(
        max_length=40,
        blank=True,
        help_text="Salesforce only: where a person that does not exist yet is created by "
        "write-back (Lead, the default).",
    )
    external_id_field = models.CharField(
        max_length=80,
        blank=True,
        help_text="Salesforce only: an External ID field on the Lead (e.g. LeadRouter_Id__c) "
        "to upsert by LeadRouter's lead id; empty = find by e-mail, then create.",
    )
    lookup_enabled = models.BooleanField(
        default=True,
        help_text="Look up each new lead's person and company before routing (live dedup and "
        "ownership).",
    )
    honour_crm_owner = models.BooleanField(
        default=True,
        help_text="A person already owned in the CRM by an active rep goes to that rep.",
    )
    writeback_enabled = models.BooleanField(
        default=True, help_text="Write each assignment's owner to the CRM."
    )
    touches_enabled = models.BooleanField(
        default=True,
        help_text="Read first touches and owner changes of assigned leads from the CRM.",
    )
    rate_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(100_000)],
        help_text="API requests per minute, shared by every worker (empty = the vendor's "
        "documented pace: HubSpot 180, Salesforce 600).",
    )
    burst = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Requests that may go at once after a quiet spell (empty = HubSpot 2, "
        "Salesforce 10).",
    )
    touches_cursor = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Where the first-touch job got to."
    )
    roster_synced_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_ok_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    last_error_kind = models.CharField(max_length=16, blank=True, editable=False)
    last_error_permission = models.BooleanField(
        default=False,
        editable=False,
        help_text="The last error was a permission one call lacks (a scope, an object), not a "
        "refused credential.",
    )
    problem_since = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the current problem began."
    )
    last_error_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("id",)
        verbose_name = "CRM connection"
        constraints = [
            models.UniqueConstraint(
                fields=("kind",), condition=Q(active=True), name="crm_one_active_per_kind"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=CrmKind.values), name="crm_connection_kind_valid"
            ),
            models.CheckConstraint(condition=~Q(name=""), name="crm_connection_name_not_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"

    @property
    def effective_base_url(self) -> str:
        return (self.base_url or DEFAULT_BASE_URL.get(self.kind, "")).rstrip("/")

    @property
    def effective_rate_per_minute(self) -> int:
        return int(self.rate_per_minute or DEFAULT_RATE_PER_MINUTE.get(self.kind, 60))

    @property
    def effective_burst(self) -> int:
        return int(self.burst or DEFAULT_BURST.get(self.kind, 1))

    def credential_refused(self) -> bool:
        """Is the credential refused now (the auth alert's cause): an auth or config error
        after the last success, that was no single call's missing permission, and no new
        credential saved since?"""
        if self.last_error_kind not in ("auth", "config") or self.last_error_permission:
            return False
        if self.last_error_at is None:
            return False
        if self.last_ok_at is not None and self.last_ok_at >= self.last_error_at:
            return False
        return self.secret_changed_at is None or self.secret_changed_at < self.last_error_at

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        if self.kind == SALESFORCE:
            parts = urlsplit(self.base_url or "")
            if parts.scheme != "https" or not parts.hostname:
                errors["base_url"] = [
                    "Salesforce needs your My Domain URL over https, e.g. "
                    "https://acme.my.salesforce.com"
                ]
            elif parts.hostname in ("login.salesforce.com", "test.salesforce.com"):
                errors["base_url"] = [
                    "use your My Domain URL (Setup → My Domain), not login/test.salesforce.com: "
                    "the client credentials and JWT flows need it"
                ]
            if not self.auth_flow:
                errors["auth_flow"] = ["choose how the connected app authenticates"]
            if not self.client_id.strip():
                errors["client_id"] = ["the connected app's consumer key is required"]
            if self.auth_flow == SalesforceAuthFlow.JWT_BEARER and not self.username.strip():
                errors["username"] = ["the JWT bearer flow needs the integration user's username"]
            if self.api_version and not _api_version_ok(self.api_version):
                errors["api_version"] = ['a version like "62.0"']
        elif self.kind == HUBSPOT:
            if self.base_url and urlsplit(self.base_url).scheme not in ("http", "https"):
                errors["base_url"] = ["an http(s) URL"]
            for name in ("auth_flow", "client_id", "username", "external_id_field"):
                if getattr(self, name):
                    errors[name] = ["only used by Salesforce connections"]
        if errors:
            raise ValidationError(errors)


def _api_version_ok(value: str) -> bool:
    major, _, minor = value.partition(".")
    return major.isdigit() and minor.isdigit() and 20 <= int(major) <= 200


class CrmOwner(models.Model):
    """One CRM user/owner as the roster sync last saw it, and the rep it maps to (by e-mail)."""

    kind = models.CharField(max_length=16, choices=CrmKind.choices)
    owner_id = models.CharField(max_length=64, help_text="The CRM's owner/user id.")
    email = models.CharField(max_length=320, blank=True)
    name = models.CharField(max_length=200, blank=True)
    active_in_crm = models.BooleanField(default=True)
    rep = models.ForeignKey(
        "routing.Rep",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="crm_owners",
        help_text="The rep this owner is (matched by e-mail; may be set by hand).",
    )
    synced_at = models.DateTimeField()

    class Meta:
        ordering = ("kind", "email")
        verbose_name = "CRM owner"
        constraints = [
            models.UniqueConstraint(fields=("kind", "owner_id"), name="crm_owner_unique_id"),
            models.UniqueConstraint(
                fields=("kind", "rep"), condition=Q(rep__isnull=False), name="crm_owner_one_per_rep"
            ),
        ]
        indexes = [models.Index(fields=("kind", "email"), name="crm_owner_email_idx")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} owner {self.owner_id} <{self.email}>"

    def clean(self) -> None:
        if not self.owner_id.strip():
            raise ValidationError({"owner_id": ["required"]})
