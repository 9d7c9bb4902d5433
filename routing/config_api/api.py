"""The roster API (docs/api.md, "Roster"): reps and their planned absences, for an HR or CRM
sync. Scope ``read`` to read, ``roster`` to write (users: ``routing.view_rep`` and
``routing.change_rep``). Each view: authenticate, check the body, one service call, answer."""

from __future__ import annotations

from datetime import UTC
from typing import Any
from zoneinfo import ZoneInfo

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import ApiError
from leads.api import _error_responses as _errors
from routing.config_api import roster
from routing.config_api.auth import HasScope, request_actor
from routing.config_api.parsing import ConfigJSONParser
from routing.engine.availability import zone_named
from routing.models import Rep
from routing.rules_io import RulesFileErrors, absence_fields_check, rep_fields_check
from routing.timeoff.availability import reps_available
from routing.timeoff.models import RepAbsence

_MOMENT = {"type": "string", "format": "date-time", "nullable": True}
_HOURS = {
    "type": "object",
    "nullable": True,
    "description": '{"days": [1..7], "start": "HH:MM", "end": "HH:MM"} in the rep\'s time '
    "zone (1 = Monday); null = always available.",
    "properties": {
        "days": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 7}},
        "start": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
        "end": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
    },
    "required": ["days", "start", "end"],
}
_CAP = {"type": "integer", "minimum": 1, "maximum": 2**31 - 1, "nullable": True}

REP_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The keys given are set; the keys left out stay as they are (a new rep "
    "gets the defaults). Checked as a rules file's reps[] entry is.",
    "properties": {
        "email": {"type": "string", "format": "email", "maxLength": 254},
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "active": {"type": "boolean"},
        "out_of_office_until": _MOMENT,
        "timezone": {"type": "string", "description": "IANA name, e.g. Europe/Berlin."},
        "working_hours": _HOURS,
        "max_open": _CAP,
        "max_per_day": _CAP,
    },
    "additionalProperties": False,
}

REP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        **REP_INPUT_SCHEMA["properties"],
        "available": {
            "type": "boolean",
            "description": "May take a lead now: active, not out of office, not on leave, "
            "no holiday.",
        },
        "updated_at": {"type": "string", "format": "date-time"},
    },
    "required": ["id", "email", "name", "active", "timezone", "available"],
}

REP_LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "count": {"type": "integer"},
        "next": {"type": "string", "nullable": True},
        "previous": {"type": "string", "nullable": True},
        "results": {"type": "array", "items": REP_SCHEMA},
    },
    "required": ["count", "results"],
}

_WALL_OR_MOMENT = (
    "ISO 8601: with a UTC offset (2027-04-01T00:00:00+02:00) that moment; without one "
    "(2027-04-01T00:00) a wall-clock time in the rep's time zone (a time the clocks skip is "
    "400, one they repeat is taken the first time)."
)
ABSENCE_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "from": {"type": "string", "description": f"Inclusive. {_WALL_OR_MOMENT}"},
        "to": {"type": "string", "description": f"Exclusive. {_WALL_OR_MOMENT}"},
        "note": {"type": "string", "maxLength": 200},
    },
    "required": ["from", "to"],
    "additionalProperties": False,
}

ABSENCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "from": {"type": "string", "format": "date-time", "description": "The moment, in UTC."},
        "to": {"type": "string", "format": "date-time", "description": "The moment, in UTC."},
        "timezone": {"type": "string", "description": "The rep's time zone."},
        "from_local": {
            "type": "string",
            "description": "The wall-clock time in the rep's zone, with its offset then.",
        },
        "to_local": {
            "type": "string",
            "description": "The wall-clock time in the rep's zone, with its offset then.",
        },
        "note": {"type": "string"},
    },
    "required": ["id", "from", "to", "timezone", "from_local", "to_local", "note"],
}

_REF = OpenApiParameter(
    "ref", str, OpenApiParameter.PATH, description="The rep's id, or e-mail (ignoring case)."
)


def rep_document(rep: Rep, *, available: bool | None = None) -> dict[str, Any]:
    """A rep as the roster API shows it."""
    if available is None:
        available = bool(reps_available(rep_ids=[rep.pk]))
    return {
        "id": rep.pk,
        "email": rep.email,
        "name": rep.name,
        "active": rep.active,
        "out_of_office_until": rep.out_of_office_until,
        "timezone": rep.timezone,
        "working_hours": rep.working_hours,
        "max_open": rep.max_open,
        "max_per_day": rep.max_per_day,
        "available": available,
        "updated_at": rep.updated_at,
    }


def absence_document(absence: RepAbsence, zone_name: str) -> dict[str, Any]:
    """A planned absence as the roster API shows it: the moments (UTC) and the rep's wall-clock
    times with their offsets (which differ across a DST change)."""
    zone = zone_named(zone_name) or UTC
    return {
        "id": absence.pk,
        "from": absence.starts_at,
        "to": absence.ends_at,
        "timezone": zone_name if zone is not UTC else "UTC",
        "from_local": absence.starts_at.astimezone(zone).isoformat(),
        "to_local": absence.ends_at.astimezone(zone).isoformat(),
        "note": absence.note,
    }


def _checked(check: Any, body: Any) -> Any:
    try:
        return check(body)
    except RulesFileErrors as errors:
        fields: dict[str, list[str]] = {}
        for error in errors.errors:
            fields.setdefault(error.path or "non_field_errors", []).append(error.message)
        raise ApiError(
            code="invalid_body", message="The request is invalid.", fields=fields
        ) from None


def _refused(error: roster.RosterError) -> ApiError:
    fields = (
        {key or "non_field_errors": messages for key, messages in error.fields.items()}
        if error.fields
        else None
    )
    return ApiError(code=error.code, message=error.message, status_code=error.status, fields=fields)


class _RosterView(APIView):
    accepts_api_tokens = True  # routing.config_api.auth: scoped tokens are taken here
    parser_classes = [ConfigJSONParser]

    def get_permissions(self) -> list[BasePermission]:
        if self.request.method in SAFE_METHODS:
            return [HasScope("read", user_perm="routing.view_rep")]
        return [HasScope("roster", user_perm="routing.change_rep")]

    def rep_or_404(self, ref: str) -> Rep:
        rep = None if "\x00" in ref or len(ref) > 254 else roster.rep_find(ref=ref)
        if rep is None:
            raise ApiError(code="not_found", message="No such rep.", status_code=404)
        return rep


class RosterRepListView(_RosterView):
    """Every rep (paginated, by e-mail), and creating one."""

    @extend_schema(
        operation_id="roster_reps_list",
        tags=["roster"],
        responses={200: OpenApiResponse(REP_LIST_SCHEMA), **_errors(401, 403, 404)},
        parameters=[OpenApiParameter("page", int, description="Page number (50 a page).")],
    )
    def get(self, request: Request) -> Response:
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(Rep.objects.order_by("email", "id"), request, self)
        reps = list(page or [])
        available = reps_available(rep_ids=[rep.pk for rep in reps])
        return paginator.get_paginated_response(
            [rep_document(rep, available=rep.pk in available) for rep in reps]
        )

    @extend_schema(
        operation_id="roster_reps_create",
        tags=["roster"],
        request={"application/json": {**REP_INPUT_SCHEMA, "required": ["email", "name"]}},
        responses={201: OpenApiResponse(REP_SCHEMA), **_errors(400, 401, 403, 409, 415)},
    )
    def post(self, request: Request) -> Response:
        values = _checked(rep_fields_check, request.data)
        try:
            rep = roster.rep_create(values=values, actor=request_actor(request))
        except roster.RosterError as error:
            raise _refused(error) from None
        return Response(rep_document(rep), status=201)


class RosterRepDetailView(_RosterView):
    """One rep: read, change (PATCH), create-or-change by e-mail (PUT), deactivate (DELETE)."""

    @extend_schema(
        operation_id="roster_reps_read",
        tags=["roster"],
        parameters=[_REF],
        responses={200: OpenApiResponse(REP_SCHEMA), **_errors(401, 403, 404)},
    )
    def get(self, request: Request, ref: str) -> Response:
        return Response(rep_document(self.rep_or_404(ref)))

    @extend_schema(
        operation_id="roster_reps_update",
        tags=["roster"],
        parameters=[_REF],
        request={"application/json": REP_INPUT_SCHEMA},
        responses={200: OpenApiResponse(REP_SCHEMA), **_errors(400, 401, 403, 404, 409, 415)},
    )
    def patch(self, request: Request, ref: str) -> Response:
        values = _checked(rep_fields_check, request.data)
        rep = self.rep_or_404(ref)
        try:
            rep = roster.rep_update(rep_id=rep.pk, values=values, actor=request_actor(request))
        except roster.RosterError as error:
            raise _refused(error) from None
        except Rep.DoesNotExist:
            raise ApiError(code="not_found", message="No such rep.", status_code=404) from None
        return Response(rep_document(rep))

    @extend_schema(
        operation_id="roster_reps_upsert",
        tags=["roster"],
        parameters=[_REF],
        description="Create the rep of the e-mail in the URL, or change it: the keys given "
        "are set, the rest stay (a new rep needs a name). Idempotent: a sync may send it again.",
        request={"application/json": REP_INPUT_SCHEMA},
        responses={
            200: OpenApiResponse(REP_SCHEMA, description="Changed (or already so)."),
            201: OpenApiResponse(REP_SCHEMA, description="Created."),
            **_errors(400, 401, 403, 404, 409, 415),
        },
    )
    def put(self, request: Request, ref: str) -> Response:
        if roster.ref_is_id(ref):  # an id: the rep must exist
            return self.patch(request, ref)
        values = _checked(rep_fields_check, request.data)
        email = _checked(rep_fields_check, {"email": ref})["email"]
        try:
            written = roster.rep_upsert(email=email, values=values, actor=request_actor(request))
        except roster.RosterError as error:
            raise _refused(error) from None
        return Response(rep_document(written.rep), status=201 if written.created else 200)

    @extend_schema(
        operation_id="roster_reps_deactivate",
        tags=["roster"],
        parameters=[_REF],
        description="Deactivate the rep (nothing is deleted); their untouched leads are "
        "routed again unless their team keeps an away rep's leads. Idempotent.",
        request=None,
        responses={200: OpenApiResponse(REP_SCHEMA), **_errors(401, 403, 404)},
    )
    def delete(self, request: Request, ref: str) -> Response:
        rep = self.rep_or_404(ref)
        try:
            rep = roster.rep_deactivate(rep_id=rep.pk, actor=request_actor(request))
        except Rep.DoesNotExist:
            raise ApiError(code="not_found", message="No such rep.", status_code=404) from None
        return Response(rep_document(rep))


class RosterAbsenceListView(_RosterView):
    """A rep's planned absences not over yet, and planning one."""

    @extend_schema(
        operation_id="roster_absences_list",
        tags=["roster"],
        parameters=[_REF],
        responses={
            200: OpenApiResponse({"type": "array", "items": ABSENCE_SCHEMA}),
            **_errors(401, 403, 404),
        },
    )
    def get(self, request: Request, ref: str) -> Response:
        rep = self.rep_or_404(ref)
        return Response(
            [absence_document(a, rep.timezone) for a in roster.rep_absences_planned(rep_id=rep.pk)]
        )

    @extend_schema(
        operation_id="roster_absences_add",
        tags=["roster"],
        parameters=[_REF],
        description="ISO 8601 date-times: with an offset, that moment; without one, a "
        "wall-clock time in the rep's time zone (a time the clocks skip is 400 naming the key; a "
        "repeated one is taken the first time it happens). Refused when it overlaps another of "
        "the rep's absences or is over already. One under way re-routes the rep's untouched "
        "leads.",
        request={"application/json": ABSENCE_INPUT_SCHEMA},
        responses={201: OpenApiResponse(ABSENCE_SCHEMA), **_errors(400, 401, 403, 404, 415)},
    )
    def post(self, request: Request, ref: str) -> Response:
        rep = self.rep_or_404(ref)
        zone = zone_named(rep.timezone) or ZoneInfo("UTC")
        start, end, note = _checked(
            lambda body: absence_fields_check(body, zone=zone), request.data
        )
        try:
            absence = roster.rep_absence_add(
                rep_id=rep.pk, start=start, end=end, note=note, actor=request_actor(request)
            )
        except roster.RosterError as error:
            raise _refused(error) from None
        return Response(absence_document(absence, rep.timezone), status=201)


class RosterAbsenceDetailView(_RosterView):
    """Cancelling a planned absence that has not started."""

    @extend_schema(
        operation_id="roster_absences_cancel",
        tags=["roster"],
        parameters=[_REF],
        request=None,
        responses={204: None, **_errors(401, 403, 404, 409)},
    )
    def delete(self, request: Request, ref: str, absence_id: int) -> Response:
        rep = self.rep_or_404(ref)
        if absence_id > 2**31 - 1:
            raise ApiError(
                code="not_found", message="The rep has no such absence.", status_code=404
            )
        try:
            roster.rep_absence_remove(
                rep_id=rep.pk, absence_id=absence_id, actor=request_actor(request)
            )
        except roster.RosterError as error:
            raise _refused(error) from None
        return Response(status=204)
