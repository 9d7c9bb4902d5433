"""Configuration changes in the audit trail: who changed what, when, from which value to which.

Every admin that edits routing configuration (reps, teams and their members, territories,
accounts, value lists, rules and versions, test cases, sources, webhook endpoints) uses
``AuditedConfigAdmin``; custom actions and editor pages call ``config_change_record``. Each
change is a ``config_changed`` event on the routing chain (no lead), in the transaction of the
change. Secrets (tokens, their hashes, HMAC and signing secrets, passwords) are redacted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import models
from django.http import HttpRequest

from audit.models import EventType
from audit.services import event_record

REDACTED = "[redacted]"
_SECRET_WORDS = ("secret", "token", "hash", "password")
_NOT_CONFIG = frozenset({"created_at", "updated_at"})  # bookkeeping, not a change of mind


def _is_secret(field: str) -> bool:
    return any(word in field for word in _SECRET_WORDS)


def _without_secrets(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            key: (
                REDACTED
                if value[key] and _is_secret(str(key).lower())
                else _without_secrets(value[key])
            )
            for key in value
        }
    return value


def actor_of(request: HttpRequest | None) -> str:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return "system"
    return f"user:{user.get_username()}"


def values_of(obj: models.Model) -> dict[str, Any]:
    """The object's stored columns as they are in memory (foreign keys as ids)."""
    return {field.attname: getattr(obj, field.attname) for field in obj._meta.concrete_fields}


def stored_values(obj: models.Model) -> dict[str, Any] | None:
    """The object's row as it is in the database now (None when there is none)."""
    if obj.pk is None:
        return None
    return type(obj)._base_manager.filter(pk=obj.pk).values().first()


def changes_between(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
) -> dict[str, dict[str, Any]]:
    """``{field: {"before": ..., "after": ...}}`` for every field that differs; secrets redacted."""
    before, after = before or {}, after or {}
    changes = {}
    for field in sorted(set(before) | set(after)):
        if field in _NOT_CONFIG or field == "id":
            continue
        old, new = before.get(field), after.get(field)
        if old == new:
            continue
        if _is_secret(field):
            old, new = (REDACTED if old else old), (REDACTED if new else new)
        else:  # a JSON column may hold a secret by name (a source's kind option verify_token)
            old, new = _without_secrets(old), _without_secrets(new)
        changes[field] = {"before": old, "after": new}
    return changes


def config_change_record(
    *,
    actor: str,
    obj: models.Model,
    action: str,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """One ``config_changed`` event: ``action`` is added, changed, deleted or an action's name."""
    changes = changes_between(before, after)
    if action == "changed" and not changes and not extra:
        return  # saved unchanged
    event_record(
        type=EventType.CONFIG_CHANGED,
        actor=actor,
        data={
            "model": obj._meta.label,
            "key": str(obj.pk),
            "object": str(obj)[:200],
            "action": action,
            "changes": changes,
            **(extra or {}),
        },
    )


def config_changes_record(
    *,
    actor: str,
    objects: Iterable[models.Model],
    action: str,
    before: Mapping[Any, Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
) -> None:
    """A bulk action's events: each object against its ``before`` values (by pk), re-read."""
    for obj in objects:
        config_change_record(
            actor=actor,
            obj=obj,
            action=action,
            before=before.get(obj.pk),
            after=stored_values(obj),
            extra=extra,
        )


class AuditedConfigAdmin:
    """ModelAdmin mixin: every add, change and delete of the admin (and of its inlines) is a
    ``config_changed`` event with the changed values, beside Django's own LogEntry."""

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        obj = super().get_object(request, object_id, from_field)  # type: ignore[misc]
        if obj is not None:
            snapshots = request.__dict__.setdefault("_config_before", {})
            snapshots[(obj._meta.label, obj.pk)] = values_of(obj)
        return obj

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        config_change_record(
            actor=actor_of(request), obj=obj, action="added", after=stored_values(obj)
        )
        return super().log_addition(request, obj, message)  # type: ignore[misc]

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        snapshots = request.__dict__.get("_config_before", {})
        before = snapshots.get((obj._meta.label, obj.pk))
        if before is not None:  # the change form; custom pages record their own events
            config_change_record(
                actor=actor_of(request),
                obj=obj,
                action="changed",
                before=before,
                after=stored_values(obj),
            )
        return super().log_change(request, obj, message)  # type: ignore[misc]

    def log_deletions(self, request: HttpRequest, queryset: Any) -> Any:
        for obj in queryset:
            config_change_record(
                actor=actor_of(request), obj=obj, action="deleted", before=values_of(obj)
            )
        return super().log_deletions(request, queryset)  # type: ignore[misc]

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        # The rows as stored: the bound forms have already changed their instances.
        ids = [f.instance.pk for f in formset.initial_forms if f.instance.pk is not None]
        rows = formset.model._base_manager.filter(pk__in=ids).values()
        before = {row["id"]: row for row in rows}
        super().save_formset(request, form, formset, change)  # type: ignore[misc]
        actor = actor_of(request)
        for obj in formset.new_objects:
            config_change_record(actor=actor, obj=obj, action="added", after=stored_values(obj))
        for obj, _fields in formset.changed_objects:
            config_change_record(
                actor=actor,
                obj=obj,
                action="changed",
                before=before.get(obj.pk),
                after=stored_values(obj),
            )
        for obj in formset.deleted_objects:
            config_change_record(actor=actor, obj=obj, action="deleted", before=before.get(obj.pk))
