"""``Authorization: Bearer <token>`` for the configuration API, and ``HasScope``.

A scoped token opens only the views that say they take one (``accepts_api_tokens = True``) and
check its scope, and its owner's permission, with ``HasScope``; any other endpoint refuses it
with 403, so a roster token cannot read leads as its user. The legacy ``Authorization: Token
<key>`` scheme and sessions are unchanged: on the scoped views they need the Django permission
``HasScope`` names (alone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

if TYPE_CHECKING:
    from routing.config_api.models import ApiToken

# No model at import time: DRF imports this class (DEFAULT_AUTHENTICATION_CLASSES) whenever
# rest_framework.views is first imported, which config.wsgi does before django.setup().


def _is_api_token(auth: Any) -> TypeGuard[ApiToken]:
    from routing.config_api.models import ApiToken

    return isinstance(auth, ApiToken)


class ApiTokenAuthentication(BaseAuthentication):
    """A scoped API token sent as ``Authorization: Bearer <secret>``."""

    keyword = "bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        from routing.config_api.tokens import ApiTokenRefused, api_token_authenticate

        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Send Authorization: Bearer <token>.")
        try:
            secret = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid API token.") from None
        try:
            token = api_token_authenticate(secret=secret)
        except ApiTokenRefused as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        view = (getattr(request, "parser_context", None) or {}).get("view")
        if not getattr(view, "accepts_api_tokens", False):
            raise exceptions.PermissionDenied(
                "Scoped API tokens open the configuration API only; use a user's token here."
            )
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class HasScope(BasePermission):
    """``HasScope("roster")``: a scoped token needs that scope *and* its owning user needs
    ``user_perm`` (a token never does more than its owner may: a scope is a narrowing, not a
    grant, so an owner who lost the permission loses it for their tokens too); a user
    (session or legacy token) needs ``user_perm``. Used as an instance in ``get_permissions``."""

    def __init__(self, scope: str, *, user_perm: str) -> None:
        self.scope = scope
        self.user_perm = user_perm
        self.message = f'This needs the "{scope}" scope.'

    def has_permission(self, request: Request, view: Any) -> bool:
        token = request.auth
        if _is_api_token(token):
            if self.scope not in token.scopes:
                self.message = f'This API token lacks the "{self.scope}" scope.'
                return False
            owner = token.user
            if owner.is_active and owner.has_perm(self.user_perm):
                return True
            self.message = (
                f'The user of this API token ("{owner.get_username()}") lacks the permission '
                f'{self.user_perm}, which the "{self.scope}" scope needs here: a token does '
                "no more than its user may."
            )
            return False
        user = request.user
        if not (user and user.is_authenticated):
            return False
        self.message = f"You need the permission {self.user_perm} (or a token with the "
        self.message += f'"{self.scope}" scope).'
        return bool(user.has_perm(self.user_perm))


def request_actor(request: Request) -> str:
    """Who a change made through the API is recorded as: ``token:<name>`` or ``user:<name>``."""
    from routing.config_api.tokens import token_actor

    if _is_api_token(request.auth):
        return token_actor(request.auth)
    return f"user:{request.user.get_username()}"


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """The Bearer scheme in the OpenAPI document."""

    target_class = "routing.config_api.auth.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A scoped API token (read, draft, publish, roster); docs/api.md.",
        }
