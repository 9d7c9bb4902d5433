"""JSON typed into forms: refused, not a server error, when nested absurdly deep.

``json.loads`` raises RecursionError (not ValueError) on thousands of nested brackets, and a
value nested a few hundred levels deep would still exhaust the recursion of whatever walks it
next (the rule compiler, the condition editor). Configuration is never deeper than a few
levels: anything past ``MAX_JSON_DEPTH`` is refused with a form error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from django import forms
from django.core.exceptions import ValidationError
from django.db import models
from django.forms.fields import InvalidJSONInput

MAX_JSON_DEPTH = 32
TOO_DEEP = f"The JSON is nested more than {MAX_JSON_DEPTH} levels deep."


def json_too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether lists and objects in ``value`` nest deeper than ``limit`` (without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def json_loads_bounded(text: str) -> Any:
    """``json.loads``, raising ValueError (like bad JSON) when nested too deep."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    if json_too_deep(value):
        raise ValueError(TOO_DEEP)
    return value


class BoundedJSONField(forms.JSONField):
    """``forms.JSONField`` refusing JSON nested deeper than ``MAX_JSON_DEPTH``."""

    def to_python(self, value: Any) -> Any:
        try:
            result = super().to_python(value)
        except RecursionError:
            raise ValidationError(TOO_DEEP, code="invalid") from None
        if json_too_deep(result):
            raise ValidationError(TOO_DEEP, code="invalid")
        return result

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)


class BoundedJsonAdmin:
    """ModelAdmin mixin: the model's JSON fields are edited with ``BoundedJSONField``."""

    formfield_overrides: ClassVar[Mapping[type[models.Field[Any, Any]], Mapping[str, Any]]] = {
        models.JSONField: {"form_class": BoundedJSONField}
    }
