"""The pages sales managers use: history, a lead, the dashboard. Thin: selectors and services."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from audit import dashboard as metrics
from audit.csv import export_lines
from audit.forms import ReassignForm, TimeZoneForm
from audit.reports import REP_SORTS, WINDOWS, ReportError
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
from audit.templatetags.report_format import duration as human_duration
from audit.timezones import TZ_COOKIE, user_zone_name, user_zone_set, zone_parse
from config.errors import json_error
from routing.rep_access import rep_of_user
from routing.services import LeadActionError, assignment_touch, lead_reassign

VIEW = "leads.view_lead"


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


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


_SORT_LABELS = {"received": "Received", "email": "E-mail", "priority": "Priority"}


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """Managers land on the history; a rep who is nothing more, on their own leads."""
    if request.user.has_perm(VIEW):
        return redirect("history")
    if rep_of_user(request.user) is not None:
        return redirect("me")
    raise PermissionDenied


@login_required
def time_zone_settings(request: HttpRequest) -> HttpResponse:
    """The user's own time zone: one of zoneinfo's names, or follow the browser."""
    cookie = request.COOKIES.get(TZ_COOKIE)
    browser = zone_parse(cookie)
    browser_name = browser.key if browser is not None else ""
    if request.method == "POST":
        form = TimeZoneForm(request.POST, browser_zone=browser_name)
        if form.is_valid():
            chosen = user_zone_set(user=request.user, name=form.cleaned_data["time_zone"])
            shown = chosen or browser_name or "the server's zone"
            messages.success(request, f"Times are now shown in {shown}.")
            return redirect("time-zone")
    else:
        form = TimeZoneForm(
            initial={"time_zone": user_zone_name(request.user)}, browser_zone=browser_name
        )
    return render(request, "registration/time_zone.html", {"form": form})


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


def lead_id_or_404(lead_id: str) -> uuid.UUID:
    """A lead id from the URL; 404 when it is not one."""
    try:
        return uuid.UUID(lead_id)
    except ValueError:
        raise Http404("No such lead.") from None


def _lead_or_404(request: HttpRequest, lead_id: str) -> uuid.UUID:
    """The id of a lead ``request.user`` may see; 404 for anything else (no probing)."""
    lead_uuid = lead_id_or_404(lead_id)
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


def _report_error(error: ReportError) -> HttpResponse:
    return json_error(400, "invalid_parameter", f"{error.parameter}: {error.message}")


@login_required
@permission_required(VIEW, raise_exception=True)
@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    """Backlog, rates, time to assign, SLA, per-team and per-rep tables, fairness, rep load."""
    try:
        query = metrics.dashboard_query(request.GET)
    except ReportError as error:
        return _report_error(error)
    data = metrics.dashboard(query=query, team_ids=managed_team_ids(request.user))
    page = data.rep_page
    context = {
        "d": data,
        "backlog_age": human_duration(data.backlog_oldest_age),
        "p50": human_duration(data.p50),
        "p95": human_duration(data.p95),
        "window_choices": [
            (key, _query(request, window=key, bucket=None, page=None), key == query.window.key)
            for key in WINDOWS
        ],
        "rep_sort_links": {
            key: _query(
                request,
                sort=(key if query.descending else f"-{key}")
                if key == query.sort
                else (key if key == "name" else f"-{key}"),
                page=None,
            )
            for key in REP_SORTS
        },
        "rep_sort": query.sort,
        "rep_sort_marker": "▼" if query.descending else "▲",
        "next_url": _query(request, page=str(page.number + 1))
        if page.number < page.pages
        else None,
        "prev_url": _query(request, page=str(page.number - 1)) if page.number > 1 else None,
        "export_urls": {
            table: reverse("dashboard-export", args=[table])
            + _query(request, page=None, bucket=None)  # the sort kept: the reps in the page's order
            for table in metrics.EXPORT_TABLES
        },
    }
    return render(request, "audit/dashboard.html", context)


@login_required
@permission_required(VIEW, raise_exception=True)
@require_GET
def dashboard_export(request: HttpRequest, table: str) -> HttpResponse:
    """One of the dashboard's tables over its window as CSV (the rep table: every rep)."""
    if table not in metrics.EXPORT_TABLES:
        raise Http404("No such table.")
    try:
        query = metrics.dashboard_query(request.GET)
    except ReportError as error:
        return _report_error(error)
    lines = metrics.dashboard_table_lines(
        table=table, query=query, team_ids=managed_team_ids(request.user)
    )
    response = HttpResponse("".join(lines), content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    name = f"{table}-{query.window.key}-{stamp}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response
