"""Read queries of the pages: the history list (filters, sorting, keyset pages) and a lead.

Every lead a page shows comes from ``leads_visible_to(user)``: with
``HISTORY_SCOPE_TO_MANAGED_TEAMS`` on, that is only the leads owned within the user's teams, so
an id guessed from outside them is a 404 like an id that does not exist.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import django_filters
from django import forms
from django.conf import settings
from django.db import connection
from django.db.models import Exists, OuterRef, Prefetch, Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from audit.models import Event, EventType
from audit.permissions import UNSCOPED_PERMISSION
from audit.timezones import local_words
from leads.models import FetchStatus, Lead, LeadStatus, Source
from leads.priority import PRIORITY_MAX_LENGTH, priority_clean
from leads.selectors import lead_fields, lead_tagged
from leads.sources.meta_lead_ads import page_token
from leads.sources.meta_lead_ads.graph import scrub
from routing.crm.facts import crm_entries, crm_label
from routing.delivery.models import Delivery, DeliveryAttempt
from routing.models import Assignment, AssignmentKind, Rep, Rule, Team

PAGE_SIZE = 50
# The list says "10,000+" rather than counting a million rows on every page.
COUNT_LIMIT = 10_000

# The columns a page may sort by (?sort=email, ?sort=-received); anything else is ignored.
# Only index-backed columns (lead_received_idx, lead_email_idx): on a million leads, sorting by
# status, source or company took 0.5-1.6 s a page on PostgreSQL (a top-N sort of the whole
# table) against under 2 ms for these; those are filters instead (docs/managers.md).
SORTS: dict[str, str] = {
    "received": "received_at",
    "email": "email",
    # High priorities first (HIGH_PRIORITIES), then the others by name, then none; newest first
    # within each: as the API's ?ordering=priority. Paged a priority at a time through
    # lead_priority_idx (priority_keyset_page), so as fast as the others.
    "priority": "priority",
}
DEFAULT_SORT = "-received"


# --- Scope ------------------------------------------------------------------------------------


def managed_team_ids(user: Any) -> list[int] | None:
    """The teams whose leads ``user`` may see, or None for all of them."""
    if (
        not settings.HISTORY_SCOPE_TO_MANAGED_TEAMS
        or user.is_superuser
        or user.has_perm(UNSCOPED_PERMISSION)
    ):
        return None
    return list(Team.objects.filter(manager_id=user.pk).values_list("pk", flat=True))


def leads_visible_to(user: Any, leads: QuerySet[Lead] | None = None) -> QuerySet[Lead]:
    """The leads ``user`` may open: all, or those currently owned within the teams they manage.

    ``leads`` narrows a queryset of the caller's (the lead admin passes its own); by default all
    leads.
    """
    leads = Lead.objects.all() if leads is None else leads
    teams = managed_team_ids(user)
    if teams is None:
        return leads
    return leads.filter(
        Exists(Assignment.objects.filter(lead=OuterRef("pk"), active=True, team_id__in=teams))
    )


def reps_for_reassignment(user: Any) -> QuerySet[Rep]:
    """Active reps ``user`` may hand a lead to: all, or the members of the teams they manage."""
    reps = Rep.objects.filter(active=True).order_by("name", "email")
    teams = managed_team_ids(user)
    if teams is None:
        return reps
    return reps.filter(memberships__team_id__in=teams).distinct()


# --- Filters ----------------------------------------------------------------------------------


def _rule_names() -> list[tuple[str, str]]:
    names = Rule.objects.order_by("name").values_list("name", flat=True).distinct()
    return [(name, name) for name in names]


def _day_start(day: date) -> datetime:
    """Midnight starting ``day`` in the page's zone (the user's, the browser's or the server's)."""
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def _owned(**assignment: Any) -> Exists:
    return Exists(Assignment.objects.filter(lead=OuterRef("pk"), active=True, **assignment))


def _ever_owned(**assignment: Any) -> Exists:
    """Any assignment of the lead, the current one or one it was reassigned away from."""
    return Exists(Assignment.objects.filter(lead=OuterRef("pk"), **assignment))


_DAY = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")


class HistoryFilter(django_filters.FilterSet):
    """The history page's filters; days are the page zone's days, ``until`` included."""

    since = django_filters.DateFilter(method="from_day", label="From", widget=_DAY)
    until = django_filters.DateFilter(method="to_day", label="To", widget=_DAY)
    status = django_filters.ChoiceFilter(choices=LeadStatus.choices, empty_label="Any status")
    source = django_filters.ModelChoiceFilter(
        queryset=Source.objects.order_by("slug"), to_field_name="slug", empty_label="Any source"
    )
    rep = django_filters.ModelChoiceFilter(
        queryset=Rep.objects.order_by("name", "email"),
        method="by_rep",
        label="Owner",
        empty_label="Any rep",
    )
    owned_by = django_filters.ModelChoiceFilter(
        queryset=Rep.objects.order_by("name", "email"),
        method="by_any_owner",
        label="Ever owned by",
        empty_label="Any rep",
    )
    team = django_filters.ModelChoiceFilter(
        queryset=Team.objects.order_by("name"),
        method="by_team",
        label="Team",
        empty_label="Any team",
    )
    rule = django_filters.ChoiceFilter(
        choices=_rule_names, method="by_rule", label="Rule", empty_label="Any rule"
    )
    q = django_filters.CharFilter(method="search", label="Search")
    priority = django_filters.CharFilter(method="by_priority", label="Priority")
    tag = django_filters.CharFilter(method="by_tag", label="Tag")

    class Meta:
        model = Lead
        fields: list[str] = []

    def by_priority(self, queryset: QuerySet[Lead], name: str, value: str) -> QuerySet[Lead]:
        # Exact, as the tag rule names it (lead_priority_idx); "none": leads without one.
        if value.strip().lower() == "none":
            return queryset.filter(priority="")
        return queryset.filter(priority=priority_clean(value))

    def by_tag(self, queryset: QuerySet[Lead], name: str, value: str) -> QuerySet[Lead]:
        return queryset.filter(lead_tagged(value)) if value.strip() else queryset

    def from_day(self, queryset: QuerySet[Lead], name: str, value: date) -> QuerySet[Lead]:
        try:
            return queryset.filter(received_at__gte=_day_start(value))
        except OverflowError:  # a day at the edge of the calendar: nothing is after it
            return queryset.none()

    def to_day(self, queryset: QuerySet[Lead], name: str, value: date) -> QuerySet[Lead]:
        try:
            return queryset.filter(received_at__lt=_day_start(value) + timedelta(days=1))
        except OverflowError:  # 9999-12-31: everything is before the end of that day
            return queryset

    def by_rep(self, queryset: QuerySet[Lead], name: str, value: Rep) -> QuerySet[Lead]:
        return queryset.filter(_owned(rep_id=value.pk))

    def by_any_owner(self, queryset: QuerySet[Lead], name: str, value: Rep) -> QuerySet[Lead]:
        return queryset.filter(_ever_owned(rep_id=value.pk))

    def by_team(self, queryset: QuerySet[Lead], name: str, value: Team) -> QuerySet[Lead]:
        return queryset.filter(_owned(team_id=value.pk))

    def by_rule(self, queryset: QuerySet[Lead], name: str, value: str) -> QuerySet[Lead]:
        return queryset.filter(_owned(rule_name=value))

    def search(self, queryset: QuerySet[Lead], name: str, value: str) -> QuerySet[Lead]:
        # On PostgreSQL each icontains is UPPER("col"::text) LIKE UPPER('%…%'): exactly the
        # expressions of the trigram indexes (leads 0006). Another lookup (iregex, unaccent,
        # a concatenation) would not use them; change both together.
        value = value.strip()[:200]
        if not value:
            return queryset
        return queryset.filter(
            Q(email__icontains=value)
            | Q(company__icontains=value)
            | Q(first_name__icontains=value)
            | Q(last_name__icontains=value)
        )


def history_filter(*, user: Any, data: Any) -> HistoryFilter:
    """The bound filter over the leads ``user`` may see (``.qs`` is the filtered set).

    A scoped manager is offered (and may pick) only their own teams and those teams' reps.
    """
    found = HistoryFilter(data=data, queryset=leads_visible_to(user))
    teams = managed_team_ids(user)
    if teams is not None:
        found.filters["team"].queryset = Team.objects.filter(pk__in=teams).order_by("name")
        found.filters["rep"].queryset = (
            Rep.objects.filter(memberships__team_id__in=teams).distinct().order_by("name", "email")
        )
        found.filters["owned_by"].queryset = found.filters["rep"].queryset
    return found


def history_leads(*, user: Any, data: Any) -> tuple[HistoryFilter, QuerySet[Lead]]:
    """The filter (for the form) and the filtered leads, with the current owner prefetched.

    An invalid value (a date that is not one, an unknown rule) is left out, not an error page:
    the other filters apply and the form shows what was wrong.
    """
    found = history_filter(user=user, data=data)
    leads = found.qs
    current = Assignment.objects.filter(active=True).order_by()
    return found, leads.select_related("source").prefetch_related(
        Prefetch("assignments", queryset=current, to_attr="current_assignments")
    )


# --- Sorting and keyset pages -----------------------------------------------------------------


def sort_parse(value: str | None) -> tuple[str, str, bool]:
    """``(sort key as given, column, descending)``; unknown keys give the default sort."""
    key = (value or "").strip()
    descending = key.startswith("-")
    name = key.lstrip("-")
    if name not in SORTS:
        return DEFAULT_SORT, SORTS[DEFAULT_SORT.lstrip("-")], True
    return key, SORTS[name], descending


def _cursor_value(lead: Lead, column: str) -> Any:
    value = getattr(lead, column)
    return value.isoformat() if isinstance(value, datetime) else value


def cursor_encode(lead: Lead, column: str) -> str:
    raw = json.dumps([_cursor_value(lead, column), str(lead.pk)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_CURSOR_ERRORS = (
    ValueError,
    TypeError,
    binascii.Error,
    UnicodeDecodeError,
    RecursionError,
    OverflowError,
)


def _cursor_json(cursor: str | None) -> Any:
    """A cursor's JSON content (unpadded URL-safe base64); raises one of ``_CURSOR_ERRORS``
    for a missing, oversized or tampered one."""
    if not cursor or len(cursor) > 2048:
        raise ValueError("no cursor")
    return json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))


def cursor_decode(cursor: str | None, column: str) -> tuple[Any, uuid.UUID] | None:
    """The (sort value, id) a cursor points at; None for a missing or tampered cursor."""
    try:
        value, lead_id = _cursor_json(cursor)
        if not isinstance(value, str) or "\x00" in value or len(value) > 400:
            return None
        value.encode("utf-8")  # a lone surrogate cannot reach the database: UnicodeEncodeError
        parsed: Any = datetime.fromisoformat(value) if column == "received_at" else value
        if isinstance(parsed, datetime):
            if parsed.tzinfo is None:
                return None
            parsed = parsed.astimezone(UTC)  # out of range for the database: OverflowError
        return parsed, uuid.UUID(str(lead_id))
    except _CURSOR_ERRORS:
        return None


@dataclass
class KeysetPage:
    """One page of leads, the cursors of its neighbours, and a count bounded by COUNT_LIMIT."""

    leads: list[Lead]
    next_cursor: str | None
    prev_cursor: str | None
    count: int
    count_capped: bool


def keyset_page(
    leads: QuerySet[Lead],
    *,
    column: str,
    descending: bool,
    after: str | None = None,
    before: str | None = None,
    size: int = PAGE_SIZE,
) -> KeysetPage:
    """A page after (or before) a cursor, ordered by ``column`` then id.

    Seeking by the last row seen instead of OFFSET keeps page 20,000 as cheap as page 1: the
    query starts in the index at the cursor. ``column <= value`` is repeated outside the OR so
    that PostgreSQL can use it as an index condition.
    """
    if column == "priority":
        return priority_keyset_page(
            leads, descending=descending, after=after, before=before, size=size
        )
    count = leads.order_by()[: COUNT_LIMIT + 1].count()
    point = cursor_decode(after, column) if after else None
    going_back = False
    if point is None and before:
        point = cursor_decode(before, column)
        going_back = point is not None
    forward_desc = descending != going_back  # walking backwards flips the direction
    if point is not None:
        value, lead_id = point
        if forward_desc:
            leads = leads.filter(
                Q(**{f"{column}__lte": value}),
                Q(**{f"{column}__lt": value}) | Q(**{column: value, "id__lt": lead_id}),
            )
        else:
            leads = leads.filter(
                Q(**{f"{column}__gte": value}),
                Q(**{f"{column}__gt": value}) | Q(**{column: value, "id__gt": lead_id}),
            )
    order = (f"-{column}", "-id") if forward_desc else (column, "id")
    rows = list(leads.order_by(*order)[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    if going_back:
        rows.reverse()
        has_next, has_prev = True, more
    else:
        has_next, has_prev = more, point is not None
    return KeysetPage(
        leads=rows,
        next_cursor=cursor_encode(rows[-1], column) if rows and has_next else None,
        prev_cursor=cursor_encode(rows[0], column) if rows and has_prev else None,
        count=min(count, COUNT_LIMIT),
        count_capped=count > COUNT_LIMIT,
    )


# --- Rows as the pages and the export show them -----------------------------------------------


def current_assignment(lead: Lead) -> Assignment | None:
    current = getattr(lead, "current_assignments", None)
    if current is None:
        current = list(lead.assignments.filter(active=True))
    return current[0] if current else None


@dataclass(frozen=True)
class HistoryRow:
    """One line of the history list / export, as text."""

    id: str
    received_at: datetime
    name: str
    email: str
    company: str
    source: str
    status: str
    owner: str
    team: str
    rule: str
    assigned_at: datetime | None
    priority: str = ""
    tags: tuple[str, ...] = ()


def history_row(lead: Lead) -> HistoryRow:
    assignment = current_assignment(lead)
    return HistoryRow(
        id=str(lead.pk),
        received_at=lead.received_at,
        name=lead.full_name,
        email=lead.email,
        company=lead.company,
        source=lead.source.slug,
        status=lead.status,
        owner=assignment.rep_name if assignment else "",
        team=assignment.team_name if assignment else "",
        rule=assignment.rule_name if assignment else "",
        assigned_at=assignment.assigned_at if assignment else None,
        priority=lead.priority,
        tags=tuple(lead.tags or ()),
    )


# --- One lead ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    type: str
    label: str
    actor: str
    who: str
    detail: str


@dataclass(frozen=True)
class SlaState:
    state: str  # "met", "breached", "open", "none"
    label: str
    due_at: datetime | None
    touched_at: datetime | None


@dataclass
class LeadDetail:
    """Everything the lead page shows, prepared for the template."""

    lead: Lead
    fields: list[tuple[str, str]]
    raw_payload: str
    assignment: Assignment | None
    decision: list[str]
    trace: list[str]
    timeline: list[TimelineEntry]
    duplicate_of: Lead | None
    duplicates: list[Lead]
    sla: SlaState
    deliveries: list[Delivery] = field(default_factory=list)
    attempts: list[DeliveryAttempt] = field(default_factory=list)
    crm: list[tuple[str, list[str]]] = field(default_factory=list)
    fetch: list[str] = field(default_factory=list)
    failure: str = ""


_EVENT_LABELS: dict[str, str] = {
    EventType.RECEIVED: "Received",
    EventType.DUPLICATE_DETECTED: "Duplicate detected",
    EventType.ENRICHED: "Enriched",
    EventType.ENRICHMENT_FAILED: "Enrichment failed",
    EventType.CRM_CHECKED: "Looked up in the CRM",
    EventType.ASSIGNED: "Assigned",
    EventType.EXCLUDED: "Excluded",
    EventType.UNASSIGNED: "Left unassigned",
    EventType.DELIVERED: "Delivered",
    EventType.DELIVERY_FAILED: "Delivery failed",
    EventType.TOUCHED: "First touch",
    EventType.SLA_BREACHED: "SLA breached",
    EventType.REASSIGNED: "Reassigned",
    EventType.REROUTE_REQUESTED: "Sent through routing again",
    EventType.FAILED: "Failed",
    EventType.ERASED: "Person erased",
    EventType.PRUNED: "Personal data pruned (retention)",
}


def _event_detail(event: Event) -> str:
    data = event.data if isinstance(event.data, dict) else {}
    parts: list[str] = []
    for key in ("reason", "error", "duplicate_of", "channel", "recipient"):
        value = data.get(key)
        if value:
            parts.append(f"{key.replace('_', ' ')}: {value}")
    if event.type == EventType.DUPLICATE_DETECTED and data.get("original"):
        matched = data.get("matched_on")
        parts.append(
            f"duplicate of lead {data['original']}" + (f" (same {matched})" if matched else "")
        )
    if event.type == EventType.CRM_CHECKED and data.get("summary"):
        parts.append(str(data["summary"]))
    if data.get("sla_met") is not None:
        parts.append("within SLA" if data["sla_met"] else "after the SLA")
    return "; ".join(str(part) for part in parts)


def timeline_entry(event: Event) -> TimelineEntry:
    who = " · ".join(
        part
        for part in (
            event.rep_name,
            event.team_name,
            f"rule '{event.rule_name}'" if event.rule_name else "",
        )
        if part
    )
    return TimelineEntry(
        at=event.at,
        type=event.type,
        label=_EVENT_LABELS.get(event.type, event.type),
        actor=event.actor,
        who=who,
        detail=_event_detail(event),
    )


def _rule_title(name: str, version: int | None) -> str:
    return f"'{name}'" + (f" (v{version})" if version is not None else "")


def _decided(trace: list[Any]) -> tuple[list[str], dict[str, Any] | None]:
    """The notes (entries without a rule) and the entry whose action decided."""
    notes: list[str] = []
    decided = None
    for entry in trace:
        if not isinstance(entry, dict):
            continue
        if entry.get("rule") is None and entry.get("why"):
            notes.append(str(entry["why"]))
        elif entry.get("decided"):
            decided = entry
    return notes, decided


def decision_sentence(event: Event) -> str | None:
    """One routing decision of the lead's history in plain words, from its audit event."""
    data = event.data if isinstance(event.data, dict) else {}
    trace = event.trace if isinstance(event.trace, list) else []
    notes, decided = _decided(trace)
    lead_in = "".join(f"{note}; " for note in notes)
    if event.type == EventType.REASSIGNED:
        before = data.get("from") or {}
        was = f" from {before.get('name')}" if isinstance(before, dict) and before else ""
        who = event.actor.removeprefix("user:")
        if data.get("manual"):
            reason = data.get("reason") or "no reason given"
            return f"Reassigned by hand by {who}{was} to {event.rep_name}: {reason}"
        return f"Reassigned{was} to {event.rep_name}" + (
            f": {data['reason']}" if data.get("reason") else ""
        )
    if event.type == EventType.ASSIGNED:
        if data.get("kind") == AssignmentKind.DUPLICATE or not event.rule_name:
            reason = data.get("reason") or "assigned"
            return (
                f"{lead_in}{str(reason)[:1].upper()}{str(reason)[1:]}; assigned to {event.rep_name}"
            )
        why = f": {decided['why']}" if decided and decided.get("why") else ""
        rule = _rule_title(event.rule_name, event.ruleset_version)
        return f"{lead_in}Matched rule {rule}{why}; assigned to {event.rep_name}"
    if event.type in (EventType.EXCLUDED, EventType.UNASSIGNED):
        # The deciding rule's own words are shorter than the stored reason (which repeats it).
        reason = str((decided or {}).get("why") or data.get("reason") or "")
        reason = reason.removeprefix("excluded: ")
        head = "Excluded" if event.type == EventType.EXCLUDED else "Left without an owner"
        rule = (
            f" by rule {_rule_title(event.rule_name, event.ruleset_version)}"
            if (event.rule_name)
            else ""
        )
        return f"{lead_in}{head}{rule}" + (f": {reason}" if reason else "")
    return None


def trace_lines(trace: list[Any]) -> list[str]:
    """The rules considered, one line each, as the engine explained them."""
    lines = []
    for entry in trace:
        if not isinstance(entry, dict):
            continue
        why = entry.get("why") or ""
        if entry.get("rule") is None:
            lines.append(str(why))
            continue
        verdict = "decided" if entry.get("decided") else "matched" if entry.get("matched") else "no"
        lines.append(f"{entry.get('rule')}: {verdict} — {why}")
    return lines


def sla_state(assignment: Assignment | None, *, now: datetime) -> SlaState:
    if assignment is None or assignment.sla_due_at is None:
        return SlaState("none", "No SLA", None, assignment.touched_at if assignment else None)
    due, touched = assignment.sla_due_at, assignment.touched_at
    if touched is not None:
        met = touched <= due
        return SlaState(
            "met" if met else "breached", "Met" if met else "Breached (touched late)", due, touched
        )
    if now > due:
        return SlaState("breached", "Breached (not touched yet)", due, None)
    return SlaState("open", "Open", due, None)


def lead_detail(*, user: Any, lead_id: str, now: datetime | None = None) -> LeadDetail | None:
    """The lead page's data, or None when there is no such lead in ``user``'s scope."""
    try:
        lead_uuid = uuid.UUID(str(lead_id))
    except ValueError:
        return None
    visible = leads_visible_to(user)
    lead = (
        visible.select_related("source", "duplicate_of")
        .prefetch_related(
            Prefetch(
                "assignments",
                queryset=Assignment.objects.filter(active=True),
                to_attr="current_assignments",
            ),
            Prefetch("events", queryset=Event.objects.order_by("seq"), to_attr="timeline"),
        )
        .filter(pk=lead_uuid)
        .first()
    )
    if lead is None:
        return None
    assignment = current_assignment(lead)
    events: list[Event] = lead.timeline
    decision = [s for s in (decision_sentence(event) for event in events) if s]
    last_trace: list[Any] = []
    for event in reversed(events):
        if event.type in (EventType.ASSIGNED, EventType.EXCLUDED, EventType.UNASSIGNED):
            last_trace = event.trace if isinstance(event.trace, list) else []
            break
    duplicate_of = lead.duplicate_of
    if duplicate_of is not None and not visible.filter(pk=duplicate_of.pk).exists():
        duplicate_of = None
    duplicates = list(visible.filter(duplicate_of=lead).order_by("received_at")[:50])
    deliveries = list(Delivery.objects.filter(assignment__lead=lead).order_by("created_at", "id"))
    attempts = list(
        DeliveryAttempt.objects.filter(delivery__assignment__lead=lead)
        .select_related("delivery")
        .order_by("at", "id")
    )
    return LeadDetail(
        lead=lead,
        fields=[
            (name.replace("_", " "), _text(value)) for name, value in lead_fields(lead).items()
        ],
        raw_payload=json.dumps(lead.raw_payload, indent=2, ensure_ascii=False, sort_keys=True),
        assignment=assignment,
        decision=decision,
        trace=trace_lines(last_trace),
        timeline=[timeline_entry(event) for event in events],
        duplicate_of=duplicate_of,
        duplicates=duplicates,
        sla=sla_state(assignment, now=now or timezone.now()),
        deliveries=deliveries,
        attempts=attempts,
        crm=crm_findings(lead.crm),
        fetch=fetch_findings(lead),
        failure=_redacted(lead, lead.last_error) if lead.status == LeadStatus.FAILED else "",
    )


def _redacted(lead: Lead, text: Any) -> str:
    """``text`` without the source's page access token (nor any ``access_token=`` value)."""
    options = lead.source.kind_options if isinstance(lead.source.kind_options, dict) else {}
    return scrub(str(text or ""), page_token(options)).strip()


def _tries(count: int) -> str:
    return f"{count} try" if count == 1 else f"{count} tries"


def fetch_findings(lead: Lead) -> list[str]:
    """Where the fetch of a lead its notification only named stands, in words (Meta Lead Ads:
    routing/fetch/meta.py), for the lead page; never the token."""
    if lead.fetch_status == FetchStatus.NONE:
        return []
    fetch = lead.fetch if isinstance(lead.fetch, dict) else {}
    leadgen_id = str(fetch.get("leadgen_id") or "")
    what = f"lead {leadgen_id}" if leadgen_id else "the lead"
    lines: list[str] = []
    if lead.fetch_status == FetchStatus.PENDING:
        note = _redacted(lead, fetch.get("note"))
        lines.append(f"Waiting to be fetched from the Graph API: {note or 'not tried yet'}.")
        due = lead.fetch_next_at
        next_try = f"; next try at {local_words(due)}" if due else ""
        lines.append(f"{_tries(lead.fetch_attempts)} so far{next_try}.")
    elif lead.fetch_status == FetchStatus.FAILED:
        reason = _redacted(lead, lead.last_error or fetch.get("reason")).removeprefix(
            "Meta Lead Ads: "
        )
        lines.append(f"Could not be fetched from the Graph API: {reason or 'no reason kept'}.")
        lines.append(
            "Fix the cause (the source's page access token, its permissions), then retry it: "
            "in the admin, Leads, select it, action Fetch from Meta again."
        )
    elif lead.fetch_status == FetchStatus.DONE:
        at = parse_datetime(str(fetch.get("at") or ""))
        when = f" at {local_words(at)}" if at else ""
        lines.append(f"Fetched {what} from the Graph API{when}.")
    return lines


def _owner_words(owner: Any) -> str:
    if not isinstance(owner, dict) or not owner.get("owner_id"):
        return "no owner"
    if owner.get("rep_name"):
        return f"owner {owner['rep_name']} (owner id {owner['owner_id']})"
    who = owner.get("owner_email") or owner.get("owner_id")
    return f"owner {who}, who is no rep"


def crm_findings(crm: Any) -> list[tuple[str, list[str]]]:
    """What each CRM said about the lead, in words: (CRM name, lines) for the lead page."""
    found: list[tuple[str, list[str]]] = []
    for kind, entry in crm_entries(crm):
        label = crm_label(kind)
        lines: list[str] = []
        status = entry.get("status")
        if status == "failed":
            lines.append(f"Unavailable for this lead: {entry.get('reason') or 'unknown'}")
        elif status == "pending":
            lines.append(
                "Waiting for the CRM" + (f" ({entry['note']})" if entry.get("note") else "")
            )
        person = entry.get("person")
        if isinstance(person, dict) and person.get("id"):
            lines.append(
                f"Person: {person.get('object')} {person['id']}, "
                + _owner_words(entry.get("person_owner"))
                + (f", status {person['status']}" if person.get("status") else "")
            )
        elif status == "done":
            lines.append("Person: none with this e-mail")
        company = entry.get("company")
        if isinstance(company, dict) and company.get("id"):
            name = company.get("name") or company.get("domain") or company["id"]
            lines.append(f"Company: {name}, " + _owner_words(entry.get("company_owner")))
        written = entry.get("written")
        if isinstance(written, dict) and written.get("id"):
            if written.get("outcome") == "kept":
                lines.append(
                    f"Owner not written: changed in {label} after our assignment "
                    f"(to {written.get('owner_id')}), and the later change wins"
                )
            elif written.get("outcome") == "owned":
                lines.append(
                    f"Owner not written: {written.get('object')} {written['id']} was already "
                    f"owned in {label} by {written.get('owner_id')}, an owner LeadRouter had "
                    f"not seen, and {label}'s owner wins"
                )
            else:
                lines.append(
                    f"Owner written: {written.get('outcome')} {written.get('object')} "
                    f"{written['id']} with owner id {written.get('owner_id')}"
                )
        found.append((label, lines))
    return found


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True) if value else ""
    return str(value)


# --- Sorting by priority ----------------------------------------------------------------------


def priorities_present() -> list[str]:
    """Every distinct priority the leads hold ("" for none), found by a loose index scan of
    lead_priority_idx: one index probe a value, not a read of every lead."""
    table = connection.ops.quote_name(Lead._meta.db_table)
    sql = (
        f"WITH RECURSIVE p(v) AS (SELECT MIN(priority) FROM {table} "  # noqa: S608 - our table
        f"UNION ALL SELECT (SELECT MIN(priority) FROM {table} WHERE priority > p.v) "
        "FROM p WHERE p.v IS NOT NULL) SELECT v FROM p WHERE v IS NOT NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [row[0] for row in cursor.fetchall()]


def priority_groups(values: Iterable[str], *, descending: bool) -> list[str]:
    """``values`` in the order of ``?sort=priority`` (the API's ``?ordering=priority``): the
    priorities named in HIGH_PRIORITIES (any case) first, then the others, then none (""), by
    name within each; ``descending`` reverses it."""
    high = {priority_clean(name).casefold() for name in settings.HIGH_PRIORITIES} - {""}

    def rank(value: str) -> tuple[int, str]:
        if value == "":
            return (2, value)
        return (0 if value.casefold() in high else 1, value)

    ordered = sorted(set(values), key=rank)
    return ordered[::-1] if descending else ordered


def _priority_cursor_encode(lead: Lead) -> str:
    raw = json.dumps([lead.priority, lead.received_at.isoformat(), str(lead.pk)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _priority_cursor_decode(cursor: str | None) -> tuple[str, datetime, uuid.UUID] | None:
    """The (priority, received at, id) a priority cursor points at; None if tampered."""
    try:
        priority, received, lead_id = _cursor_json(cursor)
        if not isinstance(priority, str) or not isinstance(received, str):
            return None
        if len(priority) > PRIORITY_MAX_LENGTH or "\x00" in priority:
            return None
        priority.encode("utf-8")  # a lone surrogate cannot reach the database
        at = datetime.fromisoformat(received)
        if at.tzinfo is None:
            return None
        return priority, at.astimezone(UTC), uuid.UUID(str(lead_id))
    except _CURSOR_ERRORS:
        return None


def priority_keyset_page(
    leads: QuerySet[Lead],
    *,
    descending: bool,
    after: str | None = None,
    before: str | None = None,
    size: int = PAGE_SIZE,
) -> KeysetPage:
    """A page of ``leads`` sorted by priority (``priority_groups``), newest first within a
    priority, after (or before) a cursor.

    One priority at a time: each group is an index range of lead_priority_idx
    (priority, received_at desc) from the cursor on, so a page costs a few index probes
    whatever the number of leads, like the other keyset sorts."""
    count = leads.order_by()[: COUNT_LIMIT + 1].count()
    groups = priority_groups(priorities_present(), descending=descending)
    point = _priority_cursor_decode(after) if after else None
    going_back = False
    if point is None and before:
        point = _priority_cursor_decode(before)
        going_back = point is not None
    if point is not None and point[0] not in groups:
        groups = priority_groups([*groups, point[0]], descending=descending)
    start = groups.index(point[0]) if point is not None else 0
    # Forward: from the cursor's group on, newest first; back: from it to the first, oldest first.
    walk = groups[start::-1] if going_back else groups[start:]
    rows: list[Lead] = []
    for index, group in enumerate(walk):
        wanted = size + 1 - len(rows)
        if wanted <= 0:
            break
        in_group = leads.filter(priority=group)
        if point is not None and index == 0:
            _, at, lead_id = point
            if going_back:
                later = Q(received_at__gt=at) | Q(received_at=at, id__gt=lead_id)
                in_group = in_group.filter(Q(received_at__gte=at), later)
            else:
                earlier = Q(received_at__lt=at) | Q(received_at=at, id__lt=lead_id)
                in_group = in_group.filter(Q(received_at__lte=at), earlier)
        order = ("received_at", "id") if going_back else ("-received_at", "-id")
        rows += list(in_group.order_by(*order)[:wanted])
    more = len(rows) > size
    rows = rows[:size]
    if going_back:
        rows.reverse()
        has_next, has_prev = True, more
    else:
        has_next, has_prev = more, point is not None
    return KeysetPage(
        leads=rows,
        next_cursor=_priority_cursor_encode(rows[-1]) if rows and has_next else None,
        prev_cursor=_priority_cursor_encode(rows[0]) if rows and has_prev else None,
        count=min(count, COUNT_LIMIT),
        count_capped=count > COUNT_LIMIT,
    )
