"""API token services: create (the secret returned once), revoke, and look a secret up."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.config_changes import config_change_record, stored_values
from routing.config_api.models import ApiToken, ApiTokenScope

SECRET_PREFIX = "lrt_"  # noqa: S105 (a prefix, not a secret); recognisable in a leaked config file, by secret scanners too
_LAST_USED_EVERY = timedelta(minutes=1)  # not one write per request


class ApiTokenInvalid(ValueError):
    """A token cannot be created as asked (unknown scope, empty or taken name, bad expiry)."""


class ApiTokenRefused(Exception):
    """A secret that does not authenticate: unknown, revoked, expired, or its user inactive."""


def api_token_digest(secret: str) -> str:
    """SHA-256 hex of a secret. Secrets are 256-bit random, so a fast hash is enough."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def scopes_parse(value: str | Iterable[str]) -> list[str]:
    """The scopes of ``roster,read`` (or a list), checked and in a fixed order."""
    items = value.split(",") if isinstance(value, str) else list(value)
    wanted = {item.strip() for item in items if item.strip()}
    unknown = sorted(wanted - set(ApiTokenScope.values))
    if unknown:
        raise ApiTokenInvalid(
            f"Unknown scope(s) {', '.join(unknown)}: choose from {', '.join(ApiTokenScope.values)}."
        )
    if not wanted:
        raise ApiTokenInvalid(f"Give at least one scope of {', '.join(ApiTokenScope.values)}.")
    return [scope for scope in ApiTokenScope.values if scope in wanted]


@dataclass(frozen=True)
class CreatedToken:
    """A new token and its secret: show the secret now, it is not stored."""

    token: ApiToken
    secret: str


@transaction.atomic
def api_token_create(
    *,
    user: Any,
    name: str,
    scopes: str | Iterable[str],
    expires_at: datetime | None = None,
    actor: str,
) -> CreatedToken:
    """Create a token for ``user`` (audited, the secret redacted); the secret is returned once."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ApiTokenInvalid("A token needs a name of 1 to 100 characters.")
    if ApiToken.objects.filter(name=name).exists():
        raise ApiTokenInvalid(f'There is a token named "{name}" already.')
    if expires_at is not None and expires_at <= timezone.now():
        raise ApiTokenInvalid("The expiry must be in the future.")
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        name=name,
        user=user,
        scopes=scopes_parse(scopes),
        token_hash=api_token_digest(secret),
        hint=secret[:10],
        expires_at=expires_at,
    )
    config_change_record(actor=actor, obj=token, action="added", after=stored_values(token))
    return CreatedToken(token=token, secret=secret)


@transaction.atomic
def api_token_revoke(*, token_id: int, actor: str) -> ApiToken:
    """Revoke a token from now on (audited); revoking it again changes nothing."""
    token = ApiToken.objects.select_for_update().get(pk=token_id)
    if token.revoked_at is None:
        before = stored_values(token)
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        config_change_record(
            actor=actor, obj=token, action="revoked", before=before, after=stored_values(token)
        )
    return token


def api_token_authenticate(*, secret: str) -> ApiToken:
    """The live token of ``secret``, its use noted (at most once a minute); else ApiTokenRefused
    saying why (the caller answers 401)."""
    token = (
        ApiToken.objects.select_related("user").filter(token_hash=api_token_digest(secret)).first()
    )
    if token is None:
        raise ApiTokenRefused("Invalid API token.")
    if token.revoked_at is not None:
        raise ApiTokenRefused("This API token has been revoked.")
    now = timezone.now()
    if token.expires_at is not None and token.expires_at <= now:
        raise ApiTokenRefused("This API token has expired.")
    if not token.user.is_active:
        raise ApiTokenRefused("The user of this API token is inactive.")
    if token.last_used_at is None or token.last_used_at <= now - _LAST_USED_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def token_actor(token: ApiToken) -> str:
    """The audit actor of a change made with ``token``."""
    return f"token:{token.name}"
