"""How a lead value is read by conditions: its text form, its number, its emptiness.

Lead values arrive as JSON sends them (custom keys) or as normalisation left them, so every reader
here accepts anything and never raises: an odd value makes a condition false, never an error.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

SHOWN_MAX = 60  # characters of a lead value quoted in a trace line


def text_of(value: Any) -> str | None:
    """Comparable text of a scalar value (trimmed, case-folded); None if missing or not scalar."""
    cls = value.__class__
    if cls is str:
        return value.strip().casefold()
    if value is None:
        return None
    if cls is bool:
        return "true" if value else "false"
    if cls is int:
        return str(value)
    if cls is float or isinstance(value, Decimal):
        number = float(value)
        # 1000.0 reads as "1000", so a number sent as a float still equals the text "1000".
        if math.isfinite(number) and number.is_integer():
            return str(int(number))
        return str(value).casefold()
    if isinstance(value, str):
        return value.strip().casefold()
    if isinstance(value, int):
        return str(int(value))
    return None


_NUMERIC_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def number_of(value: Any) -> int | float | None:
    """The finite number a value holds (numbers, numeric text), else None; yes/no is no number."""
    cls = value.__class__
    if cls is int:
        return value
    if cls is float:
        return value if math.isfinite(value) else None
    if cls is bool or value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        # Plain ASCII decimals only: float() would also take "1_000" and other scripts' digits.
        if not _NUMERIC_TEXT.fullmatch(text):
            return None
        number = float(text)
        return number if math.isfinite(number) else None
    if isinstance(value, Decimal):
        return float(value) if value.is_finite() else None
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    return None


def bool_of(value: Any) -> bool | None:
    """A yes/no value: booleans, or the text "true"/"false" in any case; else None."""
    if value is True or value is False:
        return value
    if isinstance(value, str):
        text = value.strip().casefold()
        if text == "true":
            return True
        if text == "false":
            return False
    return None


def is_empty(value: Any) -> bool:
    """Missing or empty: None, blank text, or an empty list/object (False and 0 are values)."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, list | tuple | dict | set | frozenset):
        return not value
    return False


def shown(value: Any) -> str:
    """A lead value as a trace line shows it: quoted and shortened text, plain numbers."""
    if value is None:
        return "missing"
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return "empty"
        if len(text) > SHOWN_MAX:
            text = text[: SHOWN_MAX - 1] + "…"
        return f'"{text}"'
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, list | tuple):
        return "a list" if value else "empty"
    if isinstance(value, dict):
        return "an object" if value else "empty"
    return f"a {type(value).__name__}"
