"""The configuration API's background jobs (docs/api.md, "Jobs"): a publish, a rollback, or a
test of more than ``REPLAY_SYNC_MAX_LEADS`` leads answers ``202 Accepted`` with a job document
and its URL (``Location``); ``GET /api/v1/config/jobs/<id>/`` tells its status and progress,
then its result (what the call answered when it ran in the request) or its error (the API's
error object). A worker runs it (``routing.drafts.jobs``).

Who may read a job: a token with the ``read`` scope, or with the scope that started it
(``publish`` for a publish or rollback, ``draft`` for a test), each with its owner's
permission as everywhere in this API. New sources' tokens a publish made are shown once, to a
caller with the ``publish`` scope, then removed from the job.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import ApiError
from leads.api import _error_responses as _errors
from routing.config_api.auth import HasScope
from routing.drafts.jobs import SEALED_TOKENS, config_job_tokens_take
from routing.models import AdminJob, AdminJobKind, AdminJobStatus

_INT_MAX = 2**31 - 1

KINDS = {
    AdminJobKind.CONFIG_PUBLISH: "publish",
    AdminJobKind.CONFIG_ROLLBACK: "rollback",
    AdminJobKind.CONFIG_CHECK: "test",
}
_PUBLISH = ("publish", "routing.add_configsnapshot")
_STARTED_WITH = {  # the scope (and its owner's permission) that starts a job of each kind
    AdminJobKind.CONFIG_PUBLISH: _PUBLISH,
    AdminJobKind.CONFIG_ROLLBACK: _PUBLISH,
    AdminJobKind.CONFIG_CHECK: ("draft", "routing.change_configdraft"),
}


def _read() -> HasScope:
    return HasScope("read", user_perm="routing.view_configdraft")


def _started_with(kind: str) -> HasScope:
    scope, perm = _STARTED_WITH[AdminJobKind(kind)]
    return HasScope(scope, user_perm=perm)


JOB_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A publish, rollback or test run by a worker. Poll its url until status is "
    "done (result) or failed (error).",
    "properties": {
        "id": {"type": "integer"},
        "url": {"type": "string", "description": "Where to poll it (also the Location header)."},
        "kind": {"type": "string", "enum": list(KINDS.values())},
        "status": {"type": "string", "enum": [status.value for status in AdminJobStatus]},
        "phase": {"type": "string", "description": "What it is doing, while it runs."},
        "progress": {
            "type": "object",
            "properties": {
                "done": {"type": "integer"},
                "total": {"type": "integer"},
                "percent": {"type": "integer"},
            },
            "required": ["done", "total", "percent"],
        },
        "stalled": {
            "type": "boolean",
            "description": "Queued or running, but no worker reported on it for "
            "ADMIN_JOB_STALE_SECONDS: the worker stopped, or none drains the maintenance queue.",
        },
        "draft": {"type": "integer", "nullable": True, "description": "The draft asked for."},
        "version": {
            "type": "integer",
            "nullable": True,
            "description": "The version a rollback was asked for.",
        },
        "created_at": {"type": "string", "format": "date-time"},
        "started_at": {"type": "string", "format": "date-time", "nullable": True},
        "finished_at": {"type": "string", "format": "date-time", "nullable": True},
        "result": {
            "type": "object",
            "nullable": True,
            "description": "Once done: what the call answers when it runs in the request (the "
            "publish document: version, changes, failing_test_cases, source_tokens; or the "
            "test document).",
            "additionalProperties": True,
        },
        "error": {
            "type": "object",
            "nullable": True,
            "description": "Once failed: the API's error object, as the call would have "
            "answered it (e.g. configuration_busy, draft_stale, draft_changed, "
            "test_cases_failing with each failing case in fields, invalid_document); "
            "job_failed when the worker broke or ran out of time.",
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "fields": {"type": "object", "additionalProperties": True},
            },
            "required": ["code", "message"],
        },
    },
    "required": ["id", "url", "kind", "status", "progress", "stalled", "result", "error"],
}
_JOB_ID = OpenApiParameter("job_id", int, OpenApiParameter.PATH, description="The job's id.")


def job_url(job: AdminJob) -> str:
    return f"/api/v1/config/jobs/{job.pk}/"


def job_document(job: AdminJob, *, source_tokens: dict[str, str] | None = None) -> dict[str, Any]:
    """A configuration job as the API shows it."""
    stored = job.result if isinstance(job.result, dict) else {}
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    if job.status == AdminJobStatus.DONE:
        result = {key: value for key, value in stored.items() if key != SEALED_TOKENS}
        if "source_tokens" in result:
            result["source_tokens"] = source_tokens or {}
    elif job.status == AdminJobStatus.FAILED:
        error = stored.get("error") or {
            "code": "job_failed",
            "message": job.error or "The job failed.",
        }
    return {
        "id": job.pk,
        "url": job_url(job),
        "kind": KINDS[AdminJobKind(job.kind)],
        "status": job.status,
        "phase": job.phase,
        "progress": {
            "done": job.progress_done,
            "total": job.progress_total,
            "percent": job.percent,
        },
        "stalled": job.stalled,
        "draft": job.params.get("draft_id"),
        "version": job.params.get("number"),
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "result": result,
        "error": error,
    }


def accepted(job: AdminJob) -> Response:
    """``202 Accepted``: the job as queued, and where to watch it."""
    return Response(job_document(job), status=202, headers={"Location": job_url(job)})


class _AnyConfigScope(BasePermission):
    """``read``, or a scope that starts jobs; which job it may read is checked on the job."""

    message = 'This needs the "read" scope, or the scope that started the job.'

    def has_permission(self, request: Request, view: Any) -> bool:
        if any(_started_with(kind).has_permission(request, view) for kind in _STARTED_WITH):
            return True
        read = _read()
        if read.has_permission(request, view):
            return True
        self.message = read.message
        return False


class ConfigJobView(APIView):
    """One background job of the configuration API: its progress, then its result or error."""

    accepts_api_tokens = True  # routing.config_api.auth

    def get_permissions(self) -> list[BasePermission]:
        return [_AnyConfigScope()]

    @extend_schema(
        operation_id="config_jobs_read",
        tags=["configuration"],
        parameters=[_JOB_ID],
        description="A publish or rollback job is read with read or publish; a test job "
        "(lead-by-lead decisions) with draft only, as the test itself. New sources' tokens of a "
        "publish are shown once, to a publish token of the user who asked for it.",
        responses={200: OpenApiResponse(JOB_SCHEMA), **_errors(401, 403, 404)},
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = (
            AdminJob.objects.filter(pk=job_id, kind__in=list(KINDS)).first()
            if job_id <= _INT_MAX
            else None
        )
        if job is None:
            raise ApiError(code="not_found", message="No such job.", status_code=404)
        starter = _started_with(job.kind)
        may_start = starter.has_permission(request, self)
        # A test's result is lead-by-lead decisions, which the synchronous test gives only to
        # the draft scope: so does its job. A publish's or rollback's is what read may see.
        readable = job.kind != AdminJobKind.CONFIG_CHECK and _read().has_permission(request, self)
        if not (may_start or readable):
            raise ApiError(code="forbidden", message=starter.message, status_code=403)
        tokens: dict[str, str] | None = None
        if (
            may_start
            and starter.scope == "publish"
            and job.requested_by_id is not None
            and job.requested_by_id == getattr(request.user, "pk", None)  # shown to who asked
            and job.status == AdminJobStatus.DONE
            and SEALED_TOKENS in (job.result or {})
        ):
            tokens = config_job_tokens_take(job_id=job.pk)
        return Response(job_document(job, source_tokens=tokens))
