"""Field paths: how a source's field map names a value below the top level of a payload.

Grammar (validated when a field map is saved, with the position of the error)::

    path     := step ( "." step | "[" selector "]" )*
    step     := key | index          a key of an object, or a list index (0, 1, -1)
    selector := index                ``contacts[0]`` is ``contacts.0``
              | name "=" value       the first object of the list whose ``name`` is ``value``
              | '"' text '"'         a key with dots or brackets in it: ``data["a.b"]``
              | key                  a form field's PHP-style name: ``data[merges][EMAIL]``
                                     is ``data.merges.EMAIL``
              |                      ``tags[]`` is ``tags`` (the list itself)

Examples: ``payload.data.Email``, ``contacts.0.email``, ``field_data[name=email].values.0``,
``answers[field.ref=work_email].email`` (a selector's name may itself be a dotted path).
A string met on the way that holds JSON (``rawRequest``, ``data.json``) is decoded in place.
A top-level key spelled exactly as the path (a form field named ``data[merges][EMAIL]`` or
``data.json``) is that key's value.
Key and selector matches are exact first, then case-insensitive. A path the payload lacks
resolves to nothing; it is not an error.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from leads.sources.base import json_in

MAX_PATH_LENGTH = 500
MAX_STEPS = 32


class PathError(ValueError):
    """A field path that does not parse; ``position`` is the 0-based offset of the problem."""

    def __init__(self, path: str, position: int, message: str) -> None:
        super().__init__(f"{message} at character {position + 1} of {path!r}")
        self.path = path
        self.position = position


@dataclass(frozen=True)
class Key:
    name: str


@dataclass(frozen=True)
class Index:
    index: int


@dataclass(frozen=True)
class Select:
    field: tuple[str, ...]  # a dotted path inside each item
    value: str


Step = Key | Index | Select

_INDEX_RE = re.compile(r"-?\d{1,6}")


def is_path(key: Any) -> bool:
    """Whether a field-map key is a path (has a dot or a bracket) rather than a plain key."""
    return isinstance(key, str) and ("." in key or "[" in key)


def _step(path: str, text: str, at: int) -> Step:
    if not text:
        raise PathError(path, at, "empty step")
    if _INDEX_RE.fullmatch(text):
        return Index(int(text))
    return Key(text)


@functools.lru_cache(maxsize=2048)
def parse_path(path: str) -> tuple[Step, ...]:
    """The steps of ``path``, or PathError saying where it goes wrong."""
    if not isinstance(path, str) or not path.strip():
        raise PathError(str(path), 0, "empty path")
    if len(path) > MAX_PATH_LENGTH:
        raise PathError(path, MAX_PATH_LENGTH, f"longer than {MAX_PATH_LENGTH} characters")
    steps: list[Step] = []
    i, n = 0, len(path)
    expect_step = True  # at the start or after a dot
    while i < n:
        char = path[i]
        if char == "[":
            close = _closing_bracket(path, i)
            selected = _selector(path, path[i + 1 : close], i + 1)
            if selected is not None:
                steps.append(selected)
            i = close + 1
            expect_step = False
            if i < n and path[i] not in ".[":
                raise PathError(path, i, "expected '.' or '[' after ']'")
        elif char == ".":
            if expect_step:
                raise PathError(path, i, "empty step")
            i += 1
            expect_step = True
            if i == n:
                raise PathError(path, i - 1, "the path ends with '.'")
        elif char == "]":
            raise PathError(path, i, "']' without '['")
        else:
            j = i
            while j < n and path[j] not in ".[]":
                j += 1
            if not expect_step:
                raise PathError(path, i, "expected '.' or '['")
            steps.append(_step(path, path[i:j], i))
            i = j
            expect_step = False
    if not steps:
        raise PathError(path, 0, "no step")
    if len(steps) > MAX_STEPS:
        raise PathError(path, 0, f"more than {MAX_STEPS} steps")
    return tuple(steps)


def _closing_bracket(path: str, start: int) -> int:
    i = start + 1
    quoted = i < len(path) and path[i] == '"'
    if quoted:
        end = path.find('"', i + 1)
        if end < 0:
            raise PathError(path, i, "unclosed '\"'")
        i = end + 1
        if i >= len(path) or path[i] != "]":
            raise PathError(path, i, "expected ']' after the quoted key")
        return i
    end = path.find("]", i)
    if end < 0:
        raise PathError(path, start, "unclosed '['")
    return end


def _selector(path: str, text: str, at: int) -> Step | None:
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        if len(text) == 2:
            raise PathError(path, at, "empty quoted key")
        return Key(text[1:-1])
    if _INDEX_RE.fullmatch(text.strip()):
        return Index(int(text.strip()))
    name, sep, value = text.partition("=")
    if not sep:
        # A form field's PHP-style name (data[merges][EMAIL], q3_name[first], tags[]): [key]
        # is the key, [] the list itself.
        return Key(text.strip()) if text.strip() else None
    name = name.strip()
    if not name:
        raise PathError(path, at, "the selector has no name before '='")
    parts = tuple(name.split("."))
    if any(not part for part in parts):
        raise PathError(path, at, "empty step in the selector's name")
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return Select(parts, value)


def _key(node: dict[str, Any], name: str) -> Any:
    if name in node:
        return node[name]
    folded = name.casefold()
    for key, value in node.items():
        if isinstance(key, str) and key.casefold() == folded:
            return value
    return _MISSING


_MISSING: Any = object()


def _matches(item: Any, field: tuple[str, ...], value: str) -> bool:
    node = item
    for part in field:
        node = json_in(node)
        if not isinstance(node, dict):
            return False
        node = _key(node, part)
        if node is _MISSING:
            return False
    if isinstance(node, bool) or node is None or isinstance(node, dict | list):
        return False
    text = str(node)
    return text == value or text.casefold() == value.casefold()


def resolve(record: Any, path: str) -> tuple[bool, Any]:
    """(found, value) of ``path`` in ``record``; a bad path or a missing step is (False, None)."""
    if isinstance(record, dict) and isinstance(path, str) and path in record:
        return True, record[path]  # a key that looks like a path ("data.json", "tags[]")
    try:
        steps = parse_path(path)
    except PathError:
        return False, None
    node = record
    i = 0
    while i < len(steps):
        step = steps[i]
        i += 1
        node = json_in(node)
        if isinstance(step, Key):
            if isinstance(node, list) and _INDEX_RE.fullmatch(step.name):
                step = Index(int(step.name))
            elif not isinstance(node, dict):
                return False, None
            else:
                found = _key(node, step.name)
                # A key with a dot in it (Unbounce's "data.json" form field) is the next steps
                # joined, when the key alone is not there.
                run = i
                while found is _MISSING and run < len(steps) and isinstance(steps[run], Key):
                    names = [s.name for s in steps[i - 1 : run + 1] if isinstance(s, Key)]
                    joined = ".".join(names)
                    run += 1
                    found = _key(node, joined)
                    if found is not _MISSING:
                        i = run
                if found is _MISSING:
                    return False, None
                node = found
                continue
        if isinstance(step, Index):
            if not isinstance(node, list) or not -len(node) <= step.index < len(node):
                return False, None
            node = node[step.index]
        elif isinstance(step, Select):
            if not isinstance(node, list):
                return False, None
            node = next((item for item in node if _matches(item, step.field, step.value)), _MISSING)
            if node is _MISSING:
                return False, None
    return True, node


def field_map_errors(field_map: Any) -> dict[str, str]:
    """{key: what is wrong} for every field-map key that looks like a path and does not parse."""
    errors: dict[str, str] = {}
    if not isinstance(field_map, dict):
        return errors
    for key in field_map:
        if is_path(key):
            try:
                parse_path(key)
            except PathError as exc:
                errors[key] = str(exc)
    return errors
