"""Subject access in the API: ``GET /api/v1/people/export/?email=…`` (audit.subject_access)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.subject_access import SubjectAccessRefused, person_export
from config.errors import ApiError
from leads.api import _error_responses as error_responses


class CanExportPeople(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return bool(
            IsAuthenticated().has_permission(request, view)
            and request.user.has_perm("leads.export_person")
        )


class PersonExportView(APIView):
    """Everything held about one person, as JSON (``leads.export_person``)."""

    permission_classes = [CanExportPeople]

    @extend_schema(
        operation_id="person_export",
        parameters=[
            OpenApiParameter("email", str, description="The person's e-mail."),
            OpenApiParameter("phone", str, description="The person's phone (E.164 preferred)."),
        ],
        responses={
            200: OpenApiResponse(
                {"type": "object", "additionalProperties": True},
                description="format leadrouter.subject-access/1: the person's leads (every "
                "field, payload as received, custom values, enrichment/CRM/fetch results, "
                "assignments, events in words with their opened data, deliveries and their "
                "attempts, admin log lines) and refused inbox rows; found false when nothing "
                "is held.",
            ),
            **error_responses(400, 401, 403),
        },
    )
    def get(self, request: Request) -> Response:
        email = str(request.query_params.get("email", "")).strip()
        phone = str(request.query_params.get("phone", "")).strip()
        if not email and not phone:
            raise ApiError(
                code="invalid_filter",
                message="Name the person: ?email= or ?phone=.",
                fields={"email": ["The person's e-mail, or their phone."]},
            )
        if len(email) > 320 or len(phone) > 40:
            raise ApiError(code="invalid_filter", message="That is no e-mail or phone.")
        try:
            document = person_export(
                email=email, phone=phone, actor=f"user:{request.user.get_username()}"
            )
        except SubjectAccessRefused as error:
            raise ApiError(code="invalid_filter", message=f"{error}.") from None
        response = Response(document)
        response["Cache-Control"] = "no-store"
        return response
