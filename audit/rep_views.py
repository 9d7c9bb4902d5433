"""The rep's pages: their own leads and time off (a login), and the one-click link (no login).

Thin: ``audit.rep_page`` reads, ``routing.rep_access`` and ``routing.timeoff.services`` write.
A lead that is not the logged-in rep's is "not found", whatever the reason, so the page tells
nothing about other reps' leads.
"""

from __future__ import annotations

import zoneinfo

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from audit.forms import AbsenceForm
from audit.rep_page import rep_page_read
from routing.models import Rep
from routing.rep_access import lead_uuid, rep_of_user, touch_link_read, touch_link_use
from routing.services import LeadActionError, assignment_touch
from routing.timeoff.models import RepAbsence
from routing.timeoff.services import rep_absence_cancel, rep_absence_save
from routing.touch_links import TouchLinkError


def _rep_or_403(request: HttpRequest) -> Rep | HttpResponse:
    rep = rep_of_user(request.user)
    if rep is None:
        return render(request, "audit/me_none.html", status=403)
    return rep


def _zone(rep: Rep) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(rep.timezone or "UTC")
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return zoneinfo.ZoneInfo("UTC")


def _page(request: HttpRequest, rep: Rep, form: AbsenceForm, status: int = 200) -> HttpResponse:
    page = rep_page_read(rep=rep, now=timezone.now())
    context = {"page": page, "form": form, "rep_zone": _zone(rep).key}
    return render(request, "audit/me.html", context, status=status)


@login_required
@require_GET
def me(request: HttpRequest) -> HttpResponse:
    """The rep's leads waiting for a first touch, touched lately, and their time off."""
    rep = _rep_or_403(request)
    if isinstance(rep, HttpResponse):
        return rep
    return _page(request, rep, AbsenceForm(zone=_zone(rep)))


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


@login_required
@require_POST
def me_touch(request: HttpRequest, lead_id: str) -> HttpResponse:
    """ "I'm on it": the rep's first touch of one of their own leads."""
    rep = _rep_or_403(request)
    if isinstance(rep, HttpResponse):
        return rep
    lead = lead_uuid(lead_id)
    if lead is None:
        raise Http404("No such lead.")
    try:
        assignment_touch(lead_id=lead, actor=_actor(request), owner_user_id=request.user.pk)
    except LeadActionError as exc:
        if exc.status in (403, 404):  # another rep's lead reads as no lead at all
            raise Http404("No such lead.") from exc
        messages.error(request, exc.message)
        return redirect("me")
    messages.success(request, "First touch recorded.")
    return redirect("me")


@login_required
@require_POST
def me_absence_add(request: HttpRequest) -> HttpResponse:
    """Plan time off (the rep's zone); refused with the reason, nothing saved, when invalid."""
    rep = _rep_or_403(request)
    if isinstance(rep, HttpResponse):
        return rep
    form = AbsenceForm(request.POST, zone=_zone(rep))
    if not form.is_valid():
        return _page(request, rep, form, status=400)
    absence = RepAbsence(
        rep=rep,
        starts_at=form.cleaned_data["starts_at"],
        ends_at=form.cleaned_data["ends_at"],
        note=form.cleaned_data["note"],
    )
    try:
        rep_absence_save(absence=absence, actor=_actor(request))
    except ValidationError as exc:
        for message in exc.messages:
            form.add_error(None, message)
        return _page(request, rep, form, status=400)
    messages.success(request, "Time off planned.")
    return redirect("me")


@login_required
@require_POST
def me_absence_cancel(request: HttpRequest, absence_id: int) -> HttpResponse:
    rep = _rep_or_403(request)
    if isinstance(rep, HttpResponse):
        return rep
    if not rep_absence_cancel(rep_id=rep.pk, absence_id=absence_id, actor=_actor(request)):
        raise Http404("No such planned absence (one under way cannot be cancelled here).")
    messages.success(request, "Time off cancelled.")
    return redirect("me")


@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
def touch_link(request: HttpRequest, token: str) -> HttpResponse:
    """The one-click link: GET shows the lead and the button, the button's POST records."""
    try:
        if request.method == "POST":
            view = touch_link_use(token=token)
        else:
            view = touch_link_read(token=token)
    except TouchLinkError as exc:
        response = render(
            request, "audit/touch_link.html", {"error": exc.message}, status=exc.status
        )
    else:
        response = render(request, "audit/touch_link.html", {"view": view})
    # The token must not leak to another site; same-origin keeps the form POST's Origin header
    # (with no-referrer the browser sends "Origin: null", which the CSRF check refuses).
    response["Referrer-Policy"] = "same-origin"
    return response
