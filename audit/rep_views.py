"""The rep's pages: their own leads and time off (a login), and the one-click link (no login).

Thin: ``audit.rep_page`` reads, ``routing.rep_access`` and ``routing.timeoff.services`` write.
A lead that is not the logged-in rep's is "not found", whatever the reason, so the page tells
nothing about other reps' leads.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

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
from audit.views import lead_id_or_404
from routing.delivery.messages import zone_of
from routing.models import Rep
from routing.rep_access import rep_of_user, touch_link_read, touch_link_use
from routing.services import LeadActionError, assignment_touch
from routing.timeoff.models import RepAbsence
from routing.timeoff.services import rep_absence_cancel, rep_absence_save
from routing.touch_links import TouchLinkError

RepView = Callable[..., HttpResponse]


def rep_required(view: RepView) -> RepView:
    """A logged-in user who is a rep: the view gets their ``Rep`` after the request; anyone else
    logged in sees "you are not a rep" (403), anyone logged out the login page."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        rep = rep_of_user(request.user)
        if rep is None:
            return render(request, "audit/me_none.html", status=403)
        return view(request, rep, *args, **kwargs)

    return wrapper


def _page(request: HttpRequest, rep: Rep, form: AbsenceForm, status: int = 200) -> HttpResponse:
    page = rep_page_read(rep=rep, now=timezone.now())
    context = {"page": page, "form": form, "rep_zone": zone_of(rep.timezone).key}
    return render(request, "audit/me.html", context, status=status)


@require_GET
@rep_required
def me(request: HttpRequest, rep: Rep) -> HttpResponse:
    """The rep's leads waiting for a first touch, touched lately, and their time off."""
    return _page(request, rep, AbsenceForm(zone=zone_of(rep.timezone)))


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


@require_POST
@rep_required
def me_touch(request: HttpRequest, rep: Rep, lead_id: str) -> HttpResponse:
    """ "I'm on it": the rep's first touch of one of their own leads."""
    lead = lead_id_or_404(lead_id)
    try:
        assignment_touch(lead_id=lead, actor=_actor(request), owner_user_id=request.user.pk)
    except LeadActionError as exc:
        if exc.status in (403, 404):  # another rep's lead reads as no lead at all
            raise Http404("No such lead.") from exc
        messages.error(request, exc.message)
        return redirect("me")
    messages.success(request, "First touch recorded.")
    return redirect("me")


@require_POST
@rep_required
def me_absence_add(request: HttpRequest, rep: Rep) -> HttpResponse:
    """Plan time off (the rep's zone); refused with the reason, nothing saved, when invalid."""
    form = AbsenceForm(request.POST, zone=zone_of(rep.timezone))
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


@require_POST
@rep_required
def me_absence_cancel(request: HttpRequest, rep: Rep, absence_id: int) -> HttpResponse:
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
