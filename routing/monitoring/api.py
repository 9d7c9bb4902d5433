"""Alerts API (api.md "Alerts"): ``GET /api/v1/alerts/?status=open|resolved&kind=...``."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import error_body
from leads.api import _error_responses as error_responses
from routing.monitoring.models import Alert, AlertKind, AlertStatus

ALERT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "kind": {"type": "string", "enum": list(AlertKind.values)},
        "subject": {"type": "string"},
        "status": {"type": "string", "enum": list(AlertStatus.values)},
        "message": {"type": "string"},
        "opened_at": {"type": "string", "format": "date-time"},
        "last_seen_at": {"type": "string", "format": "date-time"},
        "resolved_at": {"type": "string", "format": "date-time", "nullable": True},
        "data": {"type": "object", "additionalProperties": True},
    },
    "required": ["id", "kind", "status", "message", "opened_at", "resolved_at"],
}


class CanViewAlerts(BasePermission):
    """Authenticated users holding ``routing.view_alert``."""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm("routing.view_alert"))


def alert_document(alert: Alert) -> dict[str, Any]:
    """An alert as the API shows it."""
    return {
        "id": alert.pk,
        "kind": alert.kind,
        "subject": alert.subject,
        "status": alert.status,
        "message": alert.message,
        "opened_at": alert.opened_at.isoformat(),
        "last_seen_at": alert.last_seen_at.isoformat(),
        "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None,
        "data": alert.data,
    }


class AlertListView(APIView):
    """Alerts, newest first, optionally only open or resolved ones, or of one kind."""

    permission_classes = [CanViewAlerts]

    @extend_schema(
        operation_id="alert_list",
        parameters=[
            OpenApiParameter("status", str, enum=list(AlertStatus.values)),
            OpenApiParameter("kind", str, enum=list(AlertKind.values)),
            OpenApiParameter("page", OpenApiTypes.INT),
        ],
        responses={
            200: OpenApiResponse(
                {
                    "type": "object",
                    "properties": {
                        "count": {"type": "integer"},
                        "next": {"type": "string", "nullable": True},
                        "previous": {"type": "string", "nullable": True},
                        "results": {"type": "array", "items": ALERT_SCHEMA},
                    },
                }
            ),
            **error_responses(400, 401, 403),
        },
    )
    def get(self, request: Request) -> Response:
        alerts = Alert.objects.order_by("-opened_at", "-id")
        fields: dict[str, list[str]] = {}
        for name, choices in (("status", AlertStatus.values), ("kind", AlertKind.values)):
            value = request.query_params.get(name)
            if value is None or value == "":
                continue
            if value not in choices:
                fields[name] = [f"Choose one of: {', '.join(choices)}."]
                continue
            alerts = alerts.filter(**{name: value})
        if fields:
            return Response(error_body("invalid_filter", "Invalid filter.", fields), status=400)
        paginator = PageNumberPagination()
        page: list[Alert] = paginator.paginate_queryset(alerts, request, view=self) or []
        return paginator.get_paginated_response([alert_document(alert) for alert in page])
