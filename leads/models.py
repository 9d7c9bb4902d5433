"""Sources (who may send leads) and the canonical lead."""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from datetime import datetime

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from leads.lanes import BULK, LANES, NORMAL, REALTIME
from leads.normalize import CANONICAL_FIELDS
from leads.priority import PRIORITY_MAX_LENGTH, TAG_MAX_LENGTH


def token_digest(token: str) -> str:
    """SHA-256 hex of a source token. Tokens are 256-bit random, so a fast hash is enough."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class SourceAuthMode(models.TextChoices):
    TOKEN = "token", "Token (Authorization: Bearer)"
    HMAC = "hmac", "HMAC signature of the body (X-Signature)"
    TOKEN_AND_HMAC = "token_and_hmac", "Token and HMAC signature"
    VENDOR = "vendor", "The tool's own signature (its kind's scheme, with the vendor's secret)"


def validate_kind(value: str) -> None:
    """A source kind must be one of the built-in kinds (leads.sources)."""
    from leads.sources import kinds

    if value not in kinds():
        names = ", ".join(sorted(kinds()))
        raise ValidationError(f"Unknown source kind {value!r}; choose one of: {names}.")


# What a source's status URL may tell the page that submitted a lead about its owner (the rep's
# public face: never an e-mail, a rule or a trace). ``name`` is the rep's display name.
STATUS_REVEALABLE = ("name", "first_name", "photo_url", "booking_url", "team")
STATUS_MINUTES_MAX = 24 * 60


class Lane(models.TextChoices):
    """A lead's lane (leads.lanes): which routing queue its work goes to."""

    REALTIME = REALTIME, "Realtime: a form lead, routed before anything else waiting"
    NORMAL = NORMAL, "Normal"
    BULK = BULK, "Bulk: uploads and imports, routed when nothing more urgent waits"


assert tuple(Lane.values) == LANES  # noqa: S101 - the choices and leads.lanes agree
_ORIGIN = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?")


def origins_parse(text: str) -> list[str]:
    """Origins written one per line, without blanks or a trailing slash."""
    return [line.strip().rstrip("/") for line in text.splitlines() if line.strip()]


def status_reveal_default() -> list[str]:
    return ["name", "photo_url", "booking_url"]


class Source(models.Model):
    """A marketing tool, form or list that posts leads to its own intake URL."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    active = models.BooleanField(default=True)
    auth_mode = models.CharField(
        max_length=16, choices=SourceAuthMode.choices, default=SourceAuthMode.TOKEN
    )
    token_hash = models.CharField(max_length=64, blank=True, editable=False)
    token_hint = models.CharField(
        max_length=12, blank=True, editable=False, help_text="First characters of the token."
    )
    previous_token_hash = models.CharField(max_length=64, blank=True, editable=False)
    previous_token_valid_until = models.DateTimeField(null=True, blank=True, editable=False)
    allow_query_token = models.BooleanField(
        default=False,
        help_text="Also accept ?token= in the URL, for tools that can only set a URL. "
        "The token is redacted from every log.",
    )
    hmac_secret = models.CharField(max_length=128, blank=True, editable=False)
    previous_hmac_secret = models.CharField(max_length=128, blank=True, editable=False)
    previous_hmac_valid_until = models.DateTimeField(null=True, blank=True, editable=False)
    kind = models.CharField(
        max_length=32,
        default="generic",
        validators=[validate_kind],
        help_text="The tool that posts here: its payload is decoded with no field map by hand.",
    )
    kind_options = models.JSONField(
        default=dict,
        blank=True,
        help_text="What the kind needs to know about this source (e.g. LinkedIn's questions).",
    )
    vendor_secret = models.CharField(
        max_length=512,
        blank=True,
        editable=False,
        help_text="The secret the tool signs its requests with (auth mode 'vendor').",
    )
    field_map = models.JSONField(
        default=dict,
        blank=True,
        help_text='Raw key or path → canonical field, e.g. {"Org": "company", '
        '"payload.data.Email": "email"}. Wins over the kind and the built-in aliases.',
    )
    rate_limit_per_minute = models.PositiveIntegerField(
        default=6000, validators=[MinValueValidator(1)]
    )
    status_minutes = models.PositiveIntegerField(
        default=10,
        validators=[MinValueValidator(1), MaxValueValidator(STATUS_MINUTES_MAX)],
        help_text="How long the status URL handed back with each accepted lead works, minutes.",
    )
    status_reveal = models.JSONField(
        default=status_reveal_default,
        blank=True,
        help_text="What the status URL tells the browser about the lead's owner: any of "
        + ", ".join(f'"{name}"' for name in STATUS_REVEALABLE)
        + ". Empty: only whether the lead has an owner. Never e-mails, rules or traces.",
    )
    lane = models.CharField(
        max_length=16,
        choices=Lane.choices,
        blank=True,
        help_text="Which lane its leads are routed in. Blank: by how they arrive (one lead posted "
        "on its own: realtime; a batch request or upload, even of one lead: bulk).",
    )
    intake_priority = models.CharField(
        max_length=PRIORITY_MAX_LENGTH,
        blank=True,
        help_text='The priority its new leads are queued by before any rule ran, e.g. "hot" '
        "for a demo-request form: one of HIGH_PRIORITIES puts them at their lane's high broker "
        "priority, ahead of the normal leads waiting in that lane. Blank: normal. The lead's "
        "own priority (a tag rule's) is not set by this.",
    )
    cors_origins = models.TextField(
        blank=True,
        help_text="Origins (scheme://host[:port], one per line) of the pages that post to this "
        "source from a browser and read its status URL, e.g. https://www.example.com.",
    )
    # Retention (routing/retention/, docs/operations.md "Retention"): empty = the global setting.
    retention_raw_payload_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Days its leads keep the payload as received (and its refused inbox rows). "
        "Empty: the global RETENTION_RAW_PAYLOAD_DAYS.",
    )
    retention_unrouted_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Days its leads that never got an owner (unassigned, excluded, failed) keep "
        "their personal data. Empty: the global RETENTION_UNROUTED_DAYS.",
    )
    retention_personal_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Days any of its leads keeps its personal data. Empty: the global "
        "RETENTION_PERSONAL_DAYS.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("slug",)
        constraints = [
            models.CheckConstraint(
                condition=Q(rate_limit_per_minute__gte=1), name="source_rate_limit_positive"
            ),
            models.CheckConstraint(
                condition=Q(status_minutes__gte=1, status_minutes__lte=STATUS_MINUTES_MAX),
                name="source_status_minutes_bounded",
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def requires_token(self) -> bool:
        return self.auth_mode in (SourceAuthMode.TOKEN, SourceAuthMode.TOKEN_AND_HMAC)

    @property
    def requires_signature(self) -> bool:
        return self.auth_mode in (SourceAuthMode.HMAC, SourceAuthMode.TOKEN_AND_HMAC)

    @property
    def requires_vendor_signature(self) -> bool:
        return self.auth_mode == SourceAuthMode.VENDOR

    def clean(self) -> None:
        from leads.sources.paths import field_map_errors

        errors = field_map_errors(self.field_map)
        if errors:
            raise ValidationError(
                {"field_map": [f"{key}: {message}" for key, message in errors.items()]}
            )
        if not isinstance(self.kind_options, dict):
            raise ValidationError({"kind_options": "Must be a JSON object."})
        reveal = self.status_reveal
        if not isinstance(reveal, list) or any(item not in STATUS_REVEALABLE for item in reveal):
            raise ValidationError(
                {"status_reveal": "A list of: " + ", ".join(STATUS_REVEALABLE) + "."}
            )
        bad = [o for o in self.cors_origin_list if not _ORIGIN.fullmatch(o)]
        if bad:
            raise ValidationError(
                {"cors_origins": f"Not an origin (scheme://host[:port], no path): {bad[0]!r}"}
            )

    @property
    def cors_origin_list(self) -> list[str]:
        """The configured origins, one per line, without blanks or a trailing slash."""
        return origins_parse(self.cors_origins)

    def token_matches(self, token: str, *, now: datetime) -> bool:
        """Constant-time check of ``token`` against the current and, during overlap, old token."""
        digest = token_digest(token)
        ok = bool(self.token_hash) and hmac.compare_digest(digest, self.token_hash)
        if (
            self.previous_token_hash
            and self.previous_token_valid_until is not None
            and now < self.previous_token_valid_until
        ):
            ok = hmac.compare_digest(digest, self.previous_token_hash) or ok
        return ok

    def signing_secrets(self, *, now: datetime) -> list[str]:
        """The HMAC secrets a signature may currently be made with (old one during overlap)."""
        secrets = [self.hmac_secret] if self.hmac_secret else []
        if (
            self.previous_hmac_secret
            and self.previous_hmac_valid_until is not None
            and now < self.previous_hmac_valid_until
        ):
            secrets.append(self.previous_hmac_secret)
        return secrets


class LeadStatus(models.TextChoices):
    RECEIVED = "received"
    PROCESSING = "processing"
    ASSIGNED = "assigned"
    DUPLICATE = "duplicate"
    EXCLUDED = "excluded"
    UNASSIGNED = "unassigned"
    FAILED = "failed"


class EnrichmentStatus(models.TextChoices):
    NONE = "", "Not needed"
    PENDING = "pending", "Waiting for a provider"
    DONE = "done", "Done"
    FAILED = "failed", "Failed (routed without it)"


class CrmLookupStatus(models.TextChoices):
    NONE = "", "Not looked up (no CRM connection)"
    PENDING = "pending", "Waiting for the CRM"
    DONE = "done", "Done"
    FAILED = "failed", "CRM unavailable (routed without it)"


class FetchStatus(models.TextChoices):
    NONE = "", "Not needed (the payload is the lead)"
    PENDING = "pending", "Waiting to be fetched from the vendor"
    DONE = "done", "Fetched from the vendor"
    FAILED = "failed", "Could not be fetched (see the last error; retry from the admin)"


class PersonKey(models.Model):
    """One person's data key, for crypto-shredding (leads/privacy.py, docs/operations.md).

    Found by ``lookup``: an HMAC (``PRIVACY_HASH_KEY``) of the person's normalised e-mail or
    phone, never the address itself. ``wrapped`` is a random Fernet key encrypted by the master
    key (``PRIVACY_KEYS``, outside the database); what is sealed with it (personal content of
    audit events) is unreadable once erasure nulls it. The row stays, so events keep their link.
    """

    id = models.BigAutoField(primary_key=True)
    # NULL once erased: a new lead of the same person gets a new key, and the hash is gone too.
    lookup = models.CharField(max_length=64, unique=True, null=True, blank=True)
    wrapped = models.TextField(null=True, blank=True)  # noqa: DJ001
    # Which master key wraps it (leads.privacy.primary_fingerprint, a hash): the background
    # re-wrap after a rotation takes the keys whose value is not the current one's.
    wrapped_by = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    erased_at = models.DateTimeField(null=True, blank=True)
    # Retention (routing/retention/): set when the last lead held under it was pruned. The lookup
    # is gone from then on (a new lead of the person gets a new key); the key itself is destroyed
    # a grace period later, unless a lead being normalised at that moment took it meanwhile.
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "person key"

    def __str__(self) -> str:
        return f"person key {self.pk}" + (" (erased)" if self.erased_at else "")


class Lead(models.Model):
    """One lead as received (raw payload kept verbatim) and normalised to canonical fields."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    source = models.ForeignKey(Source, on_delete=models.PROTECT, related_name="leads")
    status = models.CharField(
        max_length=16, choices=LeadStatus.choices, default=LeadStatus.RECEIVED
    )
    raw_payload = models.JSONField(help_text="The record exactly as the source sent it.")

    email = models.CharField(max_length=320, blank=True)
    email_domain = models.CharField(max_length=255, blank=True)
    first_name = models.CharField(max_length=255, blank=True)
    last_name = models.CharField(max_length=255, blank=True)
    phone = models.CharField(max_length=32, blank=True, help_text="E.164")
    company = models.CharField(max_length=255, blank=True)
    domain = models.CharField(max_length=255, blank=True)
    title = models.CharField(max_length=255, blank=True)
    country = models.CharField(max_length=2, blank=True, help_text="ISO 3166-1 alpha-2")
    region = models.CharField(max_length=8, blank=True, help_text="ISO 3166-2, no country prefix")
    city = models.CharField(max_length=255, blank=True)
    postal_code = models.CharField(max_length=32, blank=True)
    employees = models.PositiveIntegerField(null=True, blank=True)
    annual_revenue = models.DecimalField(max_digits=20, decimal_places=2, null=True, blank=True)
    industry = models.CharField(max_length=255, blank=True)
    lead_score = models.FloatField(null=True, blank=True)
    utm_source = models.CharField(max_length=255, blank=True)
    utm_medium = models.CharField(max_length=255, blank=True)
    utm_campaign = models.CharField(max_length=255, blank=True)
    custom = models.JSONField(default=dict, blank=True, help_text="Every unmapped key, as sent.")
    flags = models.JSONField(default=list, blank=True, help_text='e.g. ["invalid_email"]')

    # NULL, not "", for "no key": the unique constraint only covers rows that have one.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    request_fingerprint = models.CharField(max_length=64)
    received_at = models.DateTimeField(default=timezone.now)
    normalized_at = models.DateTimeField(null=True, blank=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    queued_at = models.DateTimeField(
        default=timezone.now,
        help_text="When it last entered the routing queue: at intake, and again each time it "
        "is sent through routing anew (a retry of an unassigned lead, a re-route). How long a "
        "waiting lead has waited is measured from here, not from received_at.",
    )
    requeued_at = models.DateTimeField(
        null=True, blank=True, help_text="Last time the stale-lead sweeper re-enqueued it."
    )
    claimed_until = models.DateTimeField(
        null=True, blank=True, help_text="While processing: the worker's lease expires then."
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    deferrals = models.PositiveSmallIntegerField(
        default=0,
        help_text="Times processing was put off without counting an attempt (lock contention, "
        "an original still being processed).",
    )
    last_error = models.TextField(blank=True)
    # A lead nobody can take is routed again on a schedule (routing/monitoring/unassigned.py):
    # every UNASSIGNED_RETRY_SECONDS doubling up to UNASSIGNED_RETRY_MAX_SECONDS, silently (its
    # timeline shows when it became unassigned and when that changed, not every retry).
    unassigned_retries = models.PositiveIntegerField(
        default=0,
        help_text="Times it was routed again automatically since it last became unassigned "
        "(kept once it is assigned: how many it took).",
    )
    unassigned_retry_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="While unassigned: when it is next routed again automatically.",
    )
    person_key = models.ForeignKey(
        PersonKey,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="leads",
        help_text="The key its audit events' personal content is sealed with (set when "
        "normalised, from the e-mail, else the phone).",
    )
    duplicate_of = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="duplicates"
    )
    deduped_at = models.DateTimeField(
        null=True, blank=True, help_text="When the worker matched it against earlier leads."
    )
    dedup_key = models.CharField(
        max_length=340, blank=True, help_text="What it was matched on: email:… or phone:…"
    )
    # Enrichment by outside providers happens on its own queue: while a lead waits for one it
    # stays `processing` without a lease (claimed_until NULL) and `enrichment_status` pending.
    enrichment_status = models.CharField(
        max_length=16, choices=EnrichmentStatus.choices, default="", blank=True
    )
    enrichment_attempts = models.PositiveSmallIntegerField(default=0)
    enrichment_next_at = models.DateTimeField(null=True, blank=True)
    enrichment = models.JSONField(
        default=dict, blank=True, help_text="What each enrichment provider returned and filled."
    )
    # The CRM lookup (live dedup and ownership) runs on its own queue like HTTP enrichment,
    # before it: parked `processing` without a lease and `crm_status` pending.
    crm_status = models.CharField(
        max_length=16, choices=CrmLookupStatus.choices, default="", blank=True
    )
    crm_attempts = models.PositiveSmallIntegerField(default=0)
    crm_next_at = models.DateTimeField(null=True, blank=True)
    # When it was parked (its bounded wait runs from here), and when a lookup message was last
    # published for it: the sweeper re-sends only a message that ran or was lost.
    crm_parked_at = models.DateTimeField(null=True, blank=True)
    crm_dispatched_at = models.DateTimeField(null=True, blank=True)
    crm = models.JSONField(
        default=dict,
        blank=True,
        help_text="What each CRM said about this lead's person and company, by CRM kind.",
    )
    # A lead that its notification only names (Meta's leadgen webhook) is fetched from the
    # vendor's API first, on the enrichment queue: parked `processing` without a lease and
    # `fetch_status` pending (routing/fetch/). It is normalised from what the API returned.
    fetch_status = models.CharField(
        max_length=16, choices=FetchStatus.choices, default="", blank=True
    )
    fetch_attempts = models.PositiveSmallIntegerField(default=0)
    fetch_next_at = models.DateTimeField(null=True, blank=True)
    fetch = models.JSONField(
        default=dict,
        blank=True,
        help_text="The fetch from the vendor's API: its progress, and the record it returned.",
    )
    # What tag rules set when it was last routed (docs/revops.md, "Tag rules"): the priority
    # as its rule names it ("hot"), and the tags in the order the rules added them. The tags
    # are also rows of LeadTag, which is what ?tag= filters on (indexed on every database).
    priority = models.CharField(
        max_length=PRIORITY_MAX_LENGTH,
        blank=True,
        help_text="The priority a tag rule gave it when it was routed (empty: none).",
    )
    tags = models.JSONField(
        default=list, blank=True, help_text="The tags tag rules gave it when it was routed."
    )

    # Retention (routing/retention/): when the payload as received, and when the personal
    # fields, were pruned by the retention policy (the decision stays).
    raw_pruned_at = models.DateTimeField(null=True, blank=True, editable=False)
    personal_pruned_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Erasure (routing/erasure.py): when its person was erased. Every worker step that writes
    # personal fields re-reads it under the lead's row lock and stops when it is set, so a lead
    # erased while queued or parked (enrichment, CRM, a vendor fetch) is never written back.
    erased_at = models.DateTimeField(null=True, blank=True, editable=False)

    lane = models.CharField(
        max_length=16,
        choices=Lane.choices,
        default=NORMAL,
        help_text="The lane it was accepted in (its source's, else by intake path): the queues "
        "its routing, enrichment and CRM work go to.",
    )

    class Meta:
        ordering = ("-received_at",)
        permissions = [
            ("touch_lead", "Can report a lead's first touch"),
            ("reassign_lead", "Can reassign leads by hand"),
            ("reroute_lead", "Can send leads through routing again"),
            ("erase_lead", "Can erase a lead's person (all their personal data)"),
            ("export_person", "Can export everything held about a person (subject access)"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=("source", "idempotency_key"),
                condition=Q(idempotency_key__isnull=False),
                name="lead_unique_idempotency_key_per_source",
            ),
        ]
        indexes = [
            # The stale sweeper, the backlog check and /metrics: leads waiting, longest first.
            models.Index(
                fields=("queued_at",),
                condition=Q(status="received"),
                name="lead_queued_idx",
            ),
            # The backlog check and /metrics per lane: the oldest lead waiting in each.
            models.Index(
                fields=("lane", "queued_at"),
                condition=Q(status="received"),
                name="lead_lane_queued_idx",
            ),
            # The sweeper: leads whose worker died mid-way (lease expired).
            models.Index(
                fields=("claimed_until",),
                condition=Q(status="processing"),
                name="lead_leased_idx",
            ),
            # Enrichment retries that are due (the enrichment sweeper).
            models.Index(
                fields=("enrichment_next_at",),
                condition=Q(enrichment_status="pending"),
                name="lead_enrichment_due_idx",
            ),
            # CRM lookups that are due (the CRM sweeper).
            models.Index(
                fields=("crm_next_at",),
                condition=Q(crm_status="pending"),
                name="lead_crm_due_idx",
            ),
            # Fetches from the vendor's API that are due (the fetch sweeper).
            models.Index(
                fields=("fetch_next_at",),
                condition=Q(fetch_status="pending"),
                name="lead_fetch_due_idx",
            ),
            # Worker dedup by e-mail, then phone, within a window.
            models.Index(fields=("email", "received_at"), name="lead_email_idx"),
            models.Index(fields=("phone", "received_at"), name="lead_phone_idx"),
            # History pages: newest first, by status and by source.
            models.Index(fields=("-received_at",), name="lead_received_idx"),
            models.Index(fields=("status", "-received_at"), name="lead_status_idx"),
            models.Index(fields=("source", "-received_at"), name="lead_source_idx"),
            # ?priority=hot on the history page and the API, newest first.
            models.Index(fields=("priority", "-received_at"), name="lead_priority_idx"),
            # The retention job: the oldest leads of a source not pruned yet, per policy.
            models.Index(
                fields=("source", "received_at"),
                condition=Q(raw_pruned_at__isnull=True),
                name="lead_raw_retained_idx",
            ),
            models.Index(
                fields=("source", "received_at"),
                condition=Q(personal_pruned_at__isnull=True),
                name="lead_personal_retained_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.email or self.phone or self.full_name or str(self.id)

    @property
    def full_name(self) -> str:
        """First and last name as a person reads them ("" when neither is known)."""
        return f"{self.first_name} {self.last_name}".strip()


class LeadTag(models.Model):
    """One tag of a lead, a row per tag: what ``?tag=`` looks up through its index.

    A JSON list cannot be searched by index on SQLite (and ``contains`` does not exist there);
    this table is indexed by (tag, lead) on every database. ``Lead.tags`` keeps the same tags
    in order for display; ``lead_tags_set`` writes both in one transaction.
    """

    lead = models.ForeignKey(Lead, on_delete=models.CASCADE, related_name="tag_rows")
    tag = models.CharField(max_length=TAG_MAX_LENGTH)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=("lead", "tag"), name="lead_tag_unique"),
            models.CheckConstraint(condition=~Q(tag=""), name="lead_tag_not_empty"),
        ]
        indexes = [models.Index(fields=("tag", "lead"), name="lead_tag_idx")]

    def __str__(self) -> str:
        return f"{self.lead_id}: {self.tag}"


# The canonical fields (leads.normalize) that the Lead stores as columns: what the worker fills,
# the API shows and the routing engine sees. (`website` and `external_id` are input-only.)
CANONICAL_COLUMNS: tuple[str, ...] = tuple(
    name for name in CANONICAL_FIELDS if name in {f.name for f in Lead._meta.local_fields}
)


class RefusedState(models.TextChoices):
    OPEN = "open", "Open"
    ACCEPTED = "accepted", "Re-accepted as a lead"
    DISMISSED = "dismissed", "Dismissed"


class RefusedPayload(models.Model):
    """A payload an authenticated source sent that the kickoff refused, kept so it is not lost.

    RevOps fixes the source's kind or field map and re-accepts it as a lead (leads.inbox).
    Headers are kept minus secrets; a token in the URL is never kept.
    """

    id = models.BigAutoField(primary_key=True)
    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="refused")
    received_at = models.DateTimeField(default=timezone.now)
    content_type = models.CharField(max_length=255, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    body = models.BinaryField(help_text="The body (or the one record of a batch) as sent.")
    batch_index = models.IntegerField(
        null=True, blank=True, help_text="The record's place in its batch, for a batch record."
    )
    batch = models.BooleanField(
        default=False, help_text="A whole batch body (a JSON array or CSV) refused as one."
    )
    status_code = models.PositiveSmallIntegerField()
    reason = models.CharField(max_length=64, help_text="The API's error code.")
    message = models.TextField(blank=True)
    state = models.CharField(max_length=16, choices=RefusedState.choices, default=RefusedState.OPEN)
    lead = models.ForeignKey(
        Lead, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    handled_at = models.DateTimeField(null=True, blank=True)
    handled_by = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ("-received_at", "-id")
        verbose_name = "refused payload"
        indexes = [
            models.Index(fields=("source", "-received_at"), name="refused_source_idx"),
            models.Index(
                fields=("received_at",),
                condition=Q(state="open"),
                name="refused_open_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source_id}: {self.reason} at {self.received_at:%Y-%m-%d %H:%M:%S}"
