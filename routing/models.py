"""Routing models: reps, teams, territories, accounts, value lists and versioned rulesets.

Invariants live in database constraints wherever SQL can say them; what it cannot (a valid
time zone, the shape of working hours or of a rule) is checked in ``clean()`` with the
``*_errors`` functions below, which the rules-as-code import shares for its path-precise
messages. The engine (``routing.engine``) never sees these models, only plain data built from
them.
"""

from __future__ import annotations

import functools
import re
import zoneinfo
from collections.abc import Iterable
from typing import Any

import pycountry
from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, URLValidator
from django.db import models, transaction
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone as dj_timezone

from leads.priority import PRIORITY_MAX_LENGTH
from routing.engine.strategies import MAX_MEMBER_WEIGHT

# --- Validation shared by clean() and the rules-as-code import --------------------------------

_HH_MM = re.compile(r"(?:[01]\d|2[0-3]):[0-5]\d")
_DOMAIN = re.compile(r"(?=.{1,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9-]{2,63}")
WORKING_HOURS_KEYS = frozenset({"days", "start", "end"})
REGION_MAX_LENGTH = 8  # leads.Lead.region
POSTAL_PREFIX_MAX_LENGTH = 32  # leads.Lead.postal_code

Problems = list[tuple[str, str]]  # (sub-path such as ".days[2]" or "", message)


@functools.cache
def _time_zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


@functools.cache
def _country_codes() -> frozenset[str]:
    return frozenset(country.alpha_2 for country in pycountry.countries)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def timezone_errors(value: Any) -> Problems:
    """Problems with an IANA time zone name (``Europe/Berlin``); empty when it is valid."""
    if not isinstance(value, str) or not value:
        return [("", f"must be an IANA time zone name such as Europe/Berlin, got {value!r}")]
    if value not in _time_zone_names():
        return [("", f'unknown time zone "{value}"')]
    return []


def working_hours_errors(value: Any) -> Problems:
    """Problems with working hours ``{"days": [1..7], "start": "HH:MM", "end": "HH:MM"}``.

    ``None`` (no working hours: always available) is valid. ``start > end`` is an overnight
    window and ``start == end`` the whole day, as the engine reads them.
    """
    if value is None:
        return []
    if not isinstance(value, dict):
        return [("", 'must be {"days": [1, ...], "start": "HH:MM", "end": "HH:MM"} or null')]
    problems: Problems = [
        (f".{key}", f'unknown key "{key}"') for key in value if key not in WORKING_HOURS_KEYS
    ]
    days = value.get("days")
    if not isinstance(days, list) or not days:
        problems.append(
            (".days", "must be a non-empty list of ISO weekdays (1 = Monday, 7 = Sunday)")
        )
    else:
        seen: set[int] = set()
        for i, day in enumerate(days):
            if not _is_int(day) or not 1 <= day <= 7:
                problems.append((f".days[{i}]", f"must be a weekday from 1 to 7, got {day!r}"))
            elif day in seen:
                problems.append((f".days[{i}]", f"duplicate weekday {day}"))
            else:
                seen.add(day)
    for key in ("start", "end"):
        moment = value.get(key)
        if not isinstance(moment, str) or not _HH_MM.fullmatch(moment):
            problems.append((f".{key}", f'must be a time "HH:MM" (00:00-23:59), got {moment!r}'))
    return problems


def countries_errors(value: Any) -> Problems:
    """Problems with a territory's countries: a non-empty list of ISO 3166-1 alpha-2 codes."""
    if not isinstance(value, list) or not value:
        return [("", "must be a non-empty list of ISO 3166-1 alpha-2 country codes")]
    problems: Problems = []
    for i, code in enumerate(value):
        if not isinstance(code, str) or code not in _country_codes():
            problems.append((f"[{i}]", f"unknown country code {code!r} (ISO 3166-1 alpha-2)"))
    if not problems and len(set(value)) != len(value):
        problems.append(("", "lists a country twice"))
    return problems


def codes_errors(value: Any, *, max_length: int, what: str) -> Problems:
    """Problems with a list of upper-case codes (regions, postal prefixes) of bounded length."""
    if not isinstance(value, list):
        return [("", f"must be a list of {what}")]
    problems: Problems = []
    for i, code in enumerate(value):
        if (
            not isinstance(code, str)
            or not code
            or code != code.strip().upper()
            or len(code) > max_length
        ):
            problems.append(
                (
                    f"[{i}]",
                    f"must be a non-empty upper-case code of at most {max_length} characters, "
                    f"got {code!r}",
                )
            )
    if not problems and len(set(value)) != len(value):
        problems.append(("", f"lists one of its {what} twice"))
    return problems


def domain_errors(value: Any) -> Problems:
    """Problems with an account domain: a lower-case host name such as ``acme.com``."""
    if not isinstance(value, str) or not _DOMAIN.fullmatch(value):
        return [("", f'must be a lower-case domain such as "acme.com", got {value!r}')]
    return []


def strings_errors(value: Any) -> Problems:
    """Problems with a value list's values: a list of non-empty strings."""
    if not isinstance(value, list):
        return [("", "must be a list of text values")]
    return [
        (f"[{i}]", f"must be non-empty text, got {item!r}")
        for i, item in enumerate(value)
        if not isinstance(item, str) or not item.strip()
    ]


def _refuse_rename_in_use(field: str, what: str, old: str, kind: str, *, key: str) -> None:
    """Rules name teams, reps and lists: renaming one they use would break them at routing."""
    from routing.selectors import names_in_use

    used = names_in_use()
    users = getattr(used, kind).get(key)
    if users:
        raise ValidationError(
            {
                field: f'The {what} "{old}" is named by {used.describe(users)}: change those '
                "rules (in a new draft) before renaming it."
            }
        )


def _raise_problems(problems: dict[str, Problems]) -> None:
    errors = {
        field: [f"{field}{path}: {message}" if path else message for path, message in found]
        for field, found in problems.items()
        if found
    }
    if errors:
        raise ValidationError(errors)


# --- Reps, teams, territories, accounts, value lists ------------------------------------------


class Rep(models.Model):
    """A sales rep who can own leads: availability, working hours and caps."""

    email = models.EmailField(unique=True, help_text="Unique, ignoring case.")
    name = models.CharField(max_length=200)
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="rep",
        help_text="The login of this rep, if they have one.",
    )
    active = models.BooleanField(default=True)
    out_of_office_until = models.DateTimeField(null=True, blank=True)
    timezone = models.CharField(
        max_length=64, default="UTC", help_text="IANA time zone name, e.g. Europe/Berlin."
    )
    working_hours = models.JSONField(
        null=True,
        blank=True,
        help_text='{"days": [1, 2, 3, 4, 5], "start": "08:00", "end": "18:00"} in the rep\'s '
        "time zone (1 = Monday); empty = always available.",
    )
    max_open = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most assigned leads awaiting first touch; empty = no cap."
    )
    max_per_day = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Most assignments per day (local midnight to midnight); empty = no cap.",
    )
    # The rep's public face: what a source's status URL may show the prospect (leads.status).
    display_name = models.CharField(
        max_length=200, blank=True, help_text="Name shown to prospects; empty = the name."
    )
    photo_url = models.CharField(
        max_length=500,
        blank=True,
        validators=[URLValidator(schemes=["https", "http"])],
        help_text="A photo prospects see (https://...).",
    )
    booking_url = models.CharField(
        max_length=500,
        blank=True,
        validators=[URLValidator(schemes=["https", "http"])],
        help_text="Where prospects book a meeting with this rep (https://...).",
    )
    email_notifications = models.BooleanField(
        default=True,
        help_text="E-mail this rep about new leads, SLAs about to breach and leads reassigned "
        "away (Slack and Teams: Notification channels).",
    )
    last_assigned_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("email",)
        constraints = [
            models.UniqueConstraint(Lower("email"), name="rep_email_unique_ignoring_case"),
            models.CheckConstraint(condition=~Q(email=""), name="rep_email_not_empty"),
            models.CheckConstraint(
                condition=Q(max_open__isnull=True) | Q(max_open__gte=1),
                name="rep_max_open_positive",
            ),
            models.CheckConstraint(
                condition=Q(max_per_day__isnull=True) | Q(max_per_day__gte=1),
                name="rep_max_per_day_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Saving a rep (the admin) never writes ``last_assigned_at``: route_lead keeps it
        under the rep's lock, and a form loaded before would put an older value back."""
        if self.pk is not None and not self._state.adding and kwargs.get("update_fields") is None:
            kwargs["update_fields"] = [
                f.attname
                for f in self._meta.concrete_fields
                if not f.primary_key and f.name != "last_assigned_at"
            ]
        super().save(*args, **kwargs)

    def clean(self) -> None:
        _raise_problems(
            {
                "timezone": timezone_errors(self.timezone),
                "working_hours": working_hours_errors(self.working_hours),
            }
        )
        old = Rep.objects.filter(pk=self.pk).values_list("email", flat=True).first()
        if old and old.strip().lower() != (self.email or "").strip().lower():
            _refuse_rename_in_use("email", "rep", old, "reps", key=old.strip().lower())


class TeamStrategy(models.TextChoices):
    ROUND_ROBIN = "round_robin", "Round robin"
    WEIGHTED = "weighted", "Weighted round robin"
    LEAST_LOADED = "least_loaded", "Least loaded"


class Team(models.Model):
    """Reps who share leads by a strategy; remembers whose turn it is (``rotation_state``)."""

    name = models.CharField(max_length=200, unique=True)
    strategy = models.CharField(
        max_length=16, choices=TeamStrategy.choices, default=TeamStrategy.ROUND_ROBIN
    )
    respect_working_hours = models.BooleanField(
        default=False, help_text="Only members inside their working hours get leads."
    )
    sla_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Default first-touch SLA for this team's leads."
    )
    keep_leads_when_rep_away = models.BooleanField(
        default=False,
        help_text="When a member becomes unavailable (deactivated, out of office, on leave), "
        "leave their untouched leads of this team with them instead of routing them again.",
    )
    # A user, not a rep: managers log in to watch SLAs and reassign, and need not take leads.
    manager = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="managed_teams",
    )
    email_notifications = models.BooleanField(
        default=True,
        help_text="E-mail the members about leads of this team (off: none of this team's "
        "notices go by e-mail, whatever the rep's own setting).",
    )
    # The engine's RotationState.to_json(); written only under this row's lock by route_lead.
    rotation_state = models.JSONField(default=dict, blank=True, editable=False)
    members = models.ManyToManyField(Rep, through="TeamMembership", related_name="teams")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name",)
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="team_name_not_empty"),
            models.CheckConstraint(
                condition=Q(strategy__in=TeamStrategy.values), name="team_strategy_valid"
            ),
            models.CheckConstraint(
                condition=Q(sla_minutes__isnull=True) | Q(sla_minutes__gte=1),
                name="team_sla_minutes_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Saving a team (the admin) never writes ``rotation_state``: the turn moves only under
        the team's lock in route_lead, and a form loaded before would rewind it."""
        if self.pk is not None and not self._state.adding and kwargs.get("update_fields") is None:
            kwargs["update_fields"] = [
                f.attname
                for f in self._meta.concrete_fields
                if not f.primary_key and f.name != "rotation_state"
            ]
        super().save(*args, **kwargs)

    def clean(self) -> None:
        old = Team.objects.filter(pk=self.pk).values_list("name", flat=True).first()
        if old and old != self.name:
            _refuse_rename_in_use("name", "team", old, "teams", key=old)


class TeamMembership(models.Model):
    """A rep's place (``position``) and ``weight`` in a team's rotation."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    rep = models.ForeignKey(Rep, on_delete=models.CASCADE, related_name="memberships")
    position = models.PositiveIntegerField(default=0)
    weight = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_MEMBER_WEIGHT)],
        help_text=f"Weighted teams: share of leads (1 to {MAX_MEMBER_WEIGHT}).",
    )

    class Meta:
        ordering = ("team", "position", "id")
        constraints = [
            models.UniqueConstraint(fields=("team", "rep"), name="team_membership_unique_rep"),
            # Deferred so that swapping two positions in one transaction works (PostgreSQL;
            # other databases do not create a deferrable constraint, see models.W038).
            models.UniqueConstraint(
                fields=("team", "position"),
                name="team_membership_unique_position",
                deferrable=models.Deferrable.DEFERRED,
            ),
            models.CheckConstraint(condition=Q(weight__gte=1), name="team_membership_weight_min_1"),
            models.CheckConstraint(
                condition=Q(weight__lte=MAX_MEMBER_WEIGHT), name="team_membership_weight_max"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.team} #{self.position}: {self.rep}"


class Territory(models.Model):
    """Countries, optionally narrowed by regions and postal prefixes, owned by a team or a rep.

    Ties between equally specific territories go to the lowest id (the one created first).
    """

    name = models.CharField(max_length=200, unique=True)
    countries = models.JSONField(default=list, help_text='ISO 3166-1 alpha-2, e.g. ["DE", "AT"]')
    regions = models.JSONField(default=list, blank=True, help_text='e.g. ["CA", "WA"]')
    postal_prefixes = models.JSONField(default=list, blank=True, help_text='e.g. ["940", "941"]')
    team = models.ForeignKey(
        Team, on_delete=models.PROTECT, null=True, blank=True, related_name="territories"
    )
    rep = models.ForeignKey(
        Rep, on_delete=models.PROTECT, null=True, blank=True, related_name="territories"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("id",)
        verbose_name_plural = "territories"
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="territory_name_not_empty"),
            models.CheckConstraint(
                condition=Q(team__isnull=False, rep__isnull=True)
                | Q(team__isnull=True, rep__isnull=False),
                name="territory_team_xor_rep",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        _raise_problems(
            {
                "countries": countries_errors(self.countries),
                "regions": codes_errors(
                    self.regions, max_length=REGION_MAX_LENGTH, what="region codes"
                ),
                "postal_prefixes": codes_errors(
                    self.postal_prefixes,
                    max_length=POSTAL_PREFIX_MAX_LENGTH,
                    what="postal prefixes",
                ),
            }
        )
        if (self.team_id is None) == (self.rep_id is None):
            raise ValidationError({NON_FIELD_ERRORS: ["Choose either a team or a rep, not both."]})


class Account(models.Model):
    """A named account, matched to leads by domain; its owner takes them (``account_owner``)."""

    domain = models.CharField(max_length=253, unique=True, help_text="Lower case, e.g. acme.com")
    name = models.CharField(max_length=200, blank=True)
    # PROTECT: deleting a rep must not silently un-own their accounts; deactivate the rep, or
    # hand the accounts over first.
    owner = models.ForeignKey(
        Rep, on_delete=models.PROTECT, null=True, blank=True, related_name="accounts"
    )
    tier = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("domain",)
        constraints = [
            models.CheckConstraint(condition=~Q(domain=""), name="account_domain_not_empty"),
            models.CheckConstraint(
                condition=Q(domain=Lower("domain")), name="account_domain_lower_case"
            ),
        ]

    def __str__(self) -> str:
        return self.name or self.domain

    def clean(self) -> None:
        _raise_problems({"domain": domain_errors(self.domain)})


class ValueList(models.Model):
    """A named list of values for the ``in_list`` / ``not_in_list`` operators."""

    name = models.CharField(max_length=100, unique=True)
    values = models.JSONField(default=list, blank=True, help_text='e.g. ["rival.io", "acme.com"]')
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name",)
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="value_list_name_not_empty"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        _raise_problems({"values": strings_errors(self.values)})
        old = ValueList.objects.filter(pk=self.pk).values_list("name", flat=True).first()
        if old and old != self.name:
            _refuse_rename_in_use("name", "value list", old, "value_lists", key=old)


# --- Rulesets -----------------------------------------------------------------------------------


class RuleSetStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    PUBLISHED = "published", "Published"
    ARCHIVED = "archived", "Archived"


class VersionReadOnly(ValidationError):
    """A published or archived ruleset, or one of its rules, was about to be changed."""

    def __init__(self, version: int | None, status: str) -> None:
        super().__init__(
            f"Version {version} is {status}: only drafts can change. Start a new draft from it."
        )


def _lock_drafts(ruleset_ids: Iterable[int | None]) -> None:
    """Lock the rows of these rulesets (in id order) and refuse unless every one is a draft.

    The lock waits for a publish of the same ruleset in flight, which locks the row first.
    """
    ids = sorted(pk for pk in ruleset_ids if pk is not None)
    rows = RuleSet.objects.select_for_update().filter(pk__in=ids).order_by("pk")
    for version, status in rows.values_list("version", "status"):
        if status != RuleSetStatus.DRAFT:
            raise VersionReadOnly(version, status)


class RuleSet(models.Model):
    """One version of the routing rules: a draft, the published (live) one, or archived.

    Only drafts change. Publishing and archiving go through ``routing.rules_io.ruleset_publish``
    (a queryset ``update()`` of the status fields): ``save()`` and ``delete()`` of a saved
    ruleset refuse (VersionReadOnly) unless it is, and stays, a draft, and so does the database
    (``routing.version_triggers``).
    """

    version = models.PositiveIntegerField(unique=True, editable=False)
    name = models.CharField(max_length=200, blank=True)
    status = models.CharField(
        max_length=16, choices=RuleSetStatus.choices, default=RuleSetStatus.DRAFT, editable=False
    )
    note = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        editable=False,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True, editable=False)
    published_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        editable=False,
        related_name="+",
    )

    class Meta:
        ordering = ("-version",)
        verbose_name = "ruleset"
        constraints = [
            models.CheckConstraint(condition=Q(version__gte=1), name="ruleset_version_positive"),
            models.CheckConstraint(
                condition=Q(status__in=RuleSetStatus.values), name="ruleset_status_valid"
            ),
            models.UniqueConstraint(
                fields=("status",),
                condition=Q(status=RuleSetStatus.PUBLISHED),
                name="ruleset_one_published",
            ),
            models.CheckConstraint(
                condition=~Q(status=RuleSetStatus.PUBLISHED) | Q(published_at__isnull=False),
                name="ruleset_published_has_published_at",
            ),
        ]

    def __str__(self) -> str:
        label = " ".join(filter(None, [f"v{self.version}" if self.version else "new", self.name]))
        return f"{label} ({self.get_status_display()})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self._state.adding or self.pk is None:
            super().save(*args, **kwargs)
            return
        with transaction.atomic():
            _lock_drafts({self.pk})
            if self.status != RuleSetStatus.DRAFT:
                raise VersionReadOnly(self.version, self.status)
            super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        with transaction.atomic():
            _lock_drafts({self.pk})
            return super().delete(*args, **kwargs)

    @property
    def is_editable(self) -> bool:
        return self.status == RuleSetStatus.DRAFT

    def clean(self) -> None:
        if self.pk is None:
            return
        stored = RuleSet.objects.filter(pk=self.pk).values_list("status", flat=True).first()
        if stored is not None and stored != RuleSetStatus.DRAFT:
            raise ValidationError(f"Version {self.version} is {stored}: only drafts can change.")


class OnSlaBreach(models.TextChoices):
    NOTIFY = "notify", "Notify"
    REASSIGN = "reassign", "Reassign"


class Rule(models.Model):
    """One rule of a ruleset: when its condition matches, its action tries to route the lead."""

    ruleset = models.ForeignKey(RuleSet, on_delete=models.CASCADE, related_name="rules")
    priority = models.IntegerField(help_text="Lower runs first; unique within the ruleset.")
    name = models.CharField(max_length=200)
    when = models.JSONField(
        null=True, blank=True, help_text="Condition tree (rules-format.md); empty = always."
    )
    action = models.JSONField(help_text='e.g. {"type": "team", "team": "EMEA SDR"}')
    sla_minutes = models.PositiveIntegerField(null=True, blank=True)
    on_sla_breach = models.CharField(
        max_length=16, choices=OnSlaBreach.choices, default=OnSlaBreach.NOTIFY
    )
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ("ruleset", "priority")
        constraints = [
            models.UniqueConstraint(fields=("ruleset", "priority"), name="rule_unique_priority"),
            models.UniqueConstraint(fields=("ruleset", "name"), name="rule_unique_name"),
            models.CheckConstraint(condition=~Q(name=""), name="rule_name_not_empty"),
            models.CheckConstraint(
                condition=Q(sla_minutes__isnull=True) | Q(sla_minutes__gte=1),
                name="rule_sla_minutes_positive",
            ),
            models.CheckConstraint(
                condition=Q(on_sla_breach__in=OnSlaBreach.values), name="rule_on_sla_breach_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.priority}: {self.name}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Refuses (VersionReadOnly) unless the ruleset (before and after) is a draft."""
        with transaction.atomic():
            self._lock_rulesets()
            super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        with transaction.atomic():
            self._lock_rulesets()
            return super().delete(*args, **kwargs)

    def _lock_rulesets(self) -> None:
        ids = {self.ruleset_id}
        if not self._state.adding and self.pk is not None:
            ids |= set(Rule.objects.filter(pk=self.pk).values_list("ruleset_id", flat=True))
        _lock_drafts(ids)

    def to_data(self) -> dict[str, Any]:
        """The rule in the rules-as-code format (defaults left out, key order fixed)."""
        data: dict[str, Any] = {"name": self.name, "priority": self.priority}
        if self.when is not None:
            data["when"] = self.when
        data["action"] = self.action
        if self.sla_minutes is not None:
            data["sla_minutes"] = self.sla_minutes
        if self.on_sla_breach != OnSlaBreach.NOTIFY:
            data["on_sla_breach"] = self.on_sla_breach
        if not self.active:
            data["active"] = False
        return data

    def clean(self) -> None:
        # Imported here: the selector module imports this one.
        from routing.engine import RuleErrors, compile_ruleset
        from routing.selectors import rule_references

        ruleset = self.ruleset if self.ruleset_id is not None else None
        if ruleset is not None:
            stored = RuleSet.objects.filter(pk=ruleset.pk).values_list("status", flat=True).first()
            if stored is not None and stored != RuleSetStatus.DRAFT:
                raise ValidationError(
                    f"Version {ruleset.version} is {stored}: only drafts can change."
                )
        if not self.name or self.priority is None or self.action is None:
            return  # the field errors say it
        references = rule_references()
        try:
            compile_ruleset(
                {"rules": [self.to_data()]},
                value_lists=references.value_lists,
                known_teams=references.teams,
                known_reps=references.reps,
            )
        except RuleErrors as errors:
            by_field: dict[str, list[str]] = {}
            prefix = "ruleset.rules[0]."
            for error in errors.errors:
                path = error.path.removeprefix(prefix)
                field = re.split(r"[.\[]", path, maxsplit=1)[0]
                if field not in {"name", "priority", "when", "action", "sla_minutes"}:
                    field = NON_FIELD_ERRORS
                by_field.setdefault(field, []).append(f"{path}: {error.message}")
            raise ValidationError(by_field) from None


# --- Assignments --------------------------------------------------------------------------------


class AssignmentKind(models.TextChoices):
    INITIAL = "initial", "Initial"
    REASSIGNMENT = "reassignment", "Reassignment"
    DUPLICATE = "duplicate", "Duplicate (sticky to the original's owner)"
    CRM_OWNER = "crm_owner", "Already owned in the CRM"


# The kinds of a lead's first assignment (at most one per lead).
FIRST_ASSIGNMENT_KINDS = (
    AssignmentKind.INITIAL,
    AssignmentKind.DUPLICATE,
    AssignmentKind.CRM_OWNER,
)


class TouchSource(models.TextChoices):
    LEADROUTER = "leadrouter", "LeadRouter (page or API)"
    HUBSPOT = "hubspot", "HubSpot"
    SALESFORCE = "salesforce", "Salesforce"


class Assignment(models.Model):
    """A lead given to a rep: who, through which team and rule, under which ruleset version.

    A lead's first assignment is ``initial`` (or ``duplicate``, sticky to the original's owner);
    a reassignment is a new row that ``supersedes`` the previous one, which becomes inactive.
    The constraints make a second first assignment, a forked chain and two current owners
    impossible to store. Names are snapshots: the history reads the same after renames.
    """

    lead = models.ForeignKey("leads.Lead", on_delete=models.PROTECT, related_name="assignments")
    rep = models.ForeignKey(Rep, on_delete=models.PROTECT, related_name="assignments")
    team = models.ForeignKey(
        Team, on_delete=models.SET_NULL, null=True, blank=True, related_name="assignments"
    )
    rule = models.ForeignKey(
        Rule, on_delete=models.SET_NULL, null=True, blank=True, related_name="assignments"
    )
    rule_name = models.CharField(max_length=200, blank=True)
    rep_name = models.CharField(max_length=200, blank=True)
    team_name = models.CharField(max_length=200, blank=True)
    ruleset_version = models.PositiveIntegerField(null=True, blank=True)
    kind = models.CharField(
        max_length=16, choices=AssignmentKind.choices, default=AssignmentKind.INITIAL
    )
    reason = models.TextField(blank=True)
    trace = models.JSONField(default=list, blank=True)
    sla_minutes = models.PositiveIntegerField(null=True, blank=True)
    sla_due_at = models.DateTimeField(null=True, blank=True)
    sla_breached_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its missed SLA was handled (the SlaBreach recorded): it leaves the set "
        "the per-minute SLA check reads.",
    )
    touched_at = models.DateTimeField(null=True, blank=True)
    touch_source = models.CharField(
        max_length=16,
        choices=TouchSource.choices,
        blank=True,
        help_text="Where the first touch was reported: LeadRouter, or read from a CRM.",
    )
    assigned_at = models.DateTimeField(default=dj_timezone.now)
    supersedes = models.OneToOneField(
        "self",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="superseded_by",
    )
    active = models.BooleanField(default=True, help_text="The lead's current owner.")
    # The lead's priority and tags when it was given to this rep (snapshots, like the names):
    # what the rep was told, and what their queue ordered it by.
    priority = models.CharField(max_length=PRIORITY_MAX_LENGTH, blank=True)
    tags = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ("-assigned_at", "-id")
        constraints = [
            # At most one first assignment per lead (initial, or duplicate-sticky).
            models.UniqueConstraint(
                fields=("lead",),
                condition=Q(kind__in=FIRST_ASSIGNMENT_KINDS),
                name="assignment_one_initial_per_lead",
            ),
            models.UniqueConstraint(
                fields=("lead",), condition=Q(active=True), name="assignment_one_active_per_lead"
            ),
            # A reassignment supersedes exactly the row before it; a first assignment nothing.
            models.CheckConstraint(
                condition=Q(kind=AssignmentKind.REASSIGNMENT, supersedes__isnull=False)
                | (Q(kind__in=FIRST_ASSIGNMENT_KINDS) & Q(supersedes__isnull=True)),
                name="assignment_supersedes_iff_reassignment",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=AssignmentKind.values), name="assignment_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(sla_minutes__isnull=True) | Q(sla_minutes__gte=1),
                name="assignment_sla_minutes_positive",
            ),
        ]
        indexes = [
            # Open leads per rep (max_open, least loaded): active and awaiting first touch.
            models.Index(
                fields=("rep",),
                condition=Q(active=True, touched_at__isnull=True),
                name="assignment_open_per_rep_idx",
            ),
            # Assigned today per rep (max_per_day).
            models.Index(fields=("rep", "assigned_at"), name="assignment_rep_day_idx"),
            # The dashboard's reports: a window of assignments over every rep (up to 90 days).
            models.Index(fields=("assigned_at",), name="assignment_assigned_at_idx"),
            # The SLA check, every minute: current, untouched, not yet handled, by due time.
            models.Index(
                fields=("sla_due_at", "id"),
                condition=Q(
                    active=True,
                    touched_at__isnull=True,
                    sla_due_at__isnull=False,
                    sla_breached_at__isnull=True,
                ),
                name="assignment_sla_due_idx",
            ),
            # The long report windows: assignments still untouched whose SLA is not yet due
            # (the rollups count met and late; "missed" needs now).
            models.Index(
                fields=("sla_due_at",),
                condition=Q(touched_at__isnull=True, sla_due_at__isnull=False),
                name="assignment_untouched_due_idx",
            ),
            # A rep's or team's hot leads (reports, filters): by priority, newest first.
            models.Index(fields=("priority", "-assigned_at"), name="assignment_priority_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.lead_id} → {self.rep_name or self.rep_id} ({self.kind})"


class TouchLinkUse(models.Model):
    """A one-click "I'm on it" link that was used: each link works once (``routing.rep_access``).

    ``nonce`` is the random part signed into the link, so a second click, a forwarded copy or a
    retried message finds its row and is told the link was used, and when.
    """

    nonce = models.CharField(max_length=64, unique=True)
    assignment = models.ForeignKey(
        Assignment, on_delete=models.CASCADE, related_name="touch_link_uses"
    )
    used_at = models.DateTimeField(default=dj_timezone.now)

    class Meta:
        verbose_name = "one-click link used"

    def __str__(self) -> str:
        return f"link for assignment {self.assignment_id} used {self.used_at:%Y-%m-%d %H:%M}"


class RepLoad(models.Model):
    """A rep's load as counters: open leads and today's assignments, kept by the services.

    Written in the transaction of every change that moves them (``routing.loads``): an
    assignment (open +1, today +1), a first touch (open -1), a reassignment (the previous
    owner's open -1 when it was untouched). A routing decision reads these rows, one per rep,
    instead of counting assignments. "Today" is the rep's local day: ``day_count`` counts the
    assignments at or after ``day_start`` (a midnight in ``timezone``), ``prev_count`` those of
    the day before it (``prev_start``), so a decision whose clock is a moment behind midnight
    still counts its own day. ``routing.loads.rep_loads_reconcile`` compares them with the
    assignments and repairs drift; ``drift_open`` / ``drift_today`` add up what it repaired.
    """

    rep = models.OneToOneField(Rep, on_delete=models.CASCADE, primary_key=True, related_name="load")
    open_count = models.PositiveIntegerField(default=0)
    timezone = models.CharField(max_length=64, default="UTC")
    day_start = models.DateTimeField(null=True, blank=True)
    day_count = models.PositiveIntegerField(default=0)
    prev_start = models.DateTimeField(null=True, blank=True)
    prev_count = models.PositiveIntegerField(default=0)
    drift_open = models.PositiveIntegerField(default=0)
    drift_today = models.PositiveIntegerField(default=0)
    reconciled_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"load of rep {self.rep_id}: {self.open_count} open"


# --- Operations ---------------------------------------------------------------------------------


class ConfigVersion(models.Model):
    """One row: the routing configuration's version, bumped by database triggers on every
    change of rules, teams, members, territories, value lists or reps' e-mails and time zones
    (see ``routing.config_triggers``). Workers compare it to decide whether their compiled
    configuration is still current."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    version = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="configversion_one_row")]

    def __str__(self) -> str:
        return f"routing configuration version {self.version}"


class QueueHeartbeat(models.Model):
    """The last time a worker executed the heartbeat task sent to one queue.

    Celery beat sends a heartbeat into every queue; a worker consuming that queue records it
    here. A stale row means no worker is draining the queue, which nothing else would report.
    """

    queue = models.CharField(max_length=64, unique=True)
    last_seen_at = models.DateTimeField()
    worker = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ("queue",)

    def __str__(self) -> str:
        return f"{self.queue} @ {self.last_seen_at:%Y-%m-%d %H:%M:%S}"


class AdminJobKind(models.TextChoices):
    REPLAY = "replay", "Replay"
    TERRITORIES_IMPORT = "territories_import", "Territories import"
    ACCOUNTS_IMPORT = "accounts_import", "Accounts import"
    REROUTE_AWAY = "reroute_away", "Re-route an unavailable rep's leads"
    CONFIG_PUBLISH = "config_publish", "Publish a configuration draft"
    CONFIG_ROLLBACK = "config_rollback", "Roll the configuration back"
    CONFIG_CHECK = "config_check", "Test a configuration draft"
    DRAFT_REPLAY = "draft_replay", "Replay against a configuration draft"


class AdminJobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class AdminJob(models.Model):
    """A long admin operation (a large replay, a CSV import, a publish or rollback of the whole
    configuration, a draft's test run) run by a worker, with its progress.

    ``updated_at`` is the worker's heartbeat (written with every batch of progress): a queued or
    running job without one for ``ADMIN_JOB_STALE_SECONDS`` is stalled, and says so. ``attempt``
    counts claims; a worker finishes a job only while its claim is the current one.
    """

    kind = models.CharField(max_length=32, choices=AdminJobKind.choices)
    status = models.CharField(
        max_length=16, choices=AdminJobStatus.choices, default=AdminJobStatus.QUEUED
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    ruleset = models.ForeignKey(
        RuleSet, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    params = models.JSONField(default=dict, blank=True)
    # The uploaded file of an import, kept until the job ends.
    input = models.TextField(blank=True)
    phase = models.CharField(max_length=64, blank=True)
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    attempt = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=dj_timezone.now)

    class Meta:
        ordering = ("-created_at", "-id")
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=AdminJobKind.values), name="admin_job_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(status__in=AdminJobStatus.values), name="admin_job_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(kind=AdminJobKind.REPLAY, ruleset__isnull=False)
                | ~Q(kind=AdminJobKind.REPLAY),
                name="admin_job_replay_has_ruleset",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.pk} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in (AdminJobStatus.DONE, AdminJobStatus.FAILED)

    @property
    def stalled(self) -> bool:
        """Queued or running, but no worker has reported for ``ADMIN_JOB_STALE_SECONDS``."""
        if self.is_finished:
            return False
        age = (dj_timezone.now() - self.updated_at).total_seconds()
        return age > settings.ADMIN_JOB_STALE_SECONDS

    @property
    def percent(self) -> int:
        if self.status == AdminJobStatus.DONE:
            return 100
        if not self.progress_total:
            return 0
        return min(100, self.progress_done * 100 // self.progress_total)


# --- Saved test cases ---------------------------------------------------------------------------


class ExpectedStatus(models.TextChoices):
    ASSIGNED = "assigned", "Assigned"
    EXCLUDED = "excluded", "Excluded"
    UNASSIGNED = "unassigned", "Unassigned"


class RoutingTestCase(models.Model):
    """A lead with the routing RevOps expect for it; run against a version before publishing.

    Cases belong to the routing as a whole, not to one version, so a new draft (copied, imported
    or rolled back) is checked against every case saved so far. ``ruleset`` records the version
    the case was written against, for reference only.
    """

    name = models.CharField(max_length=200, unique=True)
    lead = models.JSONField(help_text='The lead as a source sends it, e.g. {"email": "..."}')
    source = models.ForeignKey(
        "leads.Source",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="Its field map is applied first, and it sets the lead's `source`.",
    )
    expected_status = models.CharField(
        max_length=16, choices=ExpectedStatus.choices, default=ExpectedStatus.ASSIGNED
    )
    expected_rep = models.ForeignKey(
        Rep,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        help_text="Leave empty when any owner will do (or for excluded/unassigned).",
    )
    expected_team = models.ForeignKey(
        Team, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    ruleset = models.ForeignKey(
        RuleSet,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The version this case was written against (for reference).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name",)
        verbose_name = "routing test case"
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="routing_test_case_name_not_empty"),
            models.CheckConstraint(
                condition=Q(expected_status__in=ExpectedStatus.values),
                name="routing_test_case_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(expected_status=ExpectedStatus.ASSIGNED)
                | Q(expected_rep__isnull=True, expected_team__isnull=True),
                name="routing_test_case_owner_only_when_assigned",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if not isinstance(self.lead, dict) or not self.lead:
            raise ValidationError({"lead": 'Enter the lead as a JSON object, e.g. {"email": ...}.'})
        if self.expected_status != ExpectedStatus.ASSIGNED and (
            self.expected_rep_id is not None or self.expected_team_id is not None
        ):
            raise ValidationError(
                {"expected_status": "Only an assigned lead has an expected rep or team."}
            )


from routing.config_api.models import *  # noqa: E402,F403
from routing.crm.models import *  # noqa: E402,F403
from routing.delivery.models import *  # noqa: E402,F403
from routing.drafts.models import *  # noqa: E402,F403
from routing.monitoring.models import *  # noqa: E402,F403
from routing.timeoff.models import *  # noqa: E402,F403
