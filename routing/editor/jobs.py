"""The progress page of a background admin job (replay, CSV import, a publish or rollback of
the whole configuration, a draft's test) and its JSON status.

Only who may run that kind of job may watch it: RevOps (``change_ruleset`` for a replay,
``change_territory`` / ``change_account`` for an import, ``add_configsnapshot`` for a publish
or rollback, ``change_configdraft`` for a draft's test or a replay against a draft, ``change_rep``
for re-routing an unavailable rep's leads). The page polls the JSON every two
seconds (no script: a meta refresh does) and shows the result, or the error, when the job ends;
a job no worker reports on for ``ADMIN_JOB_STALE_SECONDS`` is shown as stalled, not as running.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse

from routing.drafts.models import ConfigSnapshot
from routing.models import AdminJob, AdminJobKind, AdminJobStatus

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

JOB_PERMISSION = {
    AdminJobKind.REPLAY: "routing.change_ruleset",
    AdminJobKind.TERRITORIES_IMPORT: "routing.change_territory",
    AdminJobKind.ACCOUNTS_IMPORT: "routing.change_account",
    AdminJobKind.REROUTE_AWAY: "routing.change_rep",
    AdminJobKind.CONFIG_PUBLISH: "routing.add_configsnapshot",
    AdminJobKind.CONFIG_ROLLBACK: "routing.add_configsnapshot",
    AdminJobKind.CONFIG_CHECK: "routing.change_configdraft",
    AdminJobKind.DRAFT_REPLAY: "routing.change_configdraft",
}
IMPORT_KINDS = (AdminJobKind.TERRITORIES_IMPORT, AdminJobKind.ACCOUNTS_IMPORT)
CONFIG_KINDS = (
    AdminJobKind.CONFIG_PUBLISH,
    AdminJobKind.CONFIG_ROLLBACK,
    AdminJobKind.CONFIG_CHECK,
)


def job_visible(request: HttpRequest, job: AdminJob) -> bool:
    return request.user.has_perm(JOB_PERMISSION[AdminJobKind(job.kind)])


def _job(request: HttpRequest, pk: int) -> AdminJob:
    job = get_object_or_404(AdminJob.objects.select_related("ruleset", "requested_by"), pk=pk)
    if not job_visible(request, job):
        raise PermissionDenied
    return job


def job_status(job: AdminJob) -> dict[str, Any]:
    """What the progress page polls."""
    return {
        "id": job.pk,
        "kind": job.kind,
        "status": job.status,
        "phase": job.phase,
        "done": job.progress_done,
        "total": job.progress_total,
        "percent": job.percent,
        "stalled": job.stalled,
        "finished": job.is_finished,
        "error": job.error,
    }


def _version_url(result: dict[str, Any]) -> str | None:
    """The admin page of the version a publish or rollback job published."""
    number = (result.get("version") or {}).get("number")
    if not isinstance(number, int):
        return None
    pk = ConfigSnapshot.objects.filter(number=number).values_list("pk", flat=True).first()
    return reverse("admin:routing_configsnapshot_change", args=[pk]) if pk else None


def job_status_view(model_admin: ModelAdmin[Any], request: HttpRequest, pk: int) -> HttpResponse:
    return JsonResponse(job_status(_job(request, pk)))


def job_progress_view(model_admin: ModelAdmin[Any], request: HttpRequest, pk: int) -> HttpResponse:
    """The job's progress while it runs; its result (or error) once it ended."""
    job = _job(request, pk)
    result = job.result or {}
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": AdminJob._meta,
        "title": str(job.get_kind_display()) + f" #{job.pk}",
        "job": job,
        "ruleset": job.ruleset,
        "status": job_status(job),
        "result": result if job.kind == AdminJobKind.REPLAY else None,
        "report": result if job.kind in IMPORT_KINDS else None,
        "published": (
            result
            if job.kind in (AdminJobKind.CONFIG_PUBLISH, AdminJobKind.CONFIG_ROLLBACK)
            and job.status == AdminJobStatus.DONE
            else None
        ),
        "checked": (
            result
            if job.kind == AdminJobKind.CONFIG_CHECK and job.status == AdminJobStatus.DONE
            else None
        ),
        "check": result if job.kind == AdminJobKind.DRAFT_REPLAY else None,
        "draft_id": (
            job.params.get("draft_id")
            if job.kind in (*CONFIG_KINDS, AdminJobKind.DRAFT_REPLAY)
            else None
        ),
        "version_url": _version_url(result) if job.status == AdminJobStatus.DONE else None,
        "errors": result.get("errors", []),
        "more_errors": max(0, result.get("error_count", 0) - len(result.get("errors", []))),
    }
    return TemplateResponse(request, "admin/routing/adminjob/progress.html", context)
