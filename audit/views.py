"""The pages sales managers use: history, a lead, the dashboard. Thin: selectors and services."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from audit import dashboard as metrics
from audit.csv import export_lines
from audit.forms import ReassignForm
from audit.selectors import (
    SORTS,
    history_leads,
    history_row,
    keyset_page,
    lead_detail,
    leads_visible_to,
    managed_team_ids,
    reps_for_reassignment,
    sort_parse,
)
from routing.services import LeadActionError, assignment_touch, lead_reassign

VIEW = "leads.view_lead"


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


def human_duration(value: timedelta | None) -> str:
    """``3 s``, ``4 min 5 s``, ``2 h 10 min``, ``3 d 4 h``; a dash for none."""
    if value is None:
        return "—"
    seconds = max(int(value.total_seconds()), 0)
    if seconds < 60:
        return f"{value.total_seconds():.1f} s" if seconds < 10 else f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@dataclass(frozen=True)
class SortLink:
    label: str
    url: str
    marker: str  # "▲", "▼" or ""


def _query(request: HttpRequest, **changes: str | None) -> str:
    params = request.GET.copy()
    for key, value in changes.items():
        params.pop(key, None)
        if value:
            params[key] = value
    encoded = params.urlencode()
    return f"?{encoded}" if encoded else "?"


_SORT_LABELS = {"received": "Received", "email": "E-mail"}


@login_required
@permission_required(VIEW, raise_exception=True)
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return redirect("history")


@login_required
@permission_required(VIEW, raise_exception=True)
@require_GET
def history(request: HttpRequest) -> HttpResponse:
    """Assignment history: filters, sortable columns, keyset pages of 50."""
    found, leads = history_leads(user=request.user, data=request.GET)
    sort, column, descending = sort_parse(request.GET.get("sort"))
    page = keyset_page(
        leads,
        column=column,
        descending=descending,
        after=request.GET.get("after"),
        before=request.GET.get("before"),
    )
    current = sort.lstrip("-")
    sort_links = {}
    for key in SORTS:
        if key == current:
            toggled = key if descending else f"-{key}"
        else:
            toggled = f"-{key}" if key == "received" else key
        marker = ("▼" if descending else "▲") if key == current else ""
        sort_links[key] = SortLink(
            _SORT_LABELS[key], _query(request, sort=toggled, after=None, before=None), marker
        )
    context = {
        "filter": found,
        "rows": [history_row(lead) for lead in page.leads],
        "page": page,
        "count_label": f"{page.count:,}+" if page.count_capped else f"{page.count:,}",
        "sort_links": sort_links,
        "next_url": _query(request, after=page.next_cursor, before=None)
        if page.next_cursor
        else None,
        "prev_url": _query(request, before=page.prev_cursor, after=None)
        if page.prev_cursor
        else None,
        "first_url": _query(request, after=None, before=None) if page.prev_cursor else None,
        "export_url": reverse("history-export") + _query(request, after=None, before=None),
    }
    return render(request, "audit/history.html", context)


@login_required
@permission_required(VIEW, raise_exception=True)
@require_GET
def history_export(request: HttpRequest) -> StreamingHttpResponse:
    """The filtered history as CSV, streamed from the database in chunks."""
    _, leads = history_leads(user=request.user, data=request.GET)
    response = StreamingHttpResponse(export_lines(leads), content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="lead-history-{stamp}.csv"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


def _lead_or_404(request: HttpRequest, lead_id: str) -> uuid.UUID:
    """The id of a lead ``request.user`` may see; 404 for anything else (no probing)."""
    try:
        lead_uuid = uuid.UUID(lead_id)
    except ValueError:
        raise Http404("No such lead.") from None
    if not leads_visible_to(request.user).filter(pk=lead_uuid).exists():
        raise Http404("No such lead.")
    return lead_uuid


@login_required
@permission_required(VIEW, raise_exception=True)
@require_GET
def lead_page(request: HttpRequest, lead_id: str) -> HttpResponse:
    """One lead: fields, payload, decision in words, timeline, duplicates, SLA, deliveries."""
    detail = lead_detail(user=request.user, lead_id=lead_id)
    if detail is None:
        raise Http404("No such lead.")
    can_reassign = request.user.has_perm("leads.reassign_lead")
    can_touch = (
        request.user.has_perm("leads.touch_lead")
        and detail.assignment is not None
        and detail.assignment.touched_at is None
    )
    context: dict[str, Any] = {
        "detail": detail,
        "lead": detail.lead,
        "name": f"{detail.lead.first_name} {detail.lead.last_name}".strip() or str(detail.lead),
        "can_reassign": can_reassign,
        "can_touch": can_touch,
        "reassign_form": ReassignForm(reps=reps_for_reassignment(request.user))
        if can_reassign
        else None,
    }
    return render(request, "audit/lead.html", context)


@login_required
@permission_required(("leads.view_lead", "leads.reassign_lead"), raise_exception=True)
@require_POST
def lead_reassign_action(request: HttpRequest, lead_id: str) -> HttpResponse:
    """Reassign a lead through routing's service; refusals come back as messages."""
    lead_uuid = _lead_or_404(request, lead_id)
    form = ReassignForm(request.POST, reps=reps_for_reassignment(request.user))
    if not form.is_valid():
        for field, errors in form.errors.items():
            for error in errors:
                messages.error(request, f"{field}: {error}")
        return redirect("history-lead", lead_id=lead_uuid)
    try:
        assignment = lead_reassign(
            lead_id=lead_uuid,
            rep_email=form.cleaned_data["rep"].email,
            reason=form.cleaned_data["reason"],
            actor=_actor(request),
            scope_team_ids=managed_team_ids(request.user),
        )
    except LeadActionError as exc:
        return _refused(request, exc, lead_uuid)
    messages.success(request, f"Reassigned to {assignment.rep_name}.")
    return redirect("history-lead", lead_id=lead_uuid)


def _refused(request: HttpRequest, error: LeadActionError, lead_uuid: uuid.UUID) -> HttpResponse:
    """A refused action: its message on the lead's page; a 404 if the lead left the user's
    scope after the first check (the service checks again under the lead's lock)."""
    if error.status == 404:
        raise Http404("No such lead.")
    messages.error(request, error.message)
    return redirect("history-lead", lead_id=lead_uuid)


@login_required
@permission_required(("leads.view_lead", "leads.touch_lead"), raise_exception=True)
@require_POST
def lead_touch_action(request: HttpRequest, lead_id: str) -> HttpResponse:
    """Record the first touch of a lead through routing's service."""
    lead_uuid = _lead_or_404(request, lead_id)
    try:
        assignment_touch(
            lead_id=lead_uuid,
            actor=_actor(request),
            scope_team_ids=managed_team_ids(request.user),
        )
    except LeadActionError as exc:
        return _refused(request, exc, lead_uuid)
    messages.success(request, "First touch recorded.")
    return redirect("history-lead", lead_id=lead_uuid)


@login_required
@permission_required(VIEW, raise_exception=True)
@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    """Backlog, rates, time to assign, SLA breaches, alerts and rep load, as server-side SVG."""
    try:
        hours = min(max(int(request.GET.get("hours", "3")), 1), 24)
    except ValueError:
        hours = 3
    data = metrics.dashboard(hours=hours, team_ids=managed_team_ids(request.user))
    context = {
        "d": data,
        "backlog_age": human_duration(data.backlog_oldest_age),
        "p50": human_duration(data.p50),
        "p95": human_duration(data.p95),
        "hour_choices": [(h, h == hours) for h in (1, 3, 6, 12, 24)],
    }
    return render(request, "audit/dashboard.html", context)
