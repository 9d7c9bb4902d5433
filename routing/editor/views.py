"""Extra admin pages of the rule editor (routed by ``RuleSetAdmin.get_urls``).

Simulate, replay, compare and run-tests only read; publish, roll back, new draft and moving a
rule call one service each. Each page checks the admin permission it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse

from audit.config_changes import actor_of, config_change_record, stored_values, values_of
from routing.admin_jobs import admin_job_start_replay
from routing.drafts.live import LiveChangeRefused
from routing.editor.forms import SimulateForm
from routing.engine import RuleErrors
from routing.models import AdminJob, AdminJobKind, Rule, RuleSet, RuleSetStatus
from routing.rules_io import AlreadyPublished, ConfigurationBusy
from routing.versions import (
    REPLAY_DEFAULT,
    TestCasesFailing,
    outcome_simulated,
    replay_result_data,
    rule_move,
    ruleset_diff,
    ruleset_new_draft,
    ruleset_publish_checked,
    ruleset_replay,
    ruleset_rollback,
    test_cases_run,
)

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin


def _require(request: HttpRequest, permission: str) -> None:
    if not request.user.has_perm(f"routing.{permission}"):
        raise PermissionDenied


def _context(model_admin: ModelAdmin[Any], request: HttpRequest, title: str) -> dict[str, Any]:
    return {
        **model_admin.admin_site.each_context(request),
        "opts": RuleSet._meta,
        "title": title,
    }


def _log(request: HttpRequest, obj: Any, message: str) -> None:
    LogEntry.objects.log_actions(
        user_id=request.user.pk or 0,
        queryset=[obj],
        action_flag=CHANGE,
        change_message=message,
        single_object=True,
    )


def _change_url(ruleset: RuleSet) -> str:
    return reverse("admin:routing_ruleset_change", args=[ruleset.pk])


def _latest_draft() -> RuleSet | None:
    return RuleSet.objects.filter(status=RuleSetStatus.DRAFT).order_by("-version").first()


def _published() -> RuleSet | None:
    return RuleSet.objects.filter(status=RuleSetStatus.PUBLISHED).first()


def someone_else_published() -> str:
    live = _published()
    return (
        f"Not published: someone else just published version {live.version}. "
        "Check it, then start a new draft if yours is still needed."
        if live is not None
        else "Not published: someone else just changed the versions; try again."
    )


# --- Simulate -----------------------------------------------------------------------------------


def simulate_view(model_admin: ModelAdmin[Any], request: HttpRequest) -> HttpResponse:
    """A lead decided by a draft and by the published version, side by side; writes nothing."""
    _require(request, "view_ruleset")
    drafts = list(RuleSet.objects.filter(status=RuleSetStatus.DRAFT).order_by("-version"))
    published = _published()
    form = SimulateForm(request.POST or None, initial={"draft": request.GET.get("draft")})
    columns: list[tuple[RuleSet, Any]] = []
    if request.method == "POST" and form.is_valid():
        wanted = form.cleaned_data.get("draft")
        draft = next((d for d in drafts if d.version == wanted), drafts[0] if drafts else None)
        source = form.cleaned_data.get("source")
        for ruleset in (draft, published):
            if ruleset is not None:
                outcome = outcome_simulated(
                    lead_data=form.cleaned_data["lead"],
                    source_slug=source.slug if source else None,
                    version=ruleset.version,
                )
                columns.append((ruleset, outcome))
    context = {
        **_context(model_admin, request, "Simulate a lead"),
        "form": form,
        "drafts": drafts,
        "published": published,
        "columns": columns,
        "selected_draft": form.data.get("draft") or request.GET.get("draft") or "",
    }
    return TemplateResponse(request, "admin/routing/ruleset/simulate.html", context)


# --- Replay, compare, run tests -----------------------------------------------------------------


def replay_view(model_admin: ModelAdmin[Any], request: HttpRequest, pk: int) -> HttpResponse:
    """A version replayed over the last N processed leads: what would change; writes nothing.

    Up to ``REPLAY_SYNC_MAX_LEADS`` leads it runs while the page loads; more (RevOps only) start
    a background job and open its progress page.
    """
    _require(request, "view_ruleset")
    ruleset = get_object_or_404(RuleSet, pk=pk)
    data = request.POST if request.method == "POST" else request.GET
    try:
        limit = int(data.get("n", REPLAY_DEFAULT))
    except ValueError:
        limit = REPLAY_DEFAULT
    limit = max(1, min(limit, settings.REPLAY_MAX_LEADS))
    sync_max = settings.REPLAY_SYNC_MAX_LEADS
    result = error = None
    if request.method == "POST" or "run" in request.GET:
        if limit > sync_max:
            _require(request, "change_ruleset")
            if request.method == "POST":
                job = admin_job_start_replay(
                    ruleset=ruleset,
                    limit=limit,
                    actor=request.user,  # type: ignore[arg-type]
                )
                return HttpResponseRedirect(
                    reverse("admin:routing_adminjob_progress", args=[job.pk])
                )
            error = f"More than {sync_max} leads run in the background: press Replay to start."
        else:
            try:
                result = replay_result_data(ruleset_replay(ruleset=ruleset, limit=limit))
            except RuleErrors as exc:
                error = f"Version {ruleset.version} does not compile: {exc}"
            except ConfigurationBusy as exc:
                error = str(exc)
    can_run_large = request.user.has_perm("routing.change_ruleset")
    context = {
        **_context(model_admin, request, f"Replay version {ruleset.version}"),
        "ruleset": ruleset,
        "limit": limit,
        "max": settings.REPLAY_MAX_LEADS if can_run_large else sync_max,
        "sync_max": sync_max,
        "result": result,
        "error": error,
        "jobs": (
            AdminJob.objects.filter(kind=AdminJobKind.REPLAY, ruleset=ruleset)[:5]
            if can_run_large
            else []
        ),
    }
    return TemplateResponse(request, "admin/routing/ruleset/replay.html", context)


def diff_view(model_admin: ModelAdmin[Any], request: HttpRequest) -> HttpResponse:
    """Compare any two versions: rules added, removed, changed and reordered."""
    _require(request, "view_ruleset")
    versions = list(RuleSet.objects.order_by("-version"))
    by_version = {str(ruleset.version): ruleset for ruleset in versions}
    published = _published()
    old = by_version.get(request.GET.get("old", "")) or published
    new = by_version.get(request.GET.get("new", "")) or _latest_draft()
    diff = ruleset_diff(old=old, new=new) if old is not None and new is not None else None
    context = {
        **_context(model_admin, request, "Compare versions"),
        "versions": versions,
        "old": old,
        "new": new,
        "diff": diff,
    }
    return TemplateResponse(request, "admin/routing/ruleset/diff.html", context)


def tests_view(model_admin: ModelAdmin[Any], request: HttpRequest, pk: int) -> HttpResponse:
    """Every saved test case run against a version: pass or fail, and why."""
    _require(request, "view_ruleset")
    ruleset = get_object_or_404(RuleSet, pk=pk)
    results = test_cases_run(ruleset=ruleset)
    context = {
        **_context(model_admin, request, f"Test cases against version {ruleset.version}"),
        "ruleset": ruleset,
        "results": results,
        "failed": sum(1 for result in results if not result.passed),
    }
    return TemplateResponse(request, "admin/routing/ruleset/tests.html", context)


# --- Publish, roll back, new draft, move ------------------------------------------------------


def publish_view(model_admin: ModelAdmin[Any], request: HttpRequest, pk: int) -> HttpResponse:
    """Confirm and publish a draft: its changes, its test results, a note; failing needs a tick."""
    _require(request, "change_ruleset")
    ruleset = get_object_or_404(RuleSet, pk=pk)
    if ruleset.status != RuleSetStatus.DRAFT:
        messages.error(request, f"Version {ruleset.version} is not a draft.")
        return HttpResponseRedirect(_change_url(ruleset))
    results = test_cases_run(ruleset=ruleset)
    failed = [result for result in results if not result.passed]
    error = ""
    if request.method == "POST":
        try:
            published = ruleset_publish_checked(
                ruleset=ruleset,
                actor=request.user,  # type: ignore[arg-type]
                note=request.POST.get("note", ""),
                confirm_failing=request.POST.get("confirm_failing") == "on",
            )
        except TestCasesFailing as exc:
            error = f"{exc}. Tick the box to publish anyway."
            failed = [result for result in exc.results if not result.passed]
        except (AlreadyPublished, IntegrityError):
            messages.error(request, someone_else_published())
            return HttpResponseRedirect(_change_url(ruleset))
        except RuleErrors as exc:
            error = f"Not published: {exc}"
        except (ConfigurationBusy, LiveChangeRefused) as exc:
            error = f"Not published: {exc}"
        else:
            _log(request, published, f"Published version {published.version}")
            messages.success(
                request, f"Version {published.version} is live: the next lead is routed by it."
            )
            return HttpResponseRedirect(_change_url(published))
    live = _published()
    context = {
        **_context(model_admin, request, f"Publish version {ruleset.version}"),
        "ruleset": ruleset,
        "live": live,
        "diff": ruleset_diff(old=live, new=ruleset) if live is not None else None,
        "results": results,
        "failed": failed,
        "error": error,
    }
    return TemplateResponse(request, "admin/routing/ruleset/publish.html", context)


def rollback_view(model_admin: ModelAdmin[Any], request: HttpRequest, pk: int) -> HttpResponse:
    """Confirm and republish an older version as a new version."""
    _require(request, "change_ruleset")
    ruleset = get_object_or_404(RuleSet, pk=pk)
    if ruleset.status != RuleSetStatus.ARCHIVED:
        messages.error(
            request,
            f"Version {ruleset.version} is {ruleset.get_status_display().lower()}: only an "
            "archived version can be rolled back to.",
        )
        return HttpResponseRedirect(_change_url(ruleset))
    error = ""
    if request.method == "POST":
        try:
            live = ruleset_rollback(
                ruleset=ruleset,
                actor=request.user,  # type: ignore[arg-type]
                note=request.POST.get("note", ""),
            )
        except IntegrityError:
            messages.error(request, someone_else_published())
            return HttpResponseRedirect(_change_url(ruleset))
        except (ValidationError, RuleErrors) as exc:
            error = " ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        except (ConfigurationBusy, LiveChangeRefused) as exc:
            error = f"Not rolled back: {exc}"
        else:
            _log(request, live, f"Rolled back to version {ruleset.version}")
            messages.success(
                request,
                f"Version {ruleset.version} is live again, as version {live.version}.",
            )
            return HttpResponseRedirect(_change_url(live))
    current = _published()
    context = {
        **_context(model_admin, request, f"Roll back to version {ruleset.version}"),
        "ruleset": ruleset,
        "live": current,
        "diff": ruleset_diff(old=current, new=ruleset) if current is not None else None,
        "error": error,
    }
    return TemplateResponse(request, "admin/routing/ruleset/rollback.html", context)


def new_draft_view(
    model_admin: ModelAdmin[Any], request: HttpRequest, pk: int | None = None
) -> HttpResponse:
    """A new draft copied from a version (default: the published one); opens it."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    _require(request, "add_ruleset")
    origin = get_object_or_404(RuleSet, pk=pk) if pk is not None else None
    try:
        with transaction.atomic():
            draft = ruleset_new_draft(ruleset=origin, actor=request.user)  # type: ignore[arg-type]
            config_change_record(
                actor=actor_of(request),
                obj=draft,
                action="added",
                after=values_of(draft),
                extra={"rules": draft.rules.count()},
            )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return HttpResponseRedirect(reverse("admin:routing_ruleset_changelist"))
    messages.success(request, f"Draft version {draft.version} created: edit it, then publish.")
    return HttpResponseRedirect(_change_url(draft))


def rule_move_view(
    model_admin: ModelAdmin[Any], request: HttpRequest, pk: int, direction: str
) -> HttpResponse:
    """Move a draft rule up (earlier) or down (later), then back to its ruleset."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    _require(request, "change_rule")
    rule = get_object_or_404(Rule.objects.select_related("ruleset"), pk=pk)
    if direction not in ("up", "down"):
        raise PermissionDenied
    before = values_of(rule)
    try:
        with transaction.atomic():
            rule_move(rule=rule, direction="up" if direction == "up" else "down")
            config_change_record(
                actor=actor_of(request),
                obj=rule,
                action=f"move_{direction}",
                before=before,
                after=stored_values(rule),
            )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    return HttpResponseRedirect(_change_url(rule.ruleset) + "#rules-group")
