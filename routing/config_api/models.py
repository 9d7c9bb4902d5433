"""Scoped API tokens for the configuration API (docs/api.md, "Tokens and scopes").

Only a SHA-256 digest of the secret is stored: the secret is shown once, when the token is
created (admin, ``api_token_create``). A token acts for its owning user, on the endpoints that
name a scope only, and only within its scopes.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

__all__ = ["ApiToken", "ApiTokenScope"]


class ApiTokenScope(models.TextChoices):
    READ = "read", "Read the configuration and the roster"
    DRAFT = "draft", "Create and change drafts"
    PUBLISH = "publish", "Publish and roll back"
    ROSTER = "roster", "Create, change and deactivate reps, set their time off"


class ApiToken(models.Model):
    """A named, scoped bearer token of a user; revocable, optionally expiring."""

    name = models.CharField(max_length=100, unique=True, help_text="Who uses it: hr-sync, ci.")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    scopes = models.JSONField(default=list, help_text="Some of read, draft, publish, roster.")
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    # The secret's first characters, to recognise a token in a list (not enough to use it).
    hint = models.CharField(max_length=16, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty = never expires.")
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ("name",)
        verbose_name = "API token"
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="api_token_name_not_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({', '.join(self.scopes) or 'no scopes'})"

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()
