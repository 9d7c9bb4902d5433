"""Routing API: simulate (api.md, "Routing"), and the lead actions touch, reassign, reroute."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.parsers import FormParser
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.selectors import managed_team_ids
from config.errors import ApiError, error_body
from leads import selectors
from leads.api import LEAD_SCHEMA, CanViewLeads
from leads.api import _error_responses as error_responses
from leads.models import Lead
from leads.parsing import StrictJSONParser
from routing import decisions
from routing.engine import RuleErrors
from routing.services import (
    LeadActionError,
    assignment_touch,
    lead_reassign,
    lead_reroute,
)

_ENVELOPE_KEYS = frozenset({"lead", "source", "ruleset_version"})

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "fields": {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": {"type": "string"}},
                },
            },
            "required": ["code", "message"],
        }
    },
    "required": ["error"],
}

SIMULATE_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A lead as a source would send it, or "
    '{"lead": {...}, "source": "<slug>", "ruleset_version": <n>}.',
    "properties": {
        "lead": {"type": "object", "additionalProperties": True},
        "source": {"type": "string", "nullable": True},
        "ruleset_version": {"type": "integer", "minimum": 1, "nullable": True},
    },
    "additionalProperties": True,
}

SIMULATE_RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "outcome": {"type": "string", "enum": ["owner", "excluded", "nothing"]},
        "rep": {
            "type": "object",
            "nullable": True,
            "properties": {
                "id": {"type": "integer"},
                "email": {"type": "string"},
                "name": {"type": "string"},
            },
        },
        "team": {"type": "string", "nullable": True},
        "rule": {"type": "string", "nullable": True},
        "ruleset_version": {"type": "integer"},
        "reason": {"type": "string"},
        "sla_minutes": {"type": "integer", "nullable": True},
        "priority": {"type": "string", "nullable": True},
        "tags": {"type": "array", "items": {"type": "string"}},
        "exclusion_reason": {"type": "string", "nullable": True},
        "trace": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "rule": {"type": "string"},
                    "matched": {"type": "boolean"},
                    "decided": {"type": "boolean"},
                    "why": {"type": "string"},
                },
            },
        },
    },
    "required": ["outcome", "rep", "team", "rule", "ruleset_version", "reason", "trace"],
}


def _errors(*codes: int) -> dict[int, OpenApiResponse]:
    return {code: OpenApiResponse(ERROR_SCHEMA) for code in codes}


class CanViewRuleset(BasePermission):
    """Authenticated users holding ``routing.view_ruleset``."""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm("routing.view_ruleset"))


def _invalid(message: str, fields: dict[str, list[str]] | None = None) -> ApiError:
    return ApiError(code="invalid_body", message=message, status_code=400, fields=fields)


def _request(data: Any) -> tuple[dict[str, Any], str | None, int | None]:
    """(lead, source slug, version) from the body; ApiError 400 when it is not usable."""
    if hasattr(data, "dict") and not isinstance(data, dict):
        data = data.dict()  # a form-encoded body (QueryDict)
    if not isinstance(data, dict):
        raise _invalid('The body must be a JSON object: a lead, or {"lead": {...}}.')
    if not (isinstance(data.get("lead"), dict) and set(data) <= _ENVELOPE_KEYS):
        return data, None, None
    fields: dict[str, list[str]] = {}
    source = data.get("source")
    if source is not None and (not isinstance(source, str) or not source.strip()):
        fields["source"] = ["Must be a source slug."]
    version = data.get("ruleset_version")
    if version is not None and (
        not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= 2**31 - 1
    ):
        fields["ruleset_version"] = ["Must be a whole number from 1 to 2147483647."]
    if fields:
        raise _invalid("Invalid simulation request.", fields)
    return data["lead"], source.strip() if isinstance(source, str) else None, version


class SimulateView(APIView):
    """The decision the worker would make now for a lead; persists nothing, moves no turn."""

    permission_classes = [CanViewRuleset]
    parser_classes = [StrictJSONParser, FormParser]

    @extend_schema(
        operation_id="routing_simulate",
        request={"application/json": SIMULATE_REQUEST_SCHEMA},
        responses={
            200: OpenApiResponse(SIMULATE_RESPONSE_SCHEMA),
            **_errors(400, 401, 403, 404, 409, 415),
        },
        examples=[
            OpenApiExample(
                "A lead as a source sends it",
                value={"email": "ana@acme.com", "country": "DE", "employees": 1200},
                request_only=True,
            ),
            OpenApiExample(
                "With a source and a version",
                value={"lead": {"Email Address": "ana@acme.com"}, "source": "webinar"},
                request_only=True,
            ),
        ],
    )
    def post(self, request: Request) -> Response:
        lead, source, version = _request(request.data)
        try:
            result = decisions.simulate(lead_data=lead, source_slug=source, version=version)
        except decisions.RulesetNotFound as exc:
            raise ApiError(
                code="ruleset_not_found", message=str(exc), status_code=status.HTTP_404_NOT_FOUND
            ) from None
        except decisions.SourceNotFound as exc:
            raise ApiError(
                code="source_not_found", message=str(exc), status_code=status.HTTP_404_NOT_FOUND
            ) from None
        except RuleErrors as exc:
            raise ApiError(
                code="ruleset_invalid",
                message="The ruleset no longer compiles against today's teams, reps and lists: "
                + "; ".join(str(error) for error in exc.errors[:20]),
                status_code=status.HTTP_409_CONFLICT,
            ) from None
        return Response(simulation_document(result))


def simulation_document(result: decisions.Simulation) -> dict[str, Any]:
    """The simulate response body."""
    decision = result.decision
    rep = result.rep
    return {
        "outcome": decision.outcome,
        "rep": {"id": rep.id, "email": rep.email, "name": rep.name} if rep is not None else None,
        "team": result.team.name if result.team is not None else None,
        "rule": decision.rule_name,
        "ruleset_version": decision.ruleset_version,
        "reason": decision.reason,
        "sla_minutes": result.sla_minutes,
        "priority": decision.priority,
        "tags": list(decision.tags),
        "exclusion_reason": decision.exclusion_reason,
        "trace": [
            {
                "rule": entry.rule_name,
                "matched": entry.matched,
                "decided": entry.decided,
                "why": entry.why,
            }
            for entry in decision.trace
        ],
    }


# --- Lead actions: touch, reassign, reroute (the services live in routing) --------------------


def _actor(request: Request) -> str:
    return f"user:{request.user.get_username()}"


def _lead_action(lead: Lead, action: Any) -> Response:
    """Run the action; answer with the lead as it is now, or the action's refusal."""
    try:
        action()
    except LeadActionError as error:
        return Response(error_body(error.code, error.message), status=error.status)
    return Response(selectors.lead_document(selectors.lead_get(lead_id=lead.pk) or lead))


class _LeadActionView(APIView):
    permission_classes = [CanViewLeads]
    parser_classes = [StrictJSONParser]

    def _lead_or_404(self, lead_id: str) -> Lead:
        lead = selectors.lead_get(lead_id=lead_id, user=self.request.user)
        if lead is None:
            raise ApiError(code="not_found", message="No such lead.", status_code=404)
        return lead


class LeadTouchView(_LeadActionView):
    """The owner's first touch (idempotent). The rep's own user, or ``leads.touch_lead``."""

    @extend_schema(
        operation_id="lead_touch",
        request=None,
        responses={200: OpenApiResponse(LEAD_SCHEMA), **error_responses(401, 403, 404, 409)},
    )
    def post(self, request: Request, lead_id: str) -> Response:
        lead = self._lead_or_404(lead_id)
        any_lead = request.user.has_perm("leads.touch_lead")
        return _lead_action(
            lead,
            lambda: assignment_touch(
                lead_id=lead.pk,
                actor=_actor(request),
                owner_user_id=None if any_lead else request.user.pk,
                scope_team_ids=managed_team_ids(request.user),
            ),
        )


REASSIGN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "rep": {"type": "string", "format": "email"},
        "reason": {"type": "string", "minLength": 1, "maxLength": 1000},
    },
    "required": ["rep", "reason"],
}


class LeadReassignView(_LeadActionView):
    """Give the lead to another rep by hand, with a reason (``leads.reassign_lead``)."""

    @extend_schema(
        operation_id="lead_reassign",
        request={"application/json": REASSIGN_SCHEMA},
        responses={
            200: OpenApiResponse(LEAD_SCHEMA),
            **error_responses(400, 401, 403, 404, 409, 422),
        },
    )
    def post(self, request: Request, lead_id: str) -> Response:
        if not request.user.has_perm("leads.reassign_lead"):
            raise ApiError(code="forbidden", message="You may not reassign leads.", status_code=403)
        body = request.data
        if not isinstance(body, dict):
            raise ApiError(code="invalid_body", message="Send a JSON object.")
        problems: dict[str, list[str]] = {}
        rep, reason = body.get("rep"), body.get("reason")
        if not isinstance(rep, str) or not rep.strip() or len(rep) > 320:
            problems["rep"] = ["The e-mail of the rep to give the lead to."]
        if not isinstance(reason, str) or not reason.strip():
            problems["reason"] = ["Say why the lead is reassigned."]
        elif len(reason) > 1000:
            problems["reason"] = ["At most 1,000 characters."]
        if problems:
            raise ApiError(
                code="invalid_body",
                message="The reassignment needs a rep and a reason.",
                fields=problems,
            )
        lead = self._lead_or_404(lead_id)
        # The service checks the scope again under the lead's lock (the lead may move meanwhile).
        return _lead_action(
            lead,
            lambda: lead_reassign(
                lead_id=lead.pk,
                rep_email=str(rep),
                reason=str(reason),
                actor=_actor(request),
                scope_team_ids=managed_team_ids(request.user),
            ),
        )


class LeadRerouteView(_LeadActionView):
    """Run routing again for an unassigned or failed lead (``leads.reroute_lead``): 202."""

    @extend_schema(
        operation_id="lead_reroute",
        request=None,
        responses={202: OpenApiResponse(LEAD_SCHEMA), **error_responses(401, 403, 404, 409)},
    )
    def post(self, request: Request, lead_id: str) -> Response:
        if not request.user.has_perm("leads.reroute_lead"):
            raise ApiError(code="forbidden", message="You may not re-route leads.", status_code=403)
        lead = self._lead_or_404(lead_id)
        response = _lead_action(lead, lambda: lead_reroute(lead_id=lead.pk, actor=_actor(request)))
        if response.status_code == 200:
            response.status_code = 202
        return response


ERASE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": 500}},
    "required": ["reason"],
}

ERASED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "already_erased": {
            "type": "boolean",
            "description": "The lead's person was erased before: nothing was written again.",
        },
        "leads": {
            "type": "array",
            "items": {"type": "string", "format": "uuid"},
            "description": "Every lead of the person erased now (this one included).",
        },
        "erased": {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "description": "What was cleared: leads, person keys, assignments' traces, "
            "deliveries, delivery attempts, refused inbox rows.",
        },
        "message": {"type": "string"},
    },
    "required": ["id", "already_erased", "leads", "erased", "message"],
}


class LeadEraseView(_LeadActionView):
    """Erase the lead's person: this lead and every other of theirs (``leads.erase_lead``).

    Their personal data is overwritten and their person keys destroyed; the decisions (which
    rule, which rep, when) and a verifiable audit log remain, with an ``erased`` event per lead
    saying who, when and why (docs/operations.md, "Privacy")."""

    @extend_schema(
        operation_id="lead_erase",
        request={"application/json": ERASE_SCHEMA},
        responses={
            200: OpenApiResponse(ERASED_SCHEMA),
            **error_responses(400, 401, 403, 404),
        },
    )
    def post(self, request: Request, lead_id: str) -> Response:
        from routing.erasure import lead_person_erase

        if not request.user.has_perm("leads.erase_lead"):
            raise ApiError(code="forbidden", message="You may not erase people.", status_code=403)
        body = request.data
        if not isinstance(body, dict):
            raise ApiError(code="invalid_body", message="Send a JSON object.")
        reason = body.get("reason")
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 500:
            raise ApiError(
                code="invalid_body",
                message="Say why this person is erased (at most 500 characters).",
                fields={"reason": ["Why (recorded in the audit log; nothing personal)."]},
            )
        lead = self._lead_or_404(lead_id)
        try:
            result = lead_person_erase(
                lead_id=lead.pk, actor=_actor(request), reason=reason.strip()
            )
        except Lead.DoesNotExist:
            raise ApiError(code="not_found", message="No such lead.", status_code=404) from None
        already = not result.leads and bool(result.already_erased)
        return Response(
            {
                "id": str(lead.pk),
                "already_erased": already,
                "leads": result.lead_ids if not already else [],
                "erased": result.counts(),
                "message": "this lead's person was erased before; nothing was written again"
                if already
                else result.sentence(),
            }
        )
