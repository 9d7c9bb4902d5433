"""The lead status URL in the OpenAPI document (drf-spectacular's POSTPROCESSING_HOOKS).

The status URL is a plain async Django view (leads.status_api), answered in the ASGI process
in front of Django (leads.status_asgi), so drf-spectacular does not find it among the DRF
views; this hook adds its operations, with the status document and the API's error shape.
"""

from __future__ import annotations

from typing import Any

from leads.models import STATUS_MINUTES_MAX

STATUS_PATH = "/api/v1/status/{lead_id}/{token}/"

_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            "required": ["code", "message"],
        }
    },
    "required": ["error"],
}

_STATUS = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "status": {
            "type": "string",
            "enum": ["received", "processing", "assigned", "not_assigned"],
            "description": "not_assigned: excluded, unassigned or failed, alike.",
        },
        "owner": {
            "type": "object",
            "nullable": True,
            "description": "Only what the source reveals (Source.status_reveal); empty values "
            "are left out.",
            "properties": {
                "name": {"type": "string"},
                "first_name": {"type": "string"},
                "photo_url": {"type": "string"},
                "booking_url": {"type": "string"},
                "team": {"type": "string"},
            },
        },
    },
    "required": ["id", "status", "owner"],
}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _operation(method: str) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {"name": "lead_id", "in": "path", "required": True, "schema": {"type": "string"}},
        {
            "name": "token",
            "in": "path",
            "required": True,
            "schema": {"type": "string"},
            "description": "The signed token of the status URL in the 202 (body `status_url`, "
            f"header `Location`); it expires after the source's status minutes (at most "
            f"{STATUS_MINUTES_MAX}).",
        },
    ]
    responses: dict[str, Any] = {
        "404": _json("A forged, expired or another lead's token, or no such lead.", _ERROR),
        "503": _json("The database is unavailable; retry after Retry-After.", _ERROR),
    }
    if method == "options":
        responses["204"] = {"description": "CORS preflight for the source's origins."}
        return {
            "operationId": "lead_status_preflight",
            "summary": "CORS preflight of a lead's status URL",
            "tags": ["status"],
            "security": [],
            "parameters": parameters,
            "responses": responses,
        }
    parameters.append(
        {
            "name": "wait",
            "in": "query",
            "required": False,
            "schema": {"type": "number", "minimum": 0},
            "description": "Hold the request until the lead has its outcome or this many "
            "seconds passed (clamped to STATUS_WAIT_MAX_SECONDS; answered at once by the sync "
            "web server).",
        }
    )
    responses["200"] = _json(
        "The lead's status, and its owner's public face once assigned.", _STATUS
    )
    responses["400"] = _json("`wait` is not a number.", _ERROR)
    return {
        "operationId": "lead_status_read",
        "summary": "A lead's status, for the page that submitted it (no credential)",
        "tags": ["status"],
        "security": [],
        "parameters": parameters,
        "responses": responses,
    }


def status_paths_add(
    result: dict[str, Any], generator: Any, request: Any, public: Any
) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: add the status URL's GET and OPTIONS."""
    result.setdefault("paths", {})[STATUS_PATH] = {
        "get": _operation("get"),
        "options": _operation("options"),
    }
    return result
