"""The configuration API (docs/api.md, "Configuration"): the published configuration and its
versions, drafts of the whole configuration, their checks, diff, publish and rollback.

Scopes: ``read`` for reading the configuration, its versions and drafts; ``draft`` to create and
change drafts and to validate, test and diff them; ``publish`` to publish and roll back (users:
``routing.view_configdraft``, ``routing.change_configdraft``, ``routing.add_configsnapshot``).
Each view: authenticate, check the body, one service call (``routing.drafts.services``), answer.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import ApiError
from leads.api import _error_responses as _errors
from routing.config_api.auth import HasScope, request_actor
from routing.config_api.jobs_api import JOB_SCHEMA, accepted
from routing.config_api.parsing import BODY_LIMITS, ConfigCSVParser, ConfigJSONParser
from routing.drafts import services
from routing.drafts.documents import (
    REFUSALS,
    changes_document,
    check_document,
    refusal_of,
    version_document,
)
from routing.drafts.jobs import (
    config_job_start_check,
    config_job_start_publish,
    config_job_start_rollback,
)
from routing.drafts.models import ConfigDraft, ConfigSnapshot, ConfigSnapshotKind
from routing.drafts.snapshots import (
    config_snapshot_latest,
    configuration_document,
    document_digest,
)
from routing.models import RuleSet
from routing.tables_io import TableErrors

_INT_MAX = 2**31 - 1

DOCUMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A whole configuration in the rules-as-code format (rules-format.md): "
    "sources, reps, teams, holiday_calendars, territories, accounts, value_lists, ruleset, "
    "test_cases. A rep's live state (active, out_of_office_until, absences) and source tokens "
    "are not part of it.",
    "additionalProperties": True,
}
_ROW_CHANGE = {
    "type": "object",
    "properties": {
        "section": {"type": "string"},
        "key": {"type": "string"},
        "change": {"type": "string", "enum": ["added", "removed", "changed"]},
        "fields": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "before": {}, "after": {}},
            },
        },
        "words": {"type": "string", "description": "The change in words."},
    },
    "required": ["section", "key", "change", "fields", "words"],
}
VERSION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "number": {"type": "integer"},
        "kind": {"type": "string", "enum": [kind.value for kind in ConfigSnapshotKind]},
        "ruleset_version": {"type": "integer"},
        "published_at": {"type": "string", "format": "date-time"},
        "published_by": {"type": "string"},
        "note": {"type": "string"},
        "rolled_back_to": {"type": "integer", "nullable": True},
        "failing_test_cases": {"type": "array", "items": {"type": "string"}},
        "document": DOCUMENT_SCHEMA,
    },
    "required": ["number", "kind", "ruleset_version", "published_at", "published_by"],
}
_VERSION_LIST: dict[str, Any] = {
    "type": "object",
    "properties": {
        "count": {"type": "integer"},
        "next": {"type": "string", "nullable": True},
        "previous": {"type": "string", "nullable": True},
        "results": {"type": "array", "items": VERSION_SCHEMA},
    },
    "required": ["count", "results"],
}
PUBLISHED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "version": {"type": "integer", "nullable": True, "description": "Latest version."},
        "ruleset_version": {"type": "integer"},
        "live_edits": {
            "type": "boolean",
            "description": "The tables differ from the latest version (changed in the admin).",
        },
        "document": DOCUMENT_SCHEMA,
    },
    "required": ["version", "ruleset_version", "live_edits", "document"],
}
DRAFT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "status": {"type": "string", "enum": ["open", "published", "discarded"]},
        "note": {"type": "string"},
        "base_version": {"type": "integer", "nullable": True},
        "published_version": {"type": "integer", "nullable": True},
        "created_by": {"type": "string"},
        "created_at": {"type": "string", "format": "date-time"},
        "updated_at": {"type": "string", "format": "date-time"},
        "document": DOCUMENT_SCHEMA,
    },
    "required": ["id", "status", "base_version", "created_by"],
}
_DRAFT_LIST: dict[str, Any] = {
    "type": "object",
    "properties": {
        **_VERSION_LIST["properties"],
        "results": {"type": "array", "items": DRAFT_SCHEMA},
    },
    "required": ["count", "results"],
}
_NOTE = {"type": "string", "maxLength": 200}
_CREATE_INPUT = {"type": "object", "properties": {"note": _NOTE}, "additionalProperties": False}
_PUBLISH_INPUT = {
    "type": "object",
    "properties": {
        "force": {
            "type": "boolean",
            "description": "Publish although saved test cases fail (audited). Default false.",
        },
        "note": _NOTE,
    },
    "additionalProperties": False,
}
_TEST_INPUT = {
    "type": "object",
    "properties": {
        "leads": {
            "type": "integer",
            "minimum": 0,
            "description": "How many of the last processed leads to decide again (default "
            "500, at most REPLAY_MAX_LEADS; more than REPLAY_SYNC_MAX_LEADS run as a job).",
        }
    },
    "additionalProperties": False,
}
_PATCH_INPUT = {
    "type": "object",
    "description": "{section: {natural key: entry or null}}: each entry is set whole (added or "
    "replaced), null removes the row. Sections: " + ", ".join(services.PATCH_SECTIONS) + " "
    "(rules: the ruleset's, by name).",
    "additionalProperties": {
        "type": "object",
        "additionalProperties": {"type": "object", "nullable": True},
    },
}
_DIFF_SCHEMA = {
    "type": "object",
    "properties": {
        "stale": {"type": "boolean"},
        "changes": {"type": "array", "items": _ROW_CHANGE},
        "published_since": {"type": "array", "items": _ROW_CHANGE},
    },
    "required": ["stale", "changes", "published_since"],
}
_VALIDATE_SCHEMA = {
    "type": "object",
    "properties": {
        "valid": {"type": "boolean"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "required": ["valid", "errors"],
}
_OUTCOME = {"type": "object", "additionalProperties": True}
_TEST_SCHEMA = {
    "type": "object",
    "properties": {
        "test_cases": {"type": "array", "items": {"type": "object"}},
        "failing": {"type": "integer"},
        "replay": {"type": "object", "nullable": True},
    },
    "required": ["test_cases", "failing"],
}
_ID = OpenApiParameter("draft_id", int, OpenApiParameter.PATH, description="The draft's id.")
_NUMBER = OpenApiParameter("number", int, OpenApiParameter.PATH, description="Version number.")


def draft_document(draft: ConfigDraft, *, whole: bool = True) -> dict[str, Any]:
    """A draft as the API shows it."""
    data: dict[str, Any] = {
        "id": draft.pk,
        "status": draft.status,
        "note": draft.note,
        "base_version": draft.base_number,
        "published_version": draft.published_as.number if draft.published_as else None,
        "created_by": draft.created_by,
        "created_at": draft.created_at,
        "updated_at": draft.updated_at,
    }
    if whole:
        data["document"] = draft.document
    return data


def _body(request: Request, allowed: dict[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """An optional JSON object body with only ``allowed`` keys of the given types."""
    data = request.data
    if hasattr(data, "getlist") and not data:  # no body at all
        data = {}
    if not isinstance(data, dict):
        raise ApiError(code="invalid_body", message="The body must be a JSON object.")
    fields: dict[str, list[str]] = {}
    for key, value in data.items():
        kind = allowed.get(key)
        if kind is None:
            fields[key] = [f'unknown key "{key}"']
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            fields[key] = ["has the wrong type"]
    note = data.get("note")
    if isinstance(note, str) and len(note) > 200:
        fields["note"] = ["must be at most 200 characters"]
    if fields:
        raise ApiError(code="invalid_body", message="The request is invalid.", fields=fields)
    return data


def _refused(exc: Exception) -> ApiError:
    """A service's refusal in the API's error shape."""
    refusal = refusal_of(exc)
    return ApiError(
        code=refusal.code,
        message=refusal.message,
        status_code=refusal.status,
        fields=refusal.fields,
    )


_REFUSALS = REFUSALS


class _ConfigView(APIView):
    accepts_api_tokens = True  # routing.config_api.auth: scoped tokens are taken here
    parser_classes = [ConfigJSONParser]
    scope = "read"
    user_perm = "routing.view_configdraft"

    def get_permissions(self) -> list[BasePermission]:
        return [HasScope(self.scope, user_perm=self.user_perm)]


class _DraftScoped(_ConfigView):
    scope = "draft"
    user_perm = "routing.change_configdraft"


class _PublishScoped(_ConfigView):
    scope = "publish"
    user_perm = "routing.add_configsnapshot"


def _draft_or_404(draft_id: int) -> ConfigDraft:
    draft = (
        ConfigDraft.objects.select_related("published_as").filter(pk=draft_id).first()
        if draft_id <= _INT_MAX
        else None
    )
    if draft is None:
        raise ApiError(code="not_found", message="No such draft.", status_code=404)
    return draft


class PublishedConfigView(_ConfigView):
    """The published configuration, whole."""

    @extend_schema(
        operation_id="config_read",
        tags=["configuration"],
        responses={200: OpenApiResponse(PUBLISHED_SCHEMA), **_errors(401, 403, 404)},
    )
    def get(self, request: Request) -> Response:
        try:
            document = configuration_document()
        except RuleSet.DoesNotExist:
            raise ApiError(
                code="not_found", message="No configuration is published.", status_code=404
            ) from None
        latest = config_snapshot_latest()
        return Response(
            {
                "version": latest.number if latest else None,
                "ruleset_version": RuleSet.objects.filter(status="published")
                .values_list("version", flat=True)
                .first(),
                "live_edits": latest is not None and latest.digest != document_digest(document),
                "document": document,
            }
        )


class VersionListView(_ConfigView):
    """Every published version of the configuration, newest first."""

    @extend_schema(
        operation_id="config_versions_list",
        tags=["configuration"],
        parameters=[OpenApiParameter("page", int, description="Page number (50 a page).")],
        responses={200: OpenApiResponse(_VERSION_LIST), **_errors(401, 403, 404)},
    )
    def get(self, request: Request) -> Response:
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(
            ConfigSnapshot.objects.order_by("-number").defer("document"), request, self
        )
        return paginator.get_paginated_response(
            [version_document(s, whole=False) for s in page or []]
        )


class VersionDetailView(_ConfigView):
    """One version, with its whole configuration."""

    @extend_schema(
        operation_id="config_versions_read",
        tags=["configuration"],
        parameters=[_NUMBER],
        responses={200: OpenApiResponse(VERSION_SCHEMA), **_errors(401, 403, 404)},
    )
    def get(self, request: Request, number: int) -> Response:
        snapshot = (
            ConfigSnapshot.objects.filter(number=number).first() if number <= _INT_MAX else None
        )
        if snapshot is None:
            raise ApiError(code="not_found", message="No such version.", status_code=404)
        return Response(version_document(snapshot))


class VersionRollbackView(_PublishScoped):
    """Publish an earlier version again, as a new version: a background job."""

    @extend_schema(
        operation_id="config_versions_rollback",
        tags=["configuration"],
        parameters=[_NUMBER],
        description="Always 202 Accepted with a job document (Location: the job's URL): a "
        "worker rolls back. The saved test cases of that version run against it; a failure "
        "refuses unless force. All or nothing. The job ends done with the publish document "
        "as its result, or failed with the error the call would have answered "
        "(configuration_busy, test_cases_failing, invalid_document, prune_refused). 404 when "
        "there is no such version; nothing is queued then.",
        request={"application/json": _PUBLISH_INPUT},
        responses={
            202: OpenApiResponse(JOB_SCHEMA),
            **_errors(400, 401, 403, 404, 415),
        },
    )
    def post(self, request: Request, number: int) -> Response:
        body = _body(request, {"force": bool, "note": str})
        if number > _INT_MAX:
            raise ApiError(code="not_found", message="No such version.", status_code=404)
        try:
            job = config_job_start_rollback(
                number=number,
                actor=request_actor(request),
                user=_user(request),
                force=body.get("force", False),
                note=body.get("note", ""),
                show_tokens=True,
            )
        except _REFUSALS as exc:
            raise _refused(exc) from None
        return accepted(job)


def _user(request: Request) -> Any:
    user = request.user
    return user if user is not None and user.is_authenticated else None


class DraftListView(_ConfigView):
    """Drafts, newest first; and beginning one from the published configuration."""

    def get_permissions(self) -> list[BasePermission]:
        if self.request.method == "POST":
            return [HasScope("draft", user_perm="routing.change_configdraft")]
        return super().get_permissions()

    @extend_schema(
        operation_id="config_drafts_list",
        tags=["configuration"],
        parameters=[OpenApiParameter("page", int, description="Page number (50 a page).")],
        responses={200: OpenApiResponse(_DRAFT_LIST), **_errors(401, 403, 404)},
    )
    def get(self, request: Request) -> Response:
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(
            ConfigDraft.objects.select_related("published_as")
            .defer("document", "base_document", "published_as__document")
            .order_by("-id"),
            request,
            self,
        )
        return paginator.get_paginated_response(
            [draft_document(d, whole=False) for d in page or []]
        )

    @extend_schema(
        operation_id="config_drafts_create",
        tags=["configuration"],
        request={"application/json": _CREATE_INPUT},
        responses={201: OpenApiResponse(DRAFT_SCHEMA), **_errors(400, 401, 403, 409, 415)},
    )
    def post(self, request: Request) -> Response:
        body = _body(request, {"note": str})
        try:
            draft = services.config_draft_create(
                actor=request_actor(request), note=body.get("note", "")
            )
        except _REFUSALS as exc:
            raise _refused(exc) from None
        return Response(draft_document(draft), status=201)


class DraftDetailView(_ConfigView):
    """One draft: read it, replace its document (PUT), change rows (PATCH), discard (DELETE)."""

    def get_permissions(self) -> list[BasePermission]:
        if self.request.method in ("PUT", "PATCH", "DELETE"):
            return [HasScope("draft", user_perm="routing.change_configdraft")]
        return super().get_permissions()

    @extend_schema(
        operation_id="config_drafts_read",
        tags=["configuration"],
        parameters=[_ID],
        responses={200: OpenApiResponse(DRAFT_SCHEMA), **_errors(401, 403, 404)},
    )
    def get(self, request: Request, draft_id: int) -> Response:
        return Response(draft_document(_draft_or_404(draft_id)))

    @extend_schema(
        operation_id="config_drafts_replace",
        tags=["configuration"],
        parameters=[_ID],
        description="Replace the whole document; refused with every error's path when invalid. "
        + BODY_LIMITS,
        request={"application/json": DOCUMENT_SCHEMA},
        responses={
            200: OpenApiResponse(DRAFT_SCHEMA),
            **_errors(400, 401, 403, 404, 409, 413, 415),
        },
    )
    def put(self, request: Request, draft_id: int) -> Response:
        draft = _draft_or_404(draft_id)
        try:
            draft = services.config_draft_replace(
                draft_id=draft.pk, document=request.data, actor=request_actor(request)
            )
        except _REFUSALS as exc:
            raise _refused(exc) from None
        return Response(draft_document(draft))

    @extend_schema(
        operation_id="config_drafts_patch",
        tags=["configuration"],
        parameters=[_ID],
        request={"application/json": _PATCH_INPUT},
        responses={200: OpenApiResponse(DRAFT_SCHEMA), **_errors(400, 401, 403, 404, 409, 415)},
    )
    def patch(self, request: Request, draft_id: int) -> Response:
        draft = _draft_or_404(draft_id)
        try:
            draft = services.config_draft_patch(
                draft_id=draft.pk, changes=request.data, actor=request_actor(request)
            )
        except _REFUSALS as exc:
            raise _refused(exc) from None
        return Response(draft_document(draft))

    @extend_schema(
        operation_id="config_drafts_discard",
        tags=["configuration"],
        parameters=[_ID],
        request=None,
        responses={200: OpenApiResponse(DRAFT_SCHEMA), **_errors(401, 403, 404, 409)},
    )
    def delete(self, request: Request, draft_id: int) -> Response:
        draft = _draft_or_404(draft_id)
        try:
            draft = services.config_draft_discard(draft_id=draft.pk, actor=request_actor(request))
        except _REFUSALS as exc:
            raise _refused(exc) from None
        return Response(draft_document(draft))


class DraftValidateView(_DraftScoped):
    """Every problem of the draft, with its path."""

    @extend_schema(
        operation_id="config_drafts_validate",
        tags=["configuration"],
        parameters=[_ID],
        request=None,
        responses={200: OpenApiResponse(_VALIDATE_SCHEMA), **_errors(401, 403, 404)},
    )
    def post(self, request: Request, draft_id: int) -> Response:
        errors = services.draft_errors(draft=_draft_or_404(draft_id))
        return Response(
            {
                "valid": not errors,
                "errors": [{"path": e.path, "message": e.message} for e in errors],
            }
        )


class DraftTestView(_DraftScoped):
    """The draft's test cases against its whole configuration, and a replay of recent leads."""

    @extend_schema(
        operation_id="config_drafts_test",
        tags=["configuration"],
        parameters=[_ID],
        description="Up to REPLAY_SYNC_MAX_LEADS (500) leads it answers 200 with the test "
        "document; more (up to REPLAY_MAX_LEADS) answer 202 Accepted with a job document "
        "(Location: the job's URL) whose result, once done, is that test document.",
        request={"application/json": _TEST_INPUT},
        responses={
            200: OpenApiResponse(_TEST_SCHEMA),
            202: OpenApiResponse(JOB_SCHEMA),
            **_errors(400, 401, 403, 404, 409, 415),
        },
    )
    def post(self, request: Request, draft_id: int) -> Response:
        body = _body(request, {"leads": int})
        leads = body.get("leads", 500)
        if leads < 0:
            raise ApiError(
                code="invalid_body", message="The request is invalid.", fields={"leads": ["≥ 0"]}
            )
        draft = _draft_or_404(draft_id)
        leads = min(leads, settings.REPLAY_MAX_LEADS)
        if leads > settings.REPLAY_SYNC_MAX_LEADS:
            job = config_job_start_check(
                draft_id=draft.pk, leads=leads, actor=request_actor(request), user=_user(request)
            )
            return accepted(job)
        try:
            check = services.draft_check(draft=draft, leads=leads)
        except _REFUSALS as exc:
            raise _refused(exc) from None
        return Response(check_document(check))


class DraftDiffView(_DraftScoped):
    """What publishing the draft would change, row by row in words."""

    @extend_schema(
        operation_id="config_drafts_diff",
        tags=["configuration"],
        parameters=[_ID],
        responses={200: OpenApiResponse(_DIFF_SCHEMA), **_errors(401, 403, 404, 409)},
    )
    def get(self, request: Request, draft_id: int) -> Response:
        draft = _draft_or_404(draft_id)
        try:
            diff = services.draft_diff(draft=draft)
        except RuleSet.DoesNotExist:
            raise ApiError(
                code="nothing_published", message="No configuration is published.", status_code=409
            ) from None
        return Response(
            {
                "stale": diff.stale,
                "changes": changes_document(diff.changes),
                "published_since": changes_document(diff.stale_changes),
            }
        )


_TABLE_INPUT = {
    "type": "object",
    "properties": {
        "table": {"type": "string", "enum": ["territories", "accounts"]},
        "csv": {
            "type": "string",
            "description": "The CSV file's text, in the format of the admin's CSV import "
            "(docs/revops.md, 'Territories and accounts as CSV').",
        },
        "delete_missing": {
            "type": "boolean",
            "description": "Remove the draft's rows the file does not name. Default false.",
        },
    },
    "required": ["table", "csv"],
    "additionalProperties": False,
}
_TABLE_RESULT = {
    "type": "object",
    "properties": {
        "draft": DRAFT_SCHEMA,
        "rows": {"type": "integer"},
        "set": {"type": "integer"},
        "removed": {"type": "integer"},
    },
    "required": ["draft", "rows", "set", "removed"],
}


_TABLE_KEYS: dict[str, type | tuple[type, ...]] = {
    "table": str,
    "csv": str,
    "delete_missing": bool,
}
_TABLE_QUERY = [
    OpenApiParameter(
        "table",
        str,
        OpenApiParameter.QUERY,
        enum=["territories", "accounts"],
        description="With a text/csv body: the table the file is for.",
    ),
    OpenApiParameter(
        "delete_missing",
        bool,
        OpenApiParameter.QUERY,
        description="With a text/csv body: remove the draft's rows the file does not name.",
    ),
]


def _is_csv(request: Request) -> bool:
    """A ``text/csv`` body (a JSON body that is a string is not a CSV file)."""
    media = (request.content_type or "").split(";")[0].strip().lower()
    return media == ConfigCSVParser.media_type and isinstance(request.data, str)


def _csv_body(request: Request) -> dict[str, Any]:
    """A ``text/csv`` body: the file itself, ``table`` and ``delete_missing`` in the query."""
    fields: dict[str, list[str]] = {}
    unknown = sorted(set(request.query_params) - {"table", "delete_missing"})
    for key in unknown:
        fields[key[:100]] = [f'unknown query parameter "{key[:100]}"']
    flag = request.query_params.get("delete_missing", "false").lower()
    if flag not in ("true", "false", "1", "0"):
        fields["delete_missing"] = ["true or false"]
    if fields:
        raise ApiError(code="invalid_body", message="The request is invalid.", fields=fields)
    body: dict[str, Any] = {"csv": request.data, "delete_missing": flag in ("true", "1")}
    if "table" in request.query_params:
        body["table"] = request.query_params["table"]
    return body


class DraftTableImportView(_DraftScoped):
    """A territories or accounts CSV into the draft, with the CSV import's row-precise errors."""

    parser_classes = [ConfigJSONParser, ConfigCSVParser]

    @extend_schema(
        operation_id="config_drafts_import_table",
        tags=["configuration"],
        description="400 invalid_csv lists every problem as 'row 17, column team: ...'; "
        "400 invalid_document when the draft it would make is invalid. Nothing is written then. "
        "The CSV comes as the csv string of a JSON body, or as a text/csv body (UTF-8) with "
        "?table= and ?delete_missing= in the query. " + BODY_LIMITS,
        parameters=[_ID, *_TABLE_QUERY],
        request={
            "application/json": _TABLE_INPUT,
            "text/csv": {"type": "string", "description": "The CSV file (UTF-8)."},
        },
        responses={
            200: OpenApiResponse(_TABLE_RESULT),
            **_errors(400, 401, 403, 404, 409, 413, 415),
        },
    )
    def post(self, request: Request, draft_id: int) -> Response:
        body = _csv_body(request) if _is_csv(request) else _body(request, _TABLE_KEYS)
        table = body.get("table")
        if table not in ("territories", "accounts") or "csv" not in body:
            raise ApiError(
                code="invalid_body",
                message="The request is invalid.",
                fields={
                    "table" if table not in ("territories", "accounts") else "csv": [
                        "territories or accounts, and the csv text, are required"
                    ]
                },
            )
        draft = _draft_or_404(draft_id)
        try:
            done = services.config_draft_import_table(
                draft_id=draft.pk,
                table=table,
                content=body["csv"],
                delete_missing=body.get("delete_missing", False),
                actor=request_actor(request),
            )
        except TableErrors as exc:
            more = [f"... and {exc.more} more"] if exc.more else []
            raise ApiError(
                code="invalid_csv",
                message=f"{exc.count} problem(s) in the file; nothing was written.",
                fields={"csv": [*exc.errors, *more]},
            ) from None
        except _REFUSALS as exc:
            raise _refused(exc) from None
        return Response(
            {
                "draft": draft_document(done.draft, whole=False),
                "rows": done.rows,
                "set": done.set,
                "removed": done.removed,
            }
        )


class DraftRebaseView(_DraftScoped):
    """Begin a stale draft again from the published configuration, its changes applied."""

    @extend_schema(
        operation_id="config_drafts_rebase",
        tags=["configuration"],
        parameters=[_ID],
        description="The draft's own changes (row by row, by natural key) applied to the "
        "published configuration now. 409 rebase_conflict when a row was changed on both "
        "sides; 400 when the result is invalid. A draft that is not stale is unchanged.",
        request=None,
        responses={200: OpenApiResponse(DRAFT_SCHEMA), **_errors(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, draft_id: int) -> Response:
        draft = _draft_or_404(draft_id)
        try:
            draft = services.config_draft_rebase(draft_id=draft.pk, actor=request_actor(request))
        except _REFUSALS as exc:
            raise _refused(exc) from None
        return Response(draft_document(draft))


class DraftPublishView(_PublishScoped):
    """Publish the draft as the next version, all or nothing: a background job."""

    @extend_schema(
        operation_id="config_drafts_publish",
        tags=["configuration"],
        parameters=[_ID],
        description="Always 202 Accepted with a job document (Location: the job's URL): a "
        "worker publishes the draft as it was when asked. The job ends done with the publish "
        "document as its result, or failed, nothing written, with the error the call would "
        "have answered: configuration_busy (another import or publish under way), draft_stale "
        "(the published configuration changed since the draft began), draft_changed (the "
        "draft was changed after the publish was asked for), prune_refused, invalid_document, "
        "test_cases_failing (unless force). 404 for no such draft, 409 draft_closed for one "
        "published or discarded; nothing is queued then.",
        request={"application/json": _PUBLISH_INPUT},
        responses={
            202: OpenApiResponse(JOB_SCHEMA),
            **_errors(400, 401, 403, 404, 409, 415),
        },
    )
    def post(self, request: Request, draft_id: int) -> Response:
        body = _body(request, {"force": bool, "note": str})
        draft = _draft_or_404(draft_id)
        try:
            job = config_job_start_publish(
                draft_id=draft.pk,
                actor=request_actor(request),
                user=_user(request),
                force=body.get("force", False),
                note=body.get("note", ""),
                show_tokens=True,
            )
        except _REFUSALS as exc:
            raise _refused(exc) from None
        return accepted(job)
