"""Reading intake bodies safely: JSON, form-encoded, multipart and CSV, with hostile-input limits.

Everything a client can send ends here as either plain records (dicts of JSON values) or an
``IntakeError`` carrying the API's status and code — never an unhandled exception, and never a
value PostgreSQL would refuse to store (NUL characters, lone surrogates).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation, TooManyFieldsSent
from django.http import HttpRequest, QueryDict
from django.http.multipartparser import MultiPartParserError
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class IntakeError(Exception):
    """A request the kickoff refuses, with the HTTP status and api.md error code."""

    def __init__(
        self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


@dataclass(frozen=True)
class Limits:
    """Hostile-input limits; values come from settings."""

    max_depth: int = 32
    max_keys: int = 1000
    max_string: int = 64 * 1024
    max_key: int = 256


def _bad(message: str) -> IntakeError:
    return IntakeError(400, "invalid_body", message)


def _check_text(value: str, limits: Limits, where: str) -> None:
    if len(value) > limits.max_string:
        raise _bad(f"{where}: a string is longer than {limits.max_string} characters.")
    if "\x00" in value:
        raise _bad(f"{where}: NUL characters are not allowed.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(f"{where}: lone surrogate escapes are not valid text.") from None


def check_value(value: Any, limits: Limits, where: str = "body", depth: int = 0) -> None:
    """Raise ``IntakeError`` unless ``value`` is within the limits, iteratively bounded."""
    stack: list[tuple[Any, int]] = [(value, depth)]
    while stack:
        item, level = stack.pop()
        if level > limits.max_depth:
            raise _bad(f"{where}: nested deeper than {limits.max_depth} levels.")
        if isinstance(item, str):
            _check_text(item, limits, where)
        elif isinstance(item, dict):
            if len(item) > limits.max_keys:
                raise _bad(f"{where}: an object has more than {limits.max_keys} keys.")
            for key, sub in item.items():
                if len(key) > limits.max_key:
                    raise _bad(f"{where}: a key is longer than {limits.max_key} characters.")
                _check_text(key, limits, where)
                stack.append((sub, level + 1))
        elif isinstance(item, list):
            if len(item) > limits.max_keys:
                raise _bad(f"{where}: a list has more than {limits.max_keys} items.")
            stack.extend((sub, level + 1) for sub in item)
        elif isinstance(item, float) and (item != item or item in (float("inf"), float("-inf"))):
            raise _bad(f"{where}: NaN and Infinity are not JSON numbers.")


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _bad(f"Duplicate key {key[:100]!r} in a JSON object.")
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise _bad(f"{name} is not a JSON number.")


def decode_utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _bad(f"The body is not valid UTF-8 (byte {exc.start}).") from None


def parse_json(body: bytes, limits: Limits, *, check: bool = True) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN, bounded depth, keys and strings.

    With ``check=False`` the caller applies ``check_value`` itself (a batch checks its length
    first, then each record).
    """
    text = decode_utf8(body)
    if not text.strip():
        raise _bad("The body is empty.")
    # json's C scanner raises RecursionError on absurd nesting; check_value bounds the rest.
    try:
        value = json.loads(
            text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant
        )
    except IntakeError:
        raise
    except (ValueError, RecursionError) as exc:
        raise _bad(f"The body is not valid JSON: {str(exc)[:200]}") from None
    if check:
        check_value(value, limits)
    return value


def media_type(request: HttpRequest) -> str:
    return (request.content_type or "").split(";")[0].strip().lower()


def _querydict_to_record(data: QueryDict) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for key in data:
        values = data.getlist(key)
        record[key] = values[0] if len(values) == 1 else values
    return record


def _parse_urlencoded(body: bytes, limits: Limits) -> dict[str, Any]:
    """Strict: the body and every percent-escape must be UTF-8 (no silent U+FFFD)."""
    text = decode_utf8(body)
    try:
        pairs = parse_qsl(
            text,
            keep_blank_values=True,
            strict_parsing=False,
            encoding="utf-8",
            errors="strict",
            max_num_fields=limits.max_keys,
        )
    except UnicodeDecodeError:
        raise _bad("A percent-escape in the form body is not valid UTF-8.") from None
    except ValueError:
        raise _bad(f"More than {limits.max_keys} form fields.") from None
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            existing = record[key]
            record[key] = [*existing, value] if isinstance(existing, list) else [existing, value]
        else:
            record[key] = value
    return record


def _check_multipart_end(request: HttpRequest) -> None:
    """Django's parser tolerates a body that never closes its boundary; we do not."""
    boundary = (request.content_params or {}).get("boundary", "")
    if not boundary:
        raise _bad("The multipart body has no boundary parameter.")
    closing = b"--" + boundary.encode("latin-1", "replace") + b"--"
    if not request.body.rstrip(b"\r\n").endswith(closing):
        raise _bad("The multipart body does not end with its closing boundary.")


def _check_no_replacement(body: bytes, record: dict[str, Any]) -> None:
    """Invalid UTF-8 in a multipart value is silently replaced by U+FFFD; refuse it instead.

    When the body itself never contains U+FFFD, any U+FFFD in the parsed values came from
    bytes that were not UTF-8.
    """
    if "\ufffd".encode() in body:
        return
    for key, value in record.items():
        values = value if isinstance(value, list) else [value]
        if "\ufffd" in key or any("\ufffd" in v for v in values if isinstance(v, str)):
            raise _bad("A multipart field is not valid UTF-8.")


def parse_form(request: HttpRequest, limits: Limits) -> dict[str, Any]:
    """A form-encoded or multipart body as one record (uploaded files are not lead data)."""
    try:
        if media_type(request) == "application/x-www-form-urlencoded":
            record = _parse_urlencoded(request.body, limits)
        else:
            _check_multipart_end(request)
            record = _querydict_to_record(request.POST)
            _check_no_replacement(request.body, record)
    except TooManyFieldsSent:
        raise _bad(f"More than {limits.max_keys} form fields.") from None
    except RequestDataTooBig:
        raise IntakeError(413, "body_too_large", "The body is too large.") from None
    except (MultiPartParserError, SuspiciousOperation, ValueError) as exc:
        raise _bad(f"The form body could not be read: {str(exc)[:200]}") from None
    check_value(record, limits)
    return record


def parse_csv(text: str, *, max_records: int, limits: Limits) -> list[dict[str, Any]]:
    """CSV with a header row into records; blank cells are left out of the record."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if not header or not any(h.strip() for h in header):
            raise _bad("The CSV has no header row.")
        names = [h.strip() for h in header]
        if len(set(names)) != len(names):
            raise _bad("The CSV header repeats a column name.")
        if len(names) > limits.max_keys:
            raise _bad(f"The CSV has more than {limits.max_keys} columns.")
        records: list[dict[str, Any]] = []
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if len(records) >= max_records:
                raise IntakeError(
                    413, "batch_too_large", f"A batch holds at most {max_records} records."
                )
            record: dict[str, Any] = {
                name: cell for name, cell in zip(names, row, strict=False) if cell != ""
            }
            if len(row) > len(names):
                record["_extra_cells"] = row[len(names) :]
            records.append(record)
    except csv.Error as exc:
        raise _bad(f"The CSV could not be read: {exc}") from None
    return records


class StrictJSONParser(JSONParser):
    """DRF's JSON parser with the intake's rules: bounded depth and sizes, never a 500."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        body = stream.read() if stream is not None else b""
        try:
            return parse_json(body, Limits())
        except IntakeError as error:
            raise ParseError(error.message) from None
