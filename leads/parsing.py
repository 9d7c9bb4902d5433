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
    if value.isascii():  # ASCII always encodes
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(f"{where}: lone surrogate escapes are not valid text.") from None


def check_value(value: Any, limits: Limits, where: str = "body", depth: int = 0) -> None:
    """Raise ``IntakeError`` unless ``value`` is within the limits, iteratively bounded."""
    if type(value) is dict and depth < limits.max_depth and len(value) <= limits.max_keys:
        # A flat object (most leads): the same checks in the same order as the walk below
        # (every key in order, then the values from the last), without its stack.
        for key in value:
            if len(key) > limits.max_key:
                raise _bad(f"{where}: a key is longer than {limits.max_key} characters.")
            _check_text(key, limits, where)
        for item in reversed(value.values()):
            kind = type(item)
            if kind is str:
                _check_text(item, limits, where)
            elif kind is float:
                if item != item or item in (float("inf"), float("-inf")):
                    raise _bad(f"{where}: NaN and Infinity are not JSON numbers.")
            elif kind is not int and kind is not bool and item is not None:
                break  # a container (or anything else): the walk checks it all
        else:
            return
    _check_walk(value, limits, where, depth)


def _check_walk(value: Any, limits: Limits, where: str, depth: int) -> None:
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
    obj = dict(pairs)  # in C; only an object that lost a key is looked at key by key
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise _bad(f"Duplicate key {key[:100]!r} in a JSON object.")
            seen.add(key)
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


# Single-byte charsets a form may declare (a Latin-1 page of an old CMS, a German PHP form); any
# other declared charset, or none, is read as UTF-8.
_FORM_CHARSETS = {
    "iso-8859-1": "cp1252",  # as browsers and WHATWG read it
    "latin1": "cp1252",
    "latin-1": "cp1252",
    "windows-1252": "cp1252",
    "cp1252": "cp1252",
    "iso-8859-15": "iso-8859-15",
}


def _parse_urlencoded(body: bytes, limits: Limits, charset: str = "") -> dict[str, Any]:
    """Strict: the body and every percent-escape must be UTF-8 (no silent U+FFFD), or the
    single-byte charset the request declares (``charset=windows-1252``), strictly too."""
    encoding = _FORM_CHARSETS.get(charset.strip().strip('"').lower(), "utf-8")
    if encoding == "utf-8":
        text = decode_utf8(body)
    else:
        try:
            text = body.decode(encoding)
        except UnicodeDecodeError:
            raise _bad(f"The form body is not valid {charset} text.") from None
    try:
        pairs = parse_qsl(
            text,
            keep_blank_values=True,
            strict_parsing=False,
            encoding=encoding,
            errors="strict",
            max_num_fields=limits.max_keys,
        )
    except UnicodeDecodeError:
        if encoding != "utf-8":
            raise _bad(f"A percent-escape in the form body is not valid {charset}.") from None
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
            charset = (request.content_params or {}).get("charset", "")
            record = _parse_urlencoded(request.body, limits, charset)
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


# --- CSV --------------------------------------------------------------------------------------
#
# CSV arrives from spreadsheets and webinar tools, not from programs: Excel in Germany or France
# writes ";" and Windows-1252, "Unicode text" is UTF-16 with tabs, and Zoom, GoToWebinar and ON24
# reports open with title rows (and Zoom's with host and panelist sections) before the people.
# So the reading guesses the encoding, the delimiter and the header row, each checked against
# the rows that follow, and stays strict about everything else.

_CSV_DELIMITERS = (",", ";", "\t", "|")  # on a tie, the earlier one wins
_CSV_SAMPLE_CHARS = 64 * 1024
_CSV_HEADER_SCAN_ROWS = 500  # preamble and host/panelist sections come before the people
_CSV_SHAPE_ROWS = 20
# A section title row ("Attendee Details") that announces the people we want.
_CSV_PEOPLE_SECTION = ("attendee", "registrant", "participant", "teilnehmer", "registr")


def _plausible_cp1252(text: str) -> bool:
    """Whether Windows-1252 text reads like words rather than misread binary or UTF-16.

    In real Latin-script text an accented letter sits in a word with unaccented ones ("Müller",
    "Größe") or stands alone ("à"); a word made only of non-ASCII letters ("ÿþ") is a byte order
    mark or binary read as text.
    """
    word: list[str] = []
    for ch in text + " ":
        if ch.isalpha():
            word.append(ch)
            continue
        if len(word) > 1 and not any(c.isascii() for c in word):
            return False
        word = []
    return True


def decode_csv(body: bytes) -> str:
    """A CSV upload as text: UTF-8 (BOM or not), UTF-16 with a BOM, else Windows-1252.

    Only the CSV paths fall back like this; JSON and form bodies stay strictly UTF-8.
    """
    if body.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return body.decode("utf-16")  # the BOM picks the byte order and is dropped
        except UnicodeDecodeError:
            raise _bad("The CSV has a UTF-16 byte order mark but is not valid UTF-16.") from None
    try:
        return body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        utf8_error = exc.start
    try:
        text = body.decode("cp1252")
    except UnicodeDecodeError:
        text = ""
    if text and _plausible_cp1252(text):
        return text
    raise _bad(
        f"The CSV is neither UTF-8 (byte {utf8_error}), UTF-16 with a byte order mark, "
        "nor Windows-1252 text."
    )


def _csv_rows(text: str, delimiter: str, *, strict: bool) -> list[list[str]]:
    """Rows of ``text``; with ``strict=False`` (a sample, maybe cut mid-row) the rows read
    before the first error."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    rows: list[list[str]] = []
    try:
        for row in reader:
            rows.append(row)
    except csv.Error as exc:
        if strict:
            raise _bad(f"The CSV could not be read: {exc}") from None
    return rows


def _filled(row: list[str]) -> list[str]:
    return [cell.strip() for cell in row if cell.strip()]


def _width(row: list[str]) -> int:
    """The row's length without trailing blank cells (spreadsheets pad rows with them)."""
    width = len(row)
    while width and not row[width - 1].strip():
        width -= 1
    return width


def _canonical_cells(row: list[str]) -> int:
    from leads.normalize import canonical_key  # leads.normalize is Django-free and heavy

    return sum(1 for cell in row if cell.strip() and canonical_key(cell.strip()) is not None)


def _is_title(row: list[str]) -> bool:
    """A title or section row: one filled cell, the first ("Attendee Details")."""
    filled = _filled(row)
    return len(filled) == 1 and bool(row) and row[0].strip() == filled[0]


def _consistent_rows(rows: list[list[str]], header_at: int) -> int:
    """How many of the rows after the header have its shape (until the section ends)."""
    width = _width(rows[header_at])
    count = 0
    for row in rows[header_at + 1 : header_at + 1 + _CSV_SHAPE_ROWS]:
        if not _filled(row):
            continue
        if _is_title(row) and width > 1 and _width(row) <= 1:
            break
        if 1 <= _width(row) <= width:
            count += 1
    return count


@dataclass(frozen=True)
class _Header:
    index: int
    canonical: int
    consistent: int
    people_section: bool


def _find_header(rows: list[list[str]]) -> _Header | None:
    """The header row: the first with several filled cells, one of them a known field, and
    rows of its shape below — in the attendee/registrant section when the report has several.
    Without one, the first non-blank row (a plain CSV whose columns the field map names)."""
    candidates: list[_Header] = []
    title = ""
    for index, row in enumerate(rows[:_CSV_HEADER_SCAN_ROWS]):
        filled = _filled(row)
        if not filled:
            continue
        if _is_title(row):
            title = filled[0].casefold()
        canonical = _canonical_cells(row)
        if len(filled) >= 2 and canonical:
            consistent = _consistent_rows(rows, index)
            people = any(word in title for word in _CSV_PEOPLE_SECTION)
            candidates.append(_Header(index, canonical, consistent, people))
    if candidates:
        in_section = [c for c in candidates if c.people_section and c.consistent]
        shaped = [c for c in candidates if c.consistent]
        return (in_section or shaped or candidates)[0]
    for index, row in enumerate(rows):
        if _filled(row):
            return _Header(index, _canonical_cells(row), _consistent_rows(rows, index), False)
    return None


def _guess_delimiter(text: str) -> str:
    """The delimiter whose header names the most known fields and whose rows keep its shape."""
    sample = text[:_CSV_SAMPLE_CHARS]
    best, best_score = ",", (-1, -1, -1, -1)
    for rank, delimiter in enumerate(_CSV_DELIMITERS):
        if delimiter not in sample:
            continue
        rows = _csv_rows(sample, delimiter, strict=False)
        header = _find_header(rows)
        if header is None:
            continue
        width = _width(rows[header.index])
        if width < 2:
            continue
        score = (header.canonical, min(header.consistent, _CSV_SHAPE_ROWS), width, -rank)
        if score > best_score:
            best, best_score = delimiter, score
    return best


def _section_ends(rows: list[list[str]], at: int, width: int) -> bool:
    """Whether ``rows[at]`` starts another report section: a title row followed by a header
    (mostly field names, nobody's e-mail). Only reports have sections: the caller asks only
    when the file had title rows before its header, so a plain CSV is never cut short."""
    if not _is_title(rows[at]) or width <= 1 or _width(rows[at]) > 1:
        return False
    for row in rows[at + 1 : at + 4]:
        filled = _filled(row)
        if filled:
            return (
                len(filled) >= 2
                and _canonical_cells(row) >= 1
                and not any("@" in cell or any(ch.isdigit() for ch in cell) for cell in filled)
            )
    return False  # the last row: a person with only the first cell filled


def parse_csv(content: str | bytes, *, max_records: int, limits: Limits) -> list[dict[str, Any]]:
    """CSV with a header row into records; blank cells are left out of the record.

    ``content`` is text, or the raw upload (then ``decode_csv`` picks the encoding). The
    delimiter and the header row are found as described above; rows after the people's
    section (a report's next section) are not records.
    """
    text = decode_csv(content) if isinstance(content, bytes) else content
    if text.startswith("\ufeff"):
        text = text[1:]
    delimiter = _guess_delimiter(text)
    rows = _csv_rows(text, delimiter, strict=True)
    header = _find_header(rows)
    if header is None:
        raise _bad("The CSV has no header row.")
    header_row = rows[header.index]
    names = [h.strip() for h in header_row[: _width(header_row)]]
    if len(set(names)) != len(names):
        raise _bad("The CSV header repeats a column name.")
    if len(names) > limits.max_keys:
        raise _bad(f"The CSV has more than {limits.max_keys} columns.")
    records: list[dict[str, Any]] = []
    report = any(_filled(row) for row in rows[: header.index])  # title rows before the header
    for at in range(header.index + 1, len(rows)):
        row = rows[at]
        if not any(cell.strip() for cell in row):
            continue
        if report and _section_ends(rows, at, len(names)):
            break
        if len(records) >= max_records:
            raise IntakeError(
                413, "batch_too_large", f"A batch holds at most {max_records} records."
            )
        record: dict[str, Any] = {
            name: cell for name, cell in zip(names, row, strict=False) if cell != ""
        }
        extra = [cell for cell in row[len(names) :] if cell.strip()]
        if extra:
            record["_extra_cells"] = row[len(names) :]
        records.append(record)
    return records


class StrictJSONParser(JSONParser):
    """DRF's JSON parser with the intake's rules: bounded depth and sizes, never a 500."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        body = stream.read() if stream is not None else b""
        try:
            return parse_json(body, Limits())
        except IntakeError as error:
            raise ParseError(error.message) from None
