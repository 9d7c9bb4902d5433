"""The intake (kickoff) and lead endpoints of api.md: thin views calling one service each."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import BaseParser
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import error_body
from leads import selectors
from leads.inbox import refused_record, refused_record_batch
from leads.intake import (
    batch_records_read,
    inbound_of,
    intake_limits,
    read_by_kind,
    records_read,
    vendor_signature_check,
)
from leads.models import Lane, LeadStatus, Source
from leads.parsing import (
    IntakeError,
    Limits,
)
from leads.services import Accepted, lead_ingest, lead_ingest_batch
from leads.source_auth import check_rate_limit, check_signature, check_token
from leads.sources import kind_get
from leads.sources.base import Reply
from leads.status import StatusLink, status_link_make

# --- Schema helpers --------------------------------------------------------------------------

_TEXT = {"type": "string", "minLength": 1, "maxLength": 1000, "pattern": "\\S"}
LEAD_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A lead as the source sends it, in the shape of the source's kind (the tool: "
    "HubSpot, Typeform, ...; see docs/api.md). Keys are matched to canonical fields by the kind, "
    "the source's field map (keys or paths such as `payload.data.Email`) and built-in aliases "
    "(e.g. 'Email Address', 'zip'); unknown keys are kept in `custom`. It is a lead when it has "
    "an e-mail, a phone, or a company and a name; what is refused is kept in the refused inbox.",
    "properties": {
        "email": _TEXT,
        "phone": _TEXT,
        "company": _TEXT,
        "first_name": _TEXT,
        "last_name": _TEXT,
        "country": {"type": "string"},
        "external_id": {"type": "string", "description": "Idempotency key if no header."},
    },
    "additionalProperties": True,
    "anyOf": [
        {"required": ["email"]},
        {"required": ["phone"]},
        {"required": ["company", "first_name"]},
        {"required": ["company", "last_name"]},
    ],
}

ErrorSerializer = inline_serializer(
    "Error",
    {
        "error": inline_serializer(
            "ErrorDetail",
            {
                "code": serializers.CharField(),
                "message": serializers.CharField(),
                "fields": serializers.DictField(
                    child=serializers.ListField(child=serializers.CharField()), required=False
                ),
            },
        )
    },
)
AcceptedSerializer = inline_serializer(
    "IntakeAccepted",
    {
        "id": serializers.UUIDField(),
        "status": serializers.ChoiceField(choices=["received"]),
        "url": serializers.CharField(),
        "status_url": serializers.CharField(
            help_text="The lead's status URL (also in Location): signed, expiring, for the "
            "browser that submitted the lead; no other credential (docs/api.md)."
        ),
    },
)
BatchSerializer = inline_serializer(
    "IntakeBatchAccepted",
    {
        "accepted": serializers.IntegerField(),
        "rejected": serializers.IntegerField(),
        "results": serializers.ListField(child=serializers.DictField()),
    },
)


def _error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    return {code: OpenApiResponse(ErrorSerializer) for code in codes}


# --- Intake ----------------------------------------------------------------------------------


def _limits() -> Limits:
    return intake_limits()


def _error_response(error: IntakeError) -> Response:
    return Response(
        error_body(error.code, error.message), status=error.status, headers=error.headers
    )


def _admit(request: HttpRequest, slug: str, *, max_bytes: int) -> Source:
    """Source and size checks: everything decided before the body is read."""
    source = selectors.source_for_intake(slug=slug)
    if source is None:
        raise IntakeError(404, "source_not_found", f"No active source {slug[:64]!r}.")
    length_header = request.META.get("CONTENT_LENGTH") or ""
    if not length_header:
        if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            _read_chunked_body(request, max_bytes)
    else:
        try:
            length = int(length_header)
        except ValueError:
            raise IntakeError(400, "invalid_body", "Content-Length is not a number.") from None
        if length > max_bytes:
            raise IntakeError(
                413, "body_too_large", f"The body is over the limit of {max_bytes} bytes."
            )
    return source


def _reply(reply: Reply) -> HttpResponse:
    return HttpResponse(reply.body, status=reply.status, content_type=reply.content_type)


def _json_error(error: IntakeError) -> HttpResponse:
    return _json_response(
        error_body(error.code, error.message), status=error.status, headers=error.headers
    )


def _handshake(request: HttpRequest, source: Source) -> HttpResponse | None:
    """The kind's answer to a vendor's verification request (a GET challenge), if this is one."""
    kind = kind_get(source.kind)
    if kind.handshake is None:
        return None
    try:
        body = request.body
    except RequestDataTooBig:
        raise IntakeError(413, "body_too_large", "The body is too large.") from None
    try:
        reply = kind.handshake(
            inbound_of(request, body),
            source.vendor_secret,
            source.kind_options if isinstance(source.kind_options, dict) else {},
        )
    except Exception:  # a handshake that cannot read the request is no handshake
        return None
    return _reply(reply) if reply is not None else None


def _authenticated_body(request: HttpRequest, source: Source) -> bytes:
    """The raw body, once its HMAC signature (where the source requires one) is verified.

    Verified before anything else looks at the body or the rate limit counts the request, so an
    unsigned sender learns nothing and cannot use up the source's limit.
    """
    try:
        body = request.body
    except RequestDataTooBig:
        raise IntakeError(413, "body_too_large", "The body is too large.") from None
    now = timezone.now()
    check_signature(request, source, body, now=now)
    if source.requires_vendor_signature:  # the request as the kind sees it, only when asked
        vendor_signature_check(source, inbound_of(request, body), now=now)
    return body


def _read_chunked_body(request: HttpRequest, max_bytes: int) -> None:
    """A chunked body (no Content-Length): read it, bounded, as if its length had been sent.

    The WSGI server de-chunks ``wsgi.input``; Django alone would see an empty body.
    """
    stream = request.META.get("wsgi.input")
    data = b""
    if stream is not None:
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = stream.read(min(65536, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    if len(data) > max_bytes:
        raise IntakeError(
            413, "body_too_large", f"The body is over the limit of {max_bytes} bytes."
        )
    request.META["CONTENT_LENGTH"] = str(len(data))
    request._body = data
    request._stream = io.BytesIO(data)


class IgnoreClientContentNegotiation(BaseContentNegotiation):
    """Always JSON, whatever ``Accept`` or ``?format=`` say (DRF docs' custom negotiation).

    A lead must not be refused because the sending tool asks for HTML or XML: DRF's default
    negotiation answers 406 (or 404 for an unknown ``format``) before the view runs.
    """

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> BaseParser | None:
        return next(iter(parsers), None)  # intake reads bodies itself (leads.parsing)

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        candidates = list(renderers)
        renderer = next((r for r in candidates if isinstance(r, JSONRenderer)), candidates[0])
        return renderer, renderer.media_type


def _accepted_body(lead_id: Any, link: StatusLink) -> dict[str, Any]:
    return {
        "id": str(lead_id),
        "status": "received",
        "url": f"/api/v1/leads/{lead_id}/",
        "status_url": link.url,
    }


def _allow_origin(request: HttpRequest, source: Source, response: HttpResponse) -> None:
    """CORS for the pages the source names: their script may read the 202 (a form post from
    such a page is a simple request, so no preflight reaches the intake)."""
    origin = request.META.get("HTTP_ORIGIN")
    if origin and source.cors_origins and origin in source.cors_origin_list:
        response["Access-Control-Allow-Origin"] = origin
        response["Vary"] = "Origin"


# What DRF's dispatch sets on every answer of the intake view (its allowed methods).
_INTAKE_ALLOW = "GET, POST, HEAD, OPTIONS"


def _json_response(
    data: dict[str, Any], *, status: int, headers: dict[str, str] | None = None
) -> HttpResponse:
    """``data`` as DRF's JSONRenderer writes it (compact, UTF-8, U+2028/U+2029 escaped), in a
    plain Django response: the intake's POST answers without DRF's Response and rendering."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    response = HttpResponse(text.encode("utf-8"), status=status, content_type="application/json")
    for name, value in (headers or {}).items():
        response[name] = value
    return response


class IntakeView(APIView):
    """POST one lead (JSON object, form-encoded or multipart) from a source."""

    # A POST is answered by a lean dispatch (``dispatch``), not DRF's: no Request wrapper,
    # content negotiation, authentication, permission or throttle classes (the intake has none
    # of them) and no Response rendering, for the same answers (status, JSON body, headers;
    # a database outage is the same 503, from config.errors' middleware). Every other method
    # goes through DRF as before. It stays an APIView for the OpenAPI schema.

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes: list[Any] = []
    parser_classes: list[Any] = []
    renderer_classes = [JSONRenderer]
    content_negotiation_class = IgnoreClientContentNegotiation

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.method != "POST":
            return super().dispatch(request, *args, **kwargs)
        self.args, self.kwargs, self.request = args, kwargs, request  # type: ignore[assignment]
        response = self._post(request, **kwargs)
        response["Allow"] = _INTAKE_ALLOW
        return response

    @extend_schema(
        operation_id="intake_create",
        summary="Submit one lead",
        description="Authenticate with `Authorization: Bearer <source token>` (or `?token=` where "
        "the source allows it) and/or `X-Signature: sha256=<hex HMAC of the body>`, or, in auth "
        "mode `vendor`, with the tool's own signature header. A kind whose tool requires its own "
        "success body answers with it instead (Salesforce's Outbound Message: 200 with the SOAP "
        "acknowledgement).",
        request={
            "application/json": LEAD_REQUEST_SCHEMA,
            "application/x-www-form-urlencoded": LEAD_REQUEST_SCHEMA,
            "multipart/form-data": LEAD_REQUEST_SCHEMA,
        },
        parameters=[
            OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False),
            OpenApiParameter("X-Signature", str, OpenApiParameter.HEADER, required=False),
        ],
        responses={
            202: OpenApiResponse(AcceptedSerializer, description="Accepted (or replayed)."),
            **_error_responses(400, 401, 404, 413, 415, 422, 429),
        },
        examples=[
            OpenApiExample(
                "A form lead",
                value={"Email Address": "ana@acme.com", "Company": "Acme", "Country": "Germany"},
                request_only=True,
            )
        ],
    )
    def post(self, request: Request, slug: str) -> HttpResponse:
        """Not called: ``dispatch`` answers a POST (``_post``); here for the schema."""
        return self._post(request._request, slug)

    def _post(self, django_request: HttpRequest, slug: str) -> HttpResponse:
        source: Source | None = None
        body = b""
        try:
            source = _admit(django_request, slug, max_bytes=settings.INTAKE_MAX_BODY_BYTES)
            handshake = _handshake(django_request, source)
            if handshake is not None:
                return handshake
            check_token(django_request, source, now=timezone.now())
            header_key = self._idempotency_key(django_request)
            body = _authenticated_body(django_request, source)
            check_rate_limit(source, now=timezone.now())
        except IntakeError as error:
            return _json_error(error)
        # Authenticated from here on: what is refused is kept in the refused inbox.
        try:
            records = records_read(source, django_request, body)
            if len(records) == 1:
                accepted = [
                    lead_ingest(source=source, record=records[0], idempotency_key=header_key)
                ]
            else:
                outcomes = lead_ingest_batch(source=source, records=records, limits=_limits())
                refused_record_batch(
                    source=source,
                    meta=django_request.META,
                    refusals=[
                        (index, records[index], outcome)
                        for index, outcome in enumerate(outcomes)
                        if isinstance(outcome, IntakeError)
                    ],
                )
                accepted = [outcome for outcome in outcomes if isinstance(outcome, Accepted)]
                if not accepted:  # each record is in the inbox already: not the body again
                    return _json_error(next(o for o in outcomes if isinstance(o, IntakeError)))
        except IntakeError as error:
            if len(body) <= settings.INTAKE_MAX_BODY_BYTES:
                refused_record(source=source, meta=django_request.META, body=body, error=error)
            return _json_error(error)
        kind = kind_get(source.kind)
        if kind.acknowledge is not None and read_by_kind(source, django_request):
            return _reply(kind.acknowledge([str(item.lead_id) for item in accepted]))
        first = accepted[0]
        # Counted from when the lead was received: a replay gets the first answer's URL.
        link = status_link_make(
            lead_id=first.lead_id, source=source, now=first.received_at or timezone.now()
        )
        headers = {"Location": link.url}
        if first.replayed:
            headers["Idempotent-Replayed"] = "true"
        response = _json_response(_accepted_body(first.lead_id, link), status=202, headers=headers)
        _allow_origin(django_request, source, response)
        return response

    @extend_schema(exclude=True)
    def get(self, request: Request, slug: str) -> Response | HttpResponse:
        """A vendor's verification request (Meta's hub.challenge, Mailchimp's ping)."""
        try:
            source = _admit(request._request, slug, max_bytes=settings.INTAKE_MAX_BODY_BYTES)
            handshake = _handshake(request._request, source)
        except IntakeError as error:
            return _error_response(error)
        if handshake is not None:
            return handshake
        return Response(
            error_body("method_not_allowed", "POST leads to this URL."),
            status=405,
            headers={"Allow": "POST"},
        )

    @staticmethod
    def _idempotency_key(request: HttpRequest) -> str | None:
        key = request.META.get("HTTP_IDEMPOTENCY_KEY")
        if key is None:
            return None
        key = key.strip()
        if not key or len(key) > 255 or not key.isprintable():
            raise IntakeError(
                400,
                "invalid_idempotency_key",
                "Idempotency-Key must be 1 to 255 printable characters.",
            )
        return key


class IntakeBatchView(APIView):
    """POST many leads: a JSON array, a CSV body, or a multipart CSV upload in field ``file``."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes: list[Any] = []
    parser_classes: list[Any] = []
    renderer_classes = [JSONRenderer]
    content_negotiation_class = IgnoreClientContentNegotiation

    @extend_schema(
        operation_id="intake_batch_create",
        summary="Submit a batch of leads",
        description="Same authentication as single intake. At most INTAKE_MAX_BATCH records.",
        request={
            "application/json": {"type": "array", "items": {"type": "object"}, "maxItems": 1000},
            "text/csv": OpenApiTypes.STR,
            "multipart/form-data": {
                "type": "object",
                "properties": {"file": {"type": "string", "format": "binary"}},
                "required": ["file"],
            },
        },
        parameters=[OpenApiParameter("X-Signature", str, OpenApiParameter.HEADER, required=False)],
        responses={
            202: OpenApiResponse(BatchSerializer),
            **_error_responses(400, 401, 404, 413, 415, 429),
        },
    )
    def post(self, request: Request, slug: str) -> Response:
        django_request = request._request
        try:
            source = _admit(django_request, slug, max_bytes=settings.INTAKE_MAX_BATCH_BODY_BYTES)
            check_token(django_request, source, now=timezone.now())
            body = _authenticated_body(django_request, source)
        except IntakeError as error:
            return _error_response(error)
        try:
            records = self._read(django_request, body)
            check_rate_limit(source, now=timezone.now(), records=len(records))
            outcomes = lead_ingest_batch(source=source, records=records, limits=_limits())
        except IntakeError as error:
            if len(body) <= settings.INTAKE_MAX_BODY_BYTES:
                refused_record(
                    source=source, meta=django_request.META, body=body, error=error, batch=True
                )
            return _error_response(error)
        refused_record_batch(
            source=source,
            meta=django_request.META,
            refusals=[
                (index, records[index], outcome)
                for index, outcome in enumerate(outcomes)
                if isinstance(outcome, IntakeError)
            ],
        )
        results: list[dict[str, Any]] = []
        accepted = 0
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, Accepted):
                accepted += 1
                entry: dict[str, Any] = {"index": index, "id": str(outcome.lead_id)}
                entry["status"] = "received"
                if outcome.replayed:
                    entry["replayed"] = True
            else:
                entry = {"index": index, **error_body(outcome.code, outcome.message)}
            results.append(entry)
        return Response(
            {"accepted": accepted, "rejected": len(outcomes) - accepted, "results": results},
            status=202,
        )

    @staticmethod
    def _read(request: HttpRequest, body: bytes) -> list[Any]:
        return batch_records_read(request, body)


# --- Leads -----------------------------------------------------------------------------------


class CanViewLeads(BasePermission):
    """Authenticated users holding ``leads.view_lead``."""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm("leads.view_lead"))


LEAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "status": {"type": "string", "enum": list(LeadStatus.values)},
        "source": {"type": "string"},
        "lane": {"type": "string", "enum": list(Lane.values)},
        "received_at": {"type": "string", "format": "date-time"},
        "processed_at": {"type": "string", "format": "date-time", "nullable": True},
        "erased_at": {
            "type": "string",
            "format": "date-time",
            "nullable": True,
            "description": "When the lead's person was erased (null: not erased).",
        },
        "fields": {"type": "object", "additionalProperties": True},
        "flags": {"type": "array", "items": {"type": "string"}},
        "priority": {"type": "string", "nullable": True},
        "tags": {"type": "array", "items": {"type": "string"}},
        "duplicate_of": {"type": "string", "format": "uuid", "nullable": True},
        "assignment": {"type": "object", "nullable": True, "additionalProperties": True},
        "trace": {"type": "array", "items": {"type": "object"}},
        "events": {"type": "array", "items": {"type": "object"}},
        "idempotency_key": {"type": "string", "nullable": True},
        "attempts": {"type": "integer"},
        "last_error": {"type": "string"},
        "unassigned_retries": {"type": "integer"},
        "next_retry_at": {"type": "string", "format": "date-time", "nullable": True},
    },
    "required": ["id", "status", "source", "received_at", "fields", "assignment"],
}


class LeadDetailView(APIView):
    """One lead with its fields, assignment, decision trace and audit events."""

    permission_classes = [CanViewLeads]

    @extend_schema(
        operation_id="lead_retrieve",
        responses={200: OpenApiResponse(LEAD_SCHEMA), **_error_responses(401, 403, 404)},
    )
    def get(self, request: Request, lead_id: str) -> Response:
        lead = selectors.lead_get(lead_id=lead_id, user=request.user)
        if lead is None:
            return Response(error_body("not_found", "No such lead."), status=404)
        return Response(selectors.lead_document(lead))


class LeadListView(APIView):
    """Leads, newest first (or by priority), filtered by status, source, rep, dates, priority,
    tag and free text."""

    permission_classes = [CanViewLeads]

    @extend_schema(
        operation_id="lead_list",
        parameters=[
            OpenApiParameter("status", str, enum=list(LeadStatus.values)),
            OpenApiParameter("source", str, description="source slug"),
            OpenApiParameter(
                "rep",
                OpenApiTypes.EMAIL,
                description="e-mail of the assigned rep (no lead is assigned yet: none match)",
            ),
            OpenApiParameter("since", OpenApiTypes.DATETIME),
            OpenApiParameter("until", OpenApiTypes.DATETIME),
            OpenApiParameter("q", str, description="e-mail, company or name contains"),
            OpenApiParameter(
                "priority", str, description="the priority a tag rule gave (exact); none: without"
            ),
            OpenApiParameter("tag", str, description="leads with this tag (exact)"),
            OpenApiParameter(
                "ordering", str, enum=[value for value, _ in selectors.LEAD_ORDERINGS]
            ),
            OpenApiParameter("page", int),
        ],
        responses={
            200: OpenApiResponse(
                {
                    "type": "object",
                    "properties": {
                        "count": {"type": "integer"},
                        "next": {"type": "string", "nullable": True},
                        "previous": {"type": "string", "nullable": True},
                        "results": {"type": "array", "items": LEAD_SCHEMA},
                    },
                }
            ),
            **_error_responses(400, 401, 403),
        },
    )
    def get(self, request: Request) -> Response:
        filters = selectors.LeadFilter(
            request.query_params, queryset=selectors.lead_list_for(request.user)
        )
        if not filters.is_valid():
            fields = {k: [str(m) for m in v] for k, v in filters.errors.items()}
            return Response(error_body("invalid_filter", "Invalid filter.", fields), status=400)
        paginator = PageNumberPagination()
        page: list[Any] = paginator.paginate_queryset(filters.qs, request, view=self) or []
        return paginator.get_paginated_response([selectors.lead_document(lead) for lead in page])
