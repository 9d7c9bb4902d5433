"""Rules as code (rules-format.md): the document in (``rules_import``) and out (``rules_export``),
and the ruleset version services (``ruleset_add_draft``, ``ruleset_copy``, ``ruleset_publish``).

Import contract:

- The whole document is validated before anything is written; every problem is reported with
  its path (``reps[2].email: ...``) in one :class:`RulesFileErrors`, and nothing is written.
  References may point at objects defined in the same file or already in the database.
- Objects are upserted by natural key: source slug, rep e-mail (ignoring case), team name,
  territory name, account domain, value-list name, test case name. A key present in an entry
  sets that field; a key left out leaves an existing object's field as it is (a new object gets
  the default), so operational state such as ``out_of_office_until`` survives a file that does
  not mention it. A team's ``members``, when given, replace its memberships in file order.
- Time off (``reps[].absences``, ``holiday_calendars``) is validated here and written and
  exported by ``routing.timeoff.file``. A rep's absences are read as the roster API reads them
  (a date-time without a UTC offset is a wall-clock time in the rep's zone: the entry's
  ``timezone``, else the stored rep's) and, when given, only added: a file never changes or
  deletes planned leave, which is live state (the roster API, the admin).
- Nothing is deleted, unless pruned (``rules_plan(prune=True)`` then ``rules_prune``): then in
  every section the file has, what it does not name is deleted, refusing (with the reason,
  nothing deleted) what live leads or live rules still need; references must then point at
  objects the file itself defines.
- A new source gets the file's ``token`` or a fresh one (returned once, in
  ``ImportResult.source_tokens``). An existing source's token is not changed by an import
  (rotate it in the admin) unless it has none.
- The ruleset becomes a new draft version, unless it is identical (name and rules) to the
  published version or to the latest version while that is a draft: then that version is
  reused, so importing one file twice creates one version. ``publish=True`` publishes it.

Export writes every key of every object (but a rep's live state, ``active``,
``out_of_office_until`` and planned ``absences``, which a file may set but an export never
carries) in a fixed order
(sources by slug, reps by e-mail,
teams by name, territories by id, which is their tie-break order, accounts by domain, value
lists by name, rules by priority, test cases by name) and never a token, so export -> import ->
export is identical.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from zoneinfo import ZoneInfo

import yaml
from django.core.exceptions import ValidationError
from django.core.validators import validate_email, validate_slug
from django.db import IntegrityError, connection, models, transaction
from django.db.models import Max
from django.db.models.functions import Lower
from django.utils import timezone

from audit.models import EventType
from audit.services import event_record
from leads.models import Source, token_digest
from leads.services import new_token
from leads.sources import kind_get, kinds
from leads.sources.paths import field_map_errors
from routing.engine import (
    MAX_MEMBER_WEIGHT,
    MAX_TEAM_WEIGHT,
    RuleError,
    RuleErrors,
    compile_ruleset,
)
from routing.engine.availability import NonexistentLocalTime, wall_clock_at, zone_named
from routing.models import (
    POSTAL_PREFIX_MAX_LENGTH,
    REGION_MAX_LENGTH,
    Account,
    Assignment,
    ExpectedStatus,
    OnSlaBreach,
    Problems,
    Rep,
    RoutingTestCase,
    Rule,
    RuleSet,
    RuleSetStatus,
    Team,
    TeamMembership,
    TeamStrategy,
    Territory,
    ValueList,
    codes_errors,
    countries_errors,
    domain_errors,
    strings_errors,
    timezone_errors,
    working_hours_errors,
)
from routing.selectors import (
    rule_references,
    ruleset_by_version,
    ruleset_latest,
    ruleset_published,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    Actor = AbstractBaseUser | None

SECTIONS = (
    "sources",
    "reps",
    "teams",
    "holiday_calendars",
    "territories",
    "accounts",
    "value_lists",
    "ruleset",
    "test_cases",
)
# The sections --prune manages: in each one the file has, what it no longer names is deleted.
PRUNED_SECTIONS = (
    "test_cases",
    "accounts",
    "territories",
    "teams",
    "reps",
    "value_lists",
    "sources",
)
_INT_MAX = 2**31 - 1  # IntegerField on every supported database
_MIN_TOKEN_LENGTH = 16
_VERSION_ATTEMPTS = 5


class RulesFileErrors(RuleErrors):
    """Every problem found in a rules file, each ``path: message``; nothing was written."""


@dataclass(frozen=True)
class ImportResult:
    """What an import did: the ruleset version it produced, and tokens to show once."""

    ruleset: RuleSet
    created: bool  # False when an identical existing version was reused
    source_tokens: dict[str, str] = field(default_factory=dict)  # new source slug -> token
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # section -> created...


# --- Reading files ------------------------------------------------------------------------------


class _YamlLoader(yaml.SafeLoader):
    """``safe_load`` with YAML 1.2 plain scalars: NO (Norway) and 18:00 stay text."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag.rsplit(":", 1)[-1] not in {"bool", "int", "float", "timestamp"}
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^-?(?:0|[1-9][0-9]*)$"), list("-0123456789")
)
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)$"),
    list("-0123456789"),
)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def rules_parse(text: str, *, yaml_format: bool = False) -> Any:
    """Parse a rules document (JSON, or YAML when ``yaml_format``); raises RulesFileErrors."""
    if yaml_format:
        try:
            return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            raise RulesFileErrors([RuleError("", f"not valid YAML: {exc}")]) from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        detail = (
            f"{exc.msg} (line {exc.lineno}, column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else str(exc)
        )
        raise RulesFileErrors([RuleError("", f"not valid JSON: {detail}")]) from None


def rules_read(path: str | Path) -> Any:
    """Read and parse a rules file: YAML when it ends in .yaml/.yml, JSON otherwise."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RulesFileErrors([RuleError("", f"cannot read {file}: {exc}")]) from None
    return rules_parse(text, yaml_format=file.suffix.lower() in {".yaml", ".yml"})


# --- Validation ---------------------------------------------------------------------------------


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value[:80], ensure_ascii=False)
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_ABSENT: Any = object()  # a key the entry does not have

_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {  # section -> (allowed, required)
    "sources": (
        frozenset(
            {
                "slug",
                "name",
                "token",
                "kind",
                "kind_options",
                "allow_query_token",
                "field_map",
                "rate_limit_per_minute",
            }
        ),
        frozenset({"slug", "name"}),
    ),
    "reps": (
        frozenset(
            {
                "email",
                "name",
                "active",
                "out_of_office_until",
                "timezone",
                "working_hours",
                "max_open",
                "max_per_day",
                "absences",
            }
        ),
        frozenset({"email", "name"}),
    ),
    "holiday_calendars": (
        frozenset({"name", "country", "subdivision", "reps", "teams", "days"}),
        frozenset({"name"}),
    ),
    "teams": (
        frozenset({"name", "strategy", "respect_working_hours", "sla_minutes", "members"}),
        frozenset({"name"}),
    ),
    "territories": (
        frozenset({"name", "countries", "regions", "postal_prefixes", "team", "rep"}),
        frozenset({"name", "countries"}),
    ),
    "accounts": (frozenset({"domain", "name", "owner", "tier"}), frozenset({"domain"})),
    "value_lists": (frozenset({"name", "values"}), frozenset({"name", "values"})),
    "test_cases": (
        frozenset({"name", "lead", "source", "expected_status", "expected_rep", "expected_team"}),
        frozenset({"name", "lead", "expected_status"}),
    ),
}


@dataclass
class _Entry:
    """One validated entry: its natural key and the model fields the file sets."""

    key: str
    fields: dict[str, Any]
    refs: dict[str, Any] = field(default_factory=dict)  # team/rep/owner names, members


@dataclass
class _Plan:
    sections: dict[str, list[_Entry]]
    ruleset_name: str
    rules: list[dict[str, Any]]  # in the stored shape, by priority
    new_source_tokens: dict[str, str | None]  # new source slug -> file token (None = generate)
    present: frozenset[str] = frozenset()  # the sections the file has
    prune: bool = False  # references resolve within the file's own sections (``--prune``)


class _Checker:
    def __init__(
        self, data: Mapping[str, Any], *, prune: bool = False, lookups: bool = True
    ) -> None:
        self.data = data
        self.prune = prune
        self.errors: list[RuleError] = []
        self.lookups = lookups
        self._rep_zones: dict[str, str] | None = None
        if not lookups:  # one entry's own fields (the roster API): no references to resolve
            self.rep_ids: dict[str, int] = {}
            self.team_ids: dict[str, int] = {}
            self.territory_names: set[str] = set()
            self.source_tokens: dict[str, str] = {}
            self.source_slugs: set[str] = set()
            self.value_lists: dict[str, list[str]] = {}
            return
        # Under --prune, a section the file has is the whole of it: what it does not define is
        # deleted, so a reference must point at an object the file itself defines.
        kept = {section for section in SECTIONS if not (prune and section in data)}
        self.rep_ids = (
            {email.lower(): rep_id for email, rep_id in Rep.objects.values_list("email", "id")}
            if "reps" in kept
            else {}
        )
        self.team_ids = dict(Team.objects.values_list("name", "id")) if "teams" in kept else {}
        self.territory_names = set(Territory.objects.values_list("name", flat=True))
        self.source_tokens = dict(Source.objects.values_list("slug", "token_hash"))
        self.source_slugs = set(self.source_tokens) if "sources" in kept else set()
        self.value_lists = (
            dict(ValueList.objects.values_list("name", "values")) if "value_lists" in kept else {}
        )

    def error(self, path: str, message: str) -> None:
        self.errors.append(RuleError(path, message))

    def problems(self, path: str, problems: Problems) -> bool:
        for sub_path, message in problems:
            self.error(f"{path}{sub_path}", message)
        return not problems

    # Value checks: each returns the normalised value, or _ABSENT after reporting an error.

    def text(self, value: Any, path: str, *, max_length: int, blank: bool = False) -> Any:
        if not isinstance(value, str) or (not blank and not value.strip()):
            self.error(
                path, f"must be {'text' if blank else 'non-empty text'}, got {_shown(value)}"
            )
            return _ABSENT
        value = value.strip()
        if len(value) > max_length:
            self.error(path, f"must be at most {max_length} characters, got {len(value)}")
            return _ABSENT
        return value

    def boolean(self, value: Any, path: str) -> Any:
        if not isinstance(value, bool):
            self.error(path, f"must be true or false, got {_shown(value)}")
            return _ABSENT
        return value

    def positive(self, value: Any, path: str, *, nullable: bool = True) -> Any:
        if value is None and nullable:
            return None
        if not _is_int(value) or not 1 <= value <= _INT_MAX:
            self.error(
                path,
                f"must be a whole number of at least 1{' or null' if nullable else ''}, "
                f"got {_shown(value)}",
            )
            return _ABSENT
        return value

    def choice(self, value: Any, path: str, choices: Sequence[str]) -> Any:
        if value not in choices:
            allowed = ", ".join(f'"{c}"' for c in choices)
            self.error(path, f"must be one of {allowed}, got {_shown(value)}")
            return _ABSENT
        return value

    def moment(self, value: Any, path: str, *, zone: ZoneInfo | None = None) -> Any:
        """An ISO 8601 date-time with a UTC offset; with ``zone``, one without an offset too,
        read as a wall-clock time there (a time the clocks skip is refused, a repeated one is
        taken the first time it happens: ``wall_clock_at``)."""
        if value is None:
            return None
        parsed = None
        if isinstance(value, str):
            try:
                parsed = datetime.fromisoformat(value.strip())
            except ValueError:
                parsed = None
        if parsed is not None and parsed.utcoffset() is None and zone is not None:
            try:
                return wall_clock_at(parsed, zone)
            except NonexistentLocalTime as error:
                self.error(path, str(error))
                return _ABSENT
            except OverflowError:
                self.error(path, f"is out of range, got {_shown(value)}")
                return _ABSENT
        if parsed is None or parsed.utcoffset() is None:
            wall = f", or a wall-clock time in {zone.key} without one" if zone else ""
            self.error(
                path,
                "must be an ISO 8601 date-time with a UTC offset "
                f'("2026-05-04T18:00:00Z"){wall} or null, got {_shown(value)}',
            )
            return _ABSENT
        try:
            return parsed.astimezone(UTC)
        except OverflowError:  # "0001-01-01T00:00:00+01:00" is before the first UTC moment
            self.error(path, f"is out of range, got {_shown(value)}")
            return _ABSENT

    def checked(self, value: Any, path: str, problems: Problems) -> Any:
        return value if self.problems(path, problems) else _ABSENT

    def codes(self, value: Any, path: str, *, max_length: int, what: str) -> Any:
        if isinstance(value, list):
            value = [item.strip().upper() if isinstance(item, str) else item for item in value]
        return self.checked(value, path, codes_errors(value, max_length=max_length, what=what))

    # Sections

    def entries(self, section: str) -> Iterable[tuple[str, Mapping[str, Any]]]:
        raw = self.data.get(section)
        if raw is None:
            return
        if not isinstance(raw, list):
            self.error(section, f"must be a list, got {_shown(raw)}")
            return
        allowed, required = _KEYS[section]
        for i, entry in enumerate(raw):
            path = f"{section}[{i}]"
            if not isinstance(entry, Mapping):
                self.error(path, f"must be an object, got {_shown(entry)}")
                continue
            for key in entry:
                if key not in allowed:
                    self.error(f"{path}.{key}", f'unknown key "{key}"')
            for key in sorted(required - entry.keys()):
                self.error(f"{path}.{key}", "is required")
            yield path, entry

    def collect(
        self,
        section: str,
        check: Callable[[str, Mapping[str, Any]], _Entry | None],
        *,
        fold: Callable[[str], str] = str,
    ) -> list[_Entry]:
        result: list[_Entry] = []
        seen: dict[str, str] = {}
        for path, raw in list(self.entries(section)):
            entry = check(path, raw)
            if entry is None:
                continue
            earlier = seen.setdefault(fold(entry.key), path)
            if earlier != path:
                self.error(path, f'duplicate "{entry.key}" (also {earlier})')
                continue
            result.append(entry)
        return result

    def fields(
        self, path: str, raw: Mapping[str, Any], checks: Mapping[str, Callable[[Any, str], Any]]
    ) -> dict[str, Any] | None:
        """Check every present key; None when any of them (or the entry) had an error."""
        before = len(self.errors)
        values: dict[str, Any] = {}
        for key, check in checks.items():
            if key in raw:
                value = check(raw[key], f"{path}.{key}")
                if value is not _ABSENT:
                    values[key] = value
        return values if len(self.errors) == before else None

    def source(self, path: str, raw: Mapping[str, Any]) -> _Entry | None:
        def slug(value: Any, at: str) -> Any:
            try:
                if not isinstance(value, str) or len(value) > 64:
                    raise ValidationError("bad")
                validate_slug(value)
            except ValidationError:
                self.error(at, f"must be a slug (letters, digits, - and _), got {_shown(value)}")
                return _ABSENT
            return value

        def token(value: Any, at: str) -> Any:
            if not isinstance(value, str) or not _MIN_TOKEN_LENGTH <= len(value.strip()) <= 512:
                self.error(at, f"must be text of {_MIN_TOKEN_LENGTH} to 512 characters")
                return _ABSENT
            return value.strip()

        def field_map(value: Any, at: str) -> Any:
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                self.error(
                    at, f"must map raw keys to field names (text to text), got {_shown(value)}"
                )
                return _ABSENT
            path_errors = field_map_errors(dict(value))
            for key, message in path_errors.items():
                self.error(f"{at}.{key}", message)
            return _ABSENT if path_errors else dict(value)

        def kind(value: Any, at: str) -> Any:
            if not isinstance(value, str) or value not in kinds():
                self.error(at, f"must be one of {', '.join(sorted(kinds()))}, got {_shown(value)}")
                return _ABSENT
            return value

        def kind_options(value: Any, at: str) -> Any:
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                self.error(at, f"must be a mapping of option names, got {_shown(value)}")
                return _ABSENT
            return dict(value)

        values = self.fields(
            path,
            raw,
            {
                "slug": slug,
                "name": lambda v, at: self.text(v, at, max_length=200),
                "token": token,
                "kind": kind,
                "kind_options": kind_options,
                "allow_query_token": self.boolean,
                "field_map": field_map,
                "rate_limit_per_minute": lambda v, at: self.positive(v, at, nullable=False),
            },
        )
        if values is None or "slug" not in values:
            return None
        key = values.pop("slug")
        return _Entry(key, values)

    def rep(self, path: str, raw: Mapping[str, Any]) -> _Entry | None:
        def email(value: Any, at: str) -> Any:
            text = value.strip() if isinstance(value, str) else value
            try:
                if not isinstance(text, str) or len(text) > 254:
                    raise ValidationError("bad")
                validate_email(text)
            except ValidationError:
                self.error(at, f"must be an e-mail address, got {_shown(value)}")
                return _ABSENT
            return text

        values = self.fields(
            path,
            raw,
            {
                "email": email,
                "name": lambda v, at: self.text(v, at, max_length=200),
                "active": self.boolean,
                "out_of_office_until": self.moment,
                "timezone": lambda v, at: self.checked(v, at, timezone_errors(v)),
                "working_hours": lambda v, at: self.checked(v, at, working_hours_errors(v)),
                "max_open": self.positive,
                "max_per_day": self.positive,
            },
        )
        absences = (
            self.absences_at(
                raw["absences"], f"{path}.absences", zone=self.rep_zone(raw, values or {})
            )
            if "absences" in raw
            else None
        )
        if values is None or "email" not in values or absences is _ABSENT:
            return None
        entry = _Entry(values["email"], values)
        if absences is not None:
            entry.refs["absences"] = [(start, end, note) for start, end, note, _at in absences]
            entry.refs["absence_paths"] = [at for _start, _end, _note, at in absences]
        return entry

    def rep_zone(self, raw: Mapping[str, Any], values: Mapping[str, Any]) -> ZoneInfo:
        """The zone a rep entry's absences are read in, as the roster API reads them: the
        entry's ``timezone``, else the stored rep's, else UTC (a new rep's default)."""
        name = values.get("timezone")
        if name is None and isinstance(raw.get("email"), str) and self.lookups:
            if self._rep_zones is None:
                self._rep_zones = {
                    email.lower(): zone
                    for email, zone in Rep.objects.values_list("email", "timezone")
                }
            name = self._rep_zones.get(raw["email"].strip().lower())
        return zone_named(name or "UTC") or ZoneInfo("UTC")

    def absences(self, value: Any, path: str, *, zone: ZoneInfo | None = None) -> Any:
        """A rep's planned absences: ``[{from, to, note}]``, ISO date-times with an offset (with
        ``zone``, wall-clock times there without one); sorted (start, end, note)."""
        found = self.absences_at(value, path, zone=zone)
        if found is _ABSENT:
            return _ABSENT
        return [(start, end, note) for start, end, note, _at in found]

    def absences_at(self, value: Any, path: str, *, zone: ZoneInfo | None = None) -> Any:
        """``absences``, each with the path of its entry: sorted (start, end, note, path)."""
        if not isinstance(value, list):
            self.error(path, f"must be a list of {{from, to, note}}, got {_shown(value)}")
            return _ABSENT
        before = len(self.errors)
        spans: list[tuple[datetime, datetime, str, int]] = []
        for i, raw in enumerate(value):
            at = f"{path}[{i}]"
            if not isinstance(raw, Mapping):
                self.error(at, f"must be an object {{from, to, note}}, got {_shown(raw)}")
                continue
            for key in raw:
                if key not in {"from", "to", "note"}:
                    self.error(f"{at}.{key}", f'unknown key "{key}"')
            for key in ("from", "to"):
                if raw.get(key) is None:
                    self.error(f"{at}.{key}", "is required")
            if raw.get("from") is None or raw.get("to") is None:
                continue
            start = self.moment(raw["from"], f"{at}.from", zone=zone)
            end = self.moment(raw["to"], f"{at}.to", zone=zone)
            note = self.text(raw.get("note", ""), f"{at}.note", max_length=200, blank=True)
            if _ABSENT in (start, end, note):
                continue
            if end <= start:
                self.error(f"{at}.to", "must be after from (the end is exclusive)")
                continue
            spans.append((start, end, note, i))
        for first, second in itertools.pairwise(sorted(spans)):
            if second[0] < first[1]:
                self.error(
                    f"{path}[{second[3]}]",
                    f"overlaps {path}[{first[3]}]: make one absence that covers both",
                )
        if len(self.errors) != before:
            return _ABSENT
        return [(start, end, note, f"{path}[{i}]") for start, end, note, i in sorted(spans)]

    def holiday_calendar(self, path: str, raw: Mapping[str, Any]) -> _Entry | None:
        from routing.timeoff.file import parse_day
        from routing.timeoff.models import holiday_country_errors

        def code(value: Any, at: str) -> Any:
            if not isinstance(value, str) or len(value.strip()) > 16:
                self.error(at, f"must be a code (text), got {_shown(value)}")
                return _ABSENT
            return value.strip().upper()

        values = self.fields(
            path,
            raw,
            {
                "name": lambda v, at: self.text(v, at, max_length=200),
                "country": code,
                "subdivision": code,
            },
        )
        if values is not None:
            country, subdivision = values.get("country", ""), values.get("subdivision", "")
            if subdivision and not country:
                self.error(f"{path}.subdivision", "a subdivision needs a country")
                values = None
            elif country:
                for key, message in holiday_country_errors(country, subdivision).items():
                    self.error(f"{path}.{key}", message)
                    values = None
        refs: dict[str, Any] = {}
        for key, check in (("reps", self.rep_ref), ("teams", self.team_ref)):
            if key not in raw:
                continue
            items = raw[key]
            if not isinstance(items, list):
                self.error(f"{path}.{key}", f"must be a list, got {_shown(items)}")
                refs[key] = _ABSENT
                continue
            found = [check(item, f"{path}.{key}[{i}]") for i, item in enumerate(items)]
            refs[key] = _ABSENT if _ABSENT in found else found
        if "days" in raw:
            refs["days"] = self.calendar_days(raw["days"], f"{path}.days", parse_day)
        if values is None or "name" not in values or _ABSENT in refs.values():
            return None
        return _Entry(values.pop("name"), values, refs)

    def calendar_days(self, value: Any, path: str, parse_day: Callable[[Any], Any]) -> Any:
        if not isinstance(value, list):
            self.error(path, f"must be a list of {{date, name}}, got {_shown(value)}")
            return _ABSENT
        before = len(self.errors)
        days: dict[Any, str] = {}
        seen: dict[Any, int] = {}
        for i, raw in enumerate(value):
            at = f"{path}[{i}]"
            if not isinstance(raw, Mapping):
                self.error(at, f"must be an object {{date, name}}, got {_shown(raw)}")
                continue
            for key in raw:
                if key not in {"date", "name"}:
                    self.error(f"{at}.{key}", f'unknown key "{key}"')
            day = parse_day(raw.get("date"))
            if day is None:
                self.error(
                    f"{at}.date", f"must be a date YYYY-MM-DD, got {_shown(raw.get('date'))}"
                )
            name = self.text(raw.get("name"), f"{at}.name", max_length=200)
            if day is None or name is _ABSENT:
                continue
            earlier = seen.setdefault(day, i)
            if earlier != i:
                self.error(f"{at}.date", f"{day} is already a day of it ({path}[{earlier}])")
                continue
            days[day] = name
        return days if len(self.errors) == before else _ABSENT

    def team(self, path: str, raw: Mapping[str, Any]) -> _Entry | None:
        values = self.fields(
            path,
            raw,
            {
                "name": lambda v, at: self.text(v, at, max_length=200),
                "strategy": lambda v, at: self.choice(v, at, TeamStrategy.values),
                "respect_working_hours": self.boolean,
                "sla_minutes": self.positive,
            },
        )
        members = self.members(raw["members"], f"{path}.members") if "members" in raw else None
        if members not in (None, _ABSENT):
            total = sum(weight for _email, weight in members)
            if total > MAX_TEAM_WEIGHT:
                self.error(
                    f"{path}.members",
                    f"the weights add up to {total}; at most {MAX_TEAM_WEIGHT} in a team",
                )
                members = _ABSENT
        if values is None or "name" not in values or members is _ABSENT:
            return None
        entry = _Entry(values.pop("name"), values)
        if members is not None:
            entry.refs["members"] = members
        return entry

    def members(self, value: Any, path: str) -> Any:
        if not isinstance(value, list):
            self.error(path, f"must be a list of {{rep, weight}}, got {_shown(value)}")
            return _ABSENT
        before = len(self.errors)
        members: list[tuple[str, int]] = []
        seen: dict[str, int] = {}
        for i, raw in enumerate(value):
            at = f"{path}[{i}]"
            if not isinstance(raw, Mapping):
                self.error(at, f"must be an object {{rep, weight}}, got {_shown(raw)}")
                continue
            for key in raw:
                if key not in {"rep", "weight"}:
                    self.error(f"{at}.{key}", f'unknown key "{key}"')
            email = self.rep_ref(raw.get("rep"), f"{at}.rep")
            weight = self.positive(raw.get("weight", 1), f"{at}.weight", nullable=False)
            if weight is not _ABSENT and weight > MAX_MEMBER_WEIGHT:
                self.error(f"{at}.weight", f"must be at most {MAX_MEMBER_WEIGHT}, got {weight}")
                weight = _ABSENT
            if email is _ABSENT or weight is _ABSENT:
                continue
            earlier = seen.setdefault(email.lower(), i)
            if earlier != i:
                self.error(f"{at}.rep", f'"{email}" is already a member ({path}[{earlier}])')
                continue
            members.append((email, weight))
        return members if len(self.errors) == before else _ABSENT

    def rep_ref(self, value: Any, path: str) -> Any:
        if not isinstance(value, str) or not value.strip():
            self.error(path, f"must be a rep's e-mail, got {_shown(value)}")
            return _ABSENT
        if value.strip().lower() not in self.rep_ids:
            self.error(path, f'unknown rep "{value}"')
            return _ABSENT
        return value.strip()

    def team_ref(self, value: Any, path: str) -> Any:
        if not isinstance(value, str) or not value.strip():
            self.error(path, f"must be a team name, got {_shown(value)}")
            return _ABSENT
        if value.strip() not in self.team_ids:
            self.error(path, f'unknown team "{value}"')
            return _ABSENT
        return value.strip()

    def territory(self, path: str, raw: Mapping[str, Any]) -> _Entry | None:
        def countries(value: Any, at: str) -> Any:
            if isinstance(value, list):
                value = [c.strip().upper() if isinstance(c, str) else c for c in value]
            return self.checked(value, at, countries_errors(value))

        values = self.fields(
            path,
            raw,
            {
                "name": lambda v, at: self.text(v, at, max_length=200),
                "countries": countries,
                "regions": lambda v, at: self.codes(
                    v, at, max_length=REGION_MAX_LENGTH, what="region codes"
                ),
                "postal_prefixes": lambda v, at: self.codes(
                    v, at, max_length=POSTAL_PREFIX_MAX_LENGTH, what="postal prefixes"
                ),
            },
        )
        team, rep = raw.get("team"), raw.get("rep")
        refs: dict[str, Any] = {}
        if team is not None and rep is not None:
            self.error(path, "has both a team and a rep: give one")
        elif team is not None:
            refs["team"] = self.team_ref(team, f"{path}.team")
        elif rep is not None:
            refs["rep"] = self.rep_ref(rep, f"{path}.rep")
        elif values is not None and values.get("name") not in self.territory_names:
            self.error(path, "needs a team or a rep")
        if values is None or "name" not in values or _ABSENT in refs.values():
            return None
        return _Entry(values.pop("name"), values, refs)

    def account(self, path: str, raw: Mapping[str, Any]) -> _Entry | None:
        def domain(value: Any, at: str) -> Any:
            if isinstance(value, str):
                value = value.strip().lower()
            return self.checked(value, at, domain_errors(value))

        def owner(value: Any, at: str) -> Any:
            return None if value is None else self.rep_ref(value, at)

        values = self.fields(
            path,
            raw,
            {
                "domain": domain,
                "name": lambda v, at: self.text(v, at, max_length=200, blank=True),
                "tier": lambda v, at: (
                    "" if v is None else self.text(v, at, max_length=64, blank=True)
                ),
            },
        )
        refs = {"owner": owner(raw["owner"], f"{path}.owner")} if "owner" in raw else {}
        if values is None or "domain" not in values or _ABSENT in refs.values():
            return None
        return _Entry(values.pop("domain"), values, refs)

    def value_list(self, path: str, raw: Mapping[str, Any]) -> _Entry | None:
        values = self.fields(
            path,
            raw,
            {
                "name": lambda v, at: self.text(v, at, max_length=100),
                "values": lambda v, at: self.checked(v, at, strings_errors(v)),
            },
        )
        if values is None or "name" not in values:
            return None
        return _Entry(values.pop("name"), values)

    def test_case(self, path: str, raw: Mapping[str, Any]) -> _Entry | None:
        def lead(value: Any, at: str) -> Any:
            if not isinstance(value, Mapping) or not value:
                self.error(
                    at, f"must be the lead as a source sends it (an object), got {_shown(value)}"
                )
                return _ABSENT
            return dict(value)

        def source(value: Any, at: str) -> Any:
            if value is None:
                return None
            if not isinstance(value, str) or value.strip() not in self.source_slugs:
                self.error(at, f"unknown source {_shown(value)}")
                return _ABSENT
            return value.strip()

        values = self.fields(
            path,
            raw,
            {
                "name": lambda v, at: self.text(v, at, max_length=200),
                "lead": lead,
                "source": source,
                "expected_status": lambda v, at: self.choice(v, at, ExpectedStatus.values),
            },
        )
        refs: dict[str, Any] = {}
        for key, check in (("expected_rep", self.rep_ref), ("expected_team", self.team_ref)):
            if raw.get(key) is not None:
                refs[key] = check(raw[key], f"{path}.{key}")
            elif key in raw:
                refs[key] = None
        status = values.get("expected_status") if values is not None else None
        if status not in (None, ExpectedStatus.ASSIGNED):
            for key in ("expected_rep", "expected_team"):
                if refs.get(key) not in (None, _ABSENT):
                    self.error(f"{path}.{key}", f"only an assigned lead has one (it is {status})")
                    refs[key] = _ABSENT
                else:
                    refs.setdefault(key, None)
        if values is None or "name" not in values or _ABSENT in refs.values():
            return None
        return _Entry(values.pop("name"), values, refs)

    def names(self, section: str, key: str) -> Iterable[str]:
        """The names the file defines in ``section``, even in entries with other errors."""
        raw = self.data.get(section)
        for entry in raw if isinstance(raw, list) else []:
            if isinstance(entry, Mapping) and isinstance(entry.get(key), str):
                name = entry[key].strip()
                if name:
                    yield name

    def plan(self) -> _Plan:
        for key in self.data:
            if key not in SECTIONS:
                self.error(str(key), f'unknown section "{key}"')
        # A name defined in the file counts as known even if its entry has other errors, so one
        # mistake is reported once rather than again at every reference to it.
        placeholder = -1
        for email in self.names("reps", "email"):
            self.rep_ids.setdefault(email.lower(), placeholder)
        for name in self.names("teams", "name"):
            self.team_ids.setdefault(name, placeholder)
        self.source_slugs.update(self.names("sources", "slug"))
        sections = {
            "sources": self.collect("sources", self.source),
            "reps": self.collect("reps", self.rep, fold=str.lower),
            "teams": self.collect("teams", self.team),
            "holiday_calendars": self.collect("holiday_calendars", self.holiday_calendar),
            "territories": self.collect("territories", self.territory),
            "accounts": self.collect("accounts", self.account),
            "value_lists": self.collect("value_lists", self.value_list),
            "test_cases": self.collect("test_cases", self.test_case),
        }
        raw_lists = self.data.get("value_lists")
        for entry in raw_lists if isinstance(raw_lists, list) else []:
            if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                values = entry.get("values")
                self.value_lists[entry["name"].strip()] = (
                    values if isinstance(values, list) and not strings_errors(values) else []
                )
        name, rules = self.ruleset(self.data.get("ruleset", _ABSENT))
        tokens: dict[str, str | None] = {}
        for entry in sections["sources"]:
            token = entry.fields.pop("token", None)
            if entry.key not in self.source_tokens:
                tokens[entry.key] = token  # None: a fresh one is generated
            elif token is not None and not self.source_tokens[entry.key]:
                tokens[entry.key] = token  # an existing source without a token takes it
        present = frozenset(section for section in SECTIONS if section in self.data)
        return _Plan(sections, name, rules, tokens, present=present, prune=self.prune)

    def ruleset(self, raw: Any) -> tuple[str, list[dict[str, Any]]]:
        if raw is _ABSENT:
            self.error("ruleset", "is required")
            return "", []
        try:
            compile_ruleset(
                raw,
                value_lists=self.value_lists,
                known_teams=self.team_ids,
                known_reps=self.rep_ids,
            )
        except RuleErrors as exc:
            self.errors.extend(exc.errors)
            return "", []
        name = raw.get("name") or ""
        if len(name.strip()) > 200:
            self.error("ruleset.name", "must be at most 200 characters")
        rules = []
        for i, rule in enumerate(raw["rules"]):
            if len(rule["name"].strip()) > 200:
                self.error(f"ruleset.rules[{i}].name", "must be at most 200 characters")
            if not -_INT_MAX <= rule["priority"] <= _INT_MAX:
                self.error(f"ruleset.rules[{i}].priority", f"must be within ±{_INT_MAX}")
            rules.append(_stored_rule(rule))
        return name.strip(), sorted(rules, key=lambda r: r["priority"])


def _stored_rule(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A validated rule as the Rule row keeps it (defaults filled in, ``id`` dropped)."""
    return {
        "name": raw["name"].strip(),
        "priority": raw["priority"],
        "when": raw.get("when"),
        "action": raw["action"],
        "sla_minutes": raw.get("sla_minutes"),
        "on_sla_breach": raw.get("on_sla_breach") or OnSlaBreach.NOTIFY,
        "active": raw.get("active", True),
    }


REP_FIELDS = frozenset(
    {
        "email",
        "name",
        "active",
        "out_of_office_until",
        "timezone",
        "working_hours",
        "max_open",
        "max_per_day",
    }
)


def rep_fields_check(raw: Any) -> dict[str, Any]:
    """One rep's fields (``REP_FIELDS``) checked as a rules file's ``reps[]`` entry is, with
    the same messages; the keys present, normalised. Raises RulesFileErrors, each error's path
    the key (``timezone``, ``working_hours.days``). For the roster API."""
    checker = _Checker({}, lookups=False)
    if not isinstance(raw, Mapping):
        raise RulesFileErrors([RuleError("", f"must be a JSON object, got {_shown(raw)}")])
    for key in raw:
        if key not in REP_FIELDS:
            checker.error(f".{key}", f'unknown key "{key}"')
    given = {key: raw[key] for key in raw if key in REP_FIELDS}
    # An entry is keyed by its e-mail: a change that leaves the e-mail out borrows one.
    entry = checker.rep("", {"email": "rep@example.com", **given})
    if checker.errors or entry is None:
        raise RulesFileErrors([RuleError(e.path.lstrip("."), e.message) for e in checker.errors])
    return {key: value for key, value in entry.fields.items() if key in given}


def absence_fields_check(
    raw: Any, *, zone: ZoneInfo | None = None
) -> tuple[datetime, datetime, str]:
    """One planned absence ``{from, to, note}`` checked as a rules file's
    ``reps[].absences[]`` entry is; (start, end, note). With ``zone`` (the rep's), a date-time
    without an offset is a wall-clock time there. Raises RulesFileErrors by key."""
    checker = _Checker({}, lookups=False)
    if not isinstance(raw, Mapping):
        raise RulesFileErrors([RuleError("", f"must be a JSON object, got {_shown(raw)}")])
    found = checker.absences([raw], "", zone=zone)
    if checker.errors or found is _ABSENT or not found:
        raise RulesFileErrors(
            [RuleError(e.path.removeprefix("[0]").lstrip("."), e.message) for e in checker.errors]
        )
    start, end, note = found[0]
    return start, end, note


def rules_plan(data: Any, *, prune: bool = False) -> _Plan:
    """Validate a whole rules document against the database; raises RulesFileErrors.

    With ``prune``, every section the file has is the whole of that section: its references
    must point at objects the file itself defines.
    """
    if not isinstance(data, Mapping):
        raise RulesFileErrors([RuleError("", f"must be an object, got {_shown(data)}")])
    checker = _Checker(data, prune=prune)
    plan = checker.plan()
    if checker.errors:
        raise RulesFileErrors(checker.errors)
    return plan


# --- Import -------------------------------------------------------------------------------------

_M = TypeVar("_M", bound=models.Model)


Counts = dict[str, dict[str, int]]  # section -> {"created": n, "updated": n, "deleted": n}


def _upsert(
    model: type[_M],
    existing: Mapping[str, _M],
    rows: Iterable[tuple[str, dict[str, Any]]],
    counts: Counts | None = None,
    section: str = "",
) -> None:
    """Create the rows whose key is new, update the changed fields of the others; bulk."""
    created: list[_M] = []
    changed: list[_M] = []
    changed_fields: set[str] = set()
    for key, values in rows:
        obj = existing.get(key)
        if obj is None:
            created.append(model(**values))
            continue
        differs = [name for name, value in values.items() if getattr(obj, name) != value]
        if differs:
            for name in differs:
                setattr(obj, name, values[name])
            changed.append(obj)
            changed_fields.update(differs)
    model._default_manager.bulk_create(created)
    if changed:
        now = timezone.now()
        for obj in changed:
            obj.updated_at = now  # type: ignore[attr-defined]  # every upserted model has it
        model._default_manager.bulk_update(changed, [*sorted(changed_fields), "updated_at"])
    if counts is not None:
        tally = counts.setdefault(section, {"created": 0, "updated": 0, "deleted": 0})
        tally["created"] += len(created)
        tally["updated"] += len(changed)


def _rep_ids() -> dict[str, int]:
    return {email.lower(): rep_id for email, rep_id in Rep.objects.values_list("email", "id")}


def _apply_sections(plan: _Plan, counts: Counts) -> dict[str, str]:
    sections = plan.sections
    _upsert(
        ValueList,
        ValueList.objects.in_bulk([e.key for e in sections["value_lists"]], field_name="name"),
        ((e.key, {"name": e.key, **e.fields}) for e in sections["value_lists"]),
        counts,
        "value_lists",
    )

    keys = [e.key.lower() for e in sections["reps"]]
    reps = {
        rep.email.lower(): rep
        for rep in Rep.objects.annotate(email_lower=Lower("email")).filter(email_lower__in=keys)
    }
    _upsert(Rep, reps, ((e.key.lower(), e.fields) for e in sections["reps"]), counts, "reps")
    rep_ids = _rep_ids()

    teams = Team.objects.in_bulk([e.key for e in sections["teams"]], field_name="name")
    _upsert(
        Team,
        teams,
        ((e.key, {"name": e.key, **e.fields}) for e in sections["teams"]),
        counts,
        "teams",
    )
    team_ids = dict(Team.objects.values_list("name", "id"))
    _replace_members(
        {
            team_ids[e.key]: [
                (rep_ids[email.lower()], weight) for email, weight in e.refs["members"]
            ]
            for e in sections["teams"]
            if "members" in e.refs
        },
        counts,
    )

    from routing.timeoff.file import absences_apply, calendars_apply

    absences_apply(
        {
            rep_ids[e.key.lower()]: list(
                zip(e.refs["absences"], e.refs["absence_paths"], strict=True)
            )
            for e in sections["reps"]
            if "absences" in e.refs
        },
        counts,
    )
    calendars_apply(
        ((e.key, e.fields, e.refs) for e in sections["holiday_calendars"]),
        rep_ids,
        team_ids,
        counts,
    )

    def territory_fields(entry: _Entry) -> dict[str, Any]:
        values = {"name": entry.key, **entry.fields}
        if "team" in entry.refs:
            values.update(team_id=team_ids[entry.refs["team"]], rep_id=None)
        elif "rep" in entry.refs:
            values.update(team_id=None, rep_id=rep_ids[entry.refs["rep"].lower()])
        return values

    _upsert(
        Territory,
        Territory.objects.in_bulk([e.key for e in sections["territories"]], field_name="name"),
        ((e.key, territory_fields(e)) for e in sections["territories"]),
        counts,
        "territories",
    )

    def account_fields(entry: _Entry) -> dict[str, Any]:
        values = {"domain": entry.key, **entry.fields}
        if "owner" in entry.refs:
            owner = entry.refs["owner"]
            values["owner_id"] = None if owner is None else rep_ids[owner.lower()]
        return values

    _upsert(
        Account,
        Account.objects.in_bulk([e.key for e in sections["accounts"]], field_name="domain"),
        ((e.key, account_fields(e)) for e in sections["accounts"]),
        counts,
        "accounts",
    )
    tokens = _apply_sources(plan, counts)
    _apply_test_cases(plan, counts, rep_ids, team_ids)
    return tokens


def _apply_test_cases(
    plan: _Plan, counts: Counts, rep_ids: Mapping[str, int], team_ids: Mapping[str, int]
) -> None:
    entries = plan.sections["test_cases"]
    source_ids = dict(Source.objects.values_list("slug", "id"))

    def case_fields(entry: _Entry) -> dict[str, Any]:
        values = {"name": entry.key, **entry.fields}
        if "source" in values:
            slug = values.pop("source")
            values["source_id"] = None if slug is None else source_ids[slug]
        if "expected_rep" in entry.refs:
            rep = entry.refs["expected_rep"]
            values["expected_rep_id"] = None if rep is None else rep_ids[rep.lower()]
        if "expected_team" in entry.refs:
            team = entry.refs["expected_team"]
            values["expected_team_id"] = None if team is None else team_ids[team]
        return values

    _upsert(
        RoutingTestCase,
        RoutingTestCase.objects.in_bulk([e.key for e in entries], field_name="name"),
        ((e.key, case_fields(e)) for e in entries),
        counts,
        "test_cases",
    )


def _replace_members(wanted: Mapping[int, list[tuple[int, int]]], counts: Counts) -> None:
    current: dict[int, list[tuple[int, int]]] = {team_id: [] for team_id in wanted}
    for team_id, rep_id, weight in TeamMembership.objects.filter(
        team_id__in=list(wanted)
    ).values_list("team_id", "rep_id", "weight"):
        current[team_id].append((rep_id, weight))  # Meta.ordering: by position
    stale = [team_id for team_id, members in wanted.items() if current[team_id] != members]
    if stale:
        tally = counts.setdefault("members", {"created": 0, "updated": 0, "deleted": 0})
        tally["updated"] += len(stale)  # teams whose members changed
    TeamMembership.objects.filter(team_id__in=stale).delete()
    TeamMembership.objects.bulk_create(
        TeamMembership(team_id=team_id, rep_id=rep_id, weight=weight, position=position)
        for team_id in stale
        for position, (rep_id, weight) in enumerate(wanted[team_id])
    )


def _public_options(source: Source) -> dict[str, Any]:
    """The source's kind options without its kind's secret ones (never in an exported file)."""
    options = source.kind_options if isinstance(source.kind_options, dict) else {}
    secret = set(kind_get(source.kind).secret_options)
    return {key: value for key, value in options.items() if key not in secret}


def _apply_sources(plan: _Plan, counts: Counts) -> dict[str, str]:
    entries = plan.sections["sources"]
    sources = Source.objects.in_bulk([e.key for e in entries], field_name="slug")
    for entry in entries:
        # Secret kind options are not in an exported file: keep the source's own when omitted.
        existing = sources.get(entry.key)
        if "kind_options" in entry.fields and existing is not None:
            kind = kind_get(entry.fields.get("kind", existing.kind))
            kept = existing.kind_options if isinstance(existing.kind_options, dict) else {}
            for name in kind.secret_options:
                if name not in entry.fields["kind_options"] and name in kept:
                    entry.fields["kind_options"][name] = kept[name]
    _upsert(
        Source, sources, ((e.key, {"slug": e.key, **e.fields}) for e in entries), counts, "sources"
    )
    shown: dict[str, str] = {}
    for slug, file_token in plan.new_source_tokens.items():
        token = file_token or new_token()
        if file_token is None:
            shown[slug] = token
        Source.objects.filter(slug=slug).update(
            token_hash=token_digest(token), token_hint=token[:6], updated_at=timezone.now()
        )
    return shown


def _content(name: str, rules: Iterable[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    return name, sorted((dict(rule) for rule in rules), key=lambda r: r["priority"])


def _stored_content(ruleset: RuleSet) -> tuple[str, list[dict[str, Any]]]:
    return _content(
        ruleset.name,
        (
            {name: getattr(rule, name) for name in _STORED_RULE_FIELDS}
            for rule in ruleset.rules.all()
        ),
    )


_STORED_RULE_FIELDS = (
    "name",
    "priority",
    "when",
    "action",
    "sla_minutes",
    "on_sla_breach",
    "active",
)


@dataclass(frozen=True)
class CheckResult:
    """What importing a valid file would do to the ruleset (``rules_check``)."""

    published_version: int | None  # the live version now, if any
    ruleset_changed: bool  # False: the file's ruleset is the published one


def rules_check(data: Any) -> CheckResult:
    """Validate a whole rules document against the database, as an import would; write nothing.

    Raises RulesFileErrors with every problem. For a pull request's check of a file kept in git.
    """
    plan = rules_plan(data)
    published = ruleset_published()
    same = published is not None and _stored_content(published) == _content(
        plan.ruleset_name, plan.rules
    )
    return CheckResult(
        published_version=published.version if published is not None else None,
        ruleset_changed=not same,
    )


@transaction.atomic(durable=True)
def rules_import(data: Any, *, publish: bool, actor: Actor = None) -> ImportResult:
    """Validate a whole rules document, then upsert it and store its ruleset as a version.

    Raises RulesFileErrors (every problem, with its path) and writes nothing when anything is
    wrong. See the module docstring for the contract. ``publish`` publishes without running the
    saved test cases: ``routing.configuration.configuration_import`` (the command's path) runs
    them first.
    """
    result = rules_apply(plan=rules_plan(data), actor=actor)
    if publish and result.ruleset.status == RuleSetStatus.DRAFT:
        result = replace(result, ruleset=ruleset_publish(ruleset=result.ruleset, actor=actor))
    return result


@transaction.atomic
def rules_apply(*, plan: _Plan, actor: Actor = None) -> ImportResult:
    """Write a checked plan: upsert its sections, store its ruleset as a draft (or reuse an
    identical version). Deletes nothing (``rules_prune``) and publishes nothing."""
    counts: Counts = {}
    from routing.timeoff.services import reps_became_unavailable_after

    with reps_became_unavailable_after(
        emails=[entry.key for entry in plan.sections["reps"]],
        actor=f"user:{actor.get_username()}" if actor is not None else "import",
        why="unavailable after a rules-file import",
    ):
        tokens = _apply_sections(plan, counts)
    wanted = _content(plan.ruleset_name, plan.rules)
    ruleset: RuleSet | None = None
    published, latest = ruleset_published(), ruleset_latest()
    if published is not None and _stored_content(published) == wanted:
        ruleset = published
    elif (
        latest is not None
        and latest.status == RuleSetStatus.DRAFT
        and _stored_content(latest) == wanted
    ):
        ruleset = latest
    created = ruleset is None
    if ruleset is None:
        ruleset = ruleset_add_draft(
            ruleset=RuleSet(name=plan.ruleset_name, note="Imported from rules file"),
            actor=actor,
        )
        Rule.objects.bulk_create(Rule(ruleset=ruleset, **rule) for rule in plan.rules)
    return ImportResult(ruleset=ruleset, created=created, source_tokens=tokens, counts=counts)


# --- Pruning ------------------------------------------------------------------------------------


class PruneRefused(RulesFileErrors):
    """Objects the file no longer names that cannot be deleted (live leads need them)."""


def _named_by_rules(rules: Iterable[Mapping[str, Any]]) -> tuple[set[str], set[str], set[str]]:
    """(team names, lower-cased rep e-mails, value-list names) that ``rules`` refer to."""
    teams: set[str] = set()
    reps: set[str] = set()
    lists: set[str] = set()
    for rule in rules:
        raw = rule.get("action")
        action: dict[str, Any] = raw if isinstance(raw, dict) else {}
        for key in ("team", "fallback_team"):
            if isinstance(action.get(key), str):
                teams.add(action[key])
        if action.get("type") == "rep" and isinstance(action.get("rep"), str):
            reps.add(action["rep"].strip().lower())
        _lists_in(rule.get("when"), lists)
    return teams, reps, lists


def _lists_in(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        if node.get("op") in ("in_list", "not_in_list") and isinstance(node.get("value"), str):
            found.add(node["value"])
        for key in ("all", "any"):
            for child in node.get(key) or []:
                _lists_in(child, found)
        _lists_in(node.get("not"), found)


def _few(names: Iterable[str]) -> str:
    shown = sorted(names)
    text = ", ".join(f'"{name}"' for name in shown[:3])
    return text + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")


@transaction.atomic
def rules_prune(*, plan: _Plan, live_rules: Sequence[Mapping[str, Any]]) -> Counts:
    """Delete, in every section the file has, what it no longer names; all or nothing.

    ``live_rules`` are the rules that will be live afterwards (the file's when it is published,
    else the published version's). Raises PruneRefused, deleting nothing, when a live lead or
    a live rule still needs an object: a rep who owns open leads or has lead history, a team, rep
    or value list a live rule names, a source with leads, or a row a kept object points at.
    """
    present = plan.present
    errors: list[RuleError] = []
    named = {
        section: {e.key.lower() if section == "reps" else e.key for e in plan.sections[section]}
        for section in PRUNED_SECTIONS
    }
    gone: dict[str, dict[int, str]] = {section: {} for section in PRUNED_SECTIONS}
    listing: dict[str, Any] = {
        "test_cases": RoutingTestCase.objects.values_list("id", "name"),
        "accounts": Account.objects.values_list("id", "domain"),
        "territories": Territory.objects.values_list("id", "name"),
        "teams": Team.objects.values_list("id", "name"),
        "reps": Rep.objects.values_list("id", "email"),
        "value_lists": ValueList.objects.values_list("id", "name"),
        "sources": Source.objects.values_list("id", "slug"),
    }
    for section in PRUNED_SECTIONS:
        if section not in present:
            continue
        for pk, key in listing[section]:
            if (key.lower() if section == "reps" else key) not in named[section]:
                gone[section][pk] = key

    def refuse(section: str, key: str, why: str) -> None:
        errors.append(RuleError(section, f'"{key}" is not in the file but {why}'))

    live_teams, live_reps, live_lists = _named_by_rules(live_rules)
    for name in gone["teams"].values():
        if name in live_teams:
            refuse("teams", name, "a live rule sends leads to it: publish the file's rules too")
    for name in gone["value_lists"].values():
        if name in live_lists:
            refuse("value_lists", name, "a live rule uses it: publish the file's rules too")
    reps_gone = gone["reps"]
    if reps_gone:
        open_leads: Counter[int] = Counter()
        history: Counter[int] = Counter()
        for rep_id, active in Assignment.objects.filter(rep_id__in=list(reps_gone)).values_list(
            "rep_id", "active"
        ):
            (open_leads if active else history)[rep_id] += 1
        for pk, email in reps_gone.items():
            if pk in open_leads:
                refuse("reps", email, f"owns {open_leads[pk]} open lead(s): reassign them first")
            elif pk in history:
                refuse(
                    "reps",
                    email,
                    f"has {history[pk]} assignment(s) in the lead history, which keeps them: "
                    "keep the rep in the file (deactivate them in the admin)",
                )
            elif email.lower() in live_reps:
                refuse("reps", email, "a live rule sends leads to them: publish the file's rules")
    sources_gone = gone["sources"]
    if sources_gone:
        with_leads = set(
            Source.objects.filter(pk__in=list(sources_gone), leads__isnull=False).values_list(
                "pk", flat=True
            )
        )
        for pk in sorted(with_leads):
            refuse("sources", sources_gone[pk], "leads came from it: keep it in the file")
    # Rows the file keeps (or a section it does not have) must not point at a deleted one.
    kept_refs = (
        ("territories", Territory, "team_id", "teams", "territory"),
        ("territories", Territory, "rep_id", "reps", "territory"),
        ("accounts", Account, "owner_id", "reps", "account"),
        ("test_cases", RoutingTestCase, "expected_rep_id", "reps", "test case"),
        ("test_cases", RoutingTestCase, "expected_team_id", "teams", "test case"),
    )
    for section, model, column, target, what in kept_refs:
        if not gone[target]:
            continue
        label = "domain" if model is Account else "name"
        rows = model.objects.filter(**{f"{column}__in": list(gone[target])}).exclude(
            pk__in=list(gone[section])
        )
        for key, ref in rows.values_list(label, column):
            refuse(target, gone[target][ref], f'{what} "{key}" (kept) points at it')
    if errors:
        raise PruneRefused(errors)
    counts: Counts = {}
    if "holiday_calendars" in present:
        from routing.timeoff.file import calendars_prune

        calendars_prune((e.key for e in plan.sections["holiday_calendars"]), counts)
    models_of: dict[str, type[models.Model]] = {
        "test_cases": RoutingTestCase,
        "accounts": Account,
        "territories": Territory,
        "teams": Team,
        "reps": Rep,
        "value_lists": ValueList,
        "sources": Source,
    }
    for section in PRUNED_SECTIONS:  # dependants first: nothing PROTECTed is left pointing
        if gone[section]:
            models_of[section]._default_manager.filter(pk__in=list(gone[section])).delete()
            counts[section] = {"created": 0, "updated": 0, "deleted": len(gone[section])}
    return counts


# --- Ruleset versions ---------------------------------------------------------------------------


def _user(actor: Actor) -> Any:
    return actor if actor is not None and actor.is_authenticated else None


@transaction.atomic
def ruleset_add_draft(*, ruleset: RuleSet, actor: Actor = None) -> RuleSet:
    """Save a new, unsaved ruleset as a draft with the next version number."""
    ruleset.status = RuleSetStatus.DRAFT
    ruleset.created_by = _user(actor)
    for attempt in range(_VERSION_ATTEMPTS):
        latest = RuleSet.objects.aggregate(latest=Max("version"))["latest"] or 0
        ruleset.version = latest + 1
        try:
            with transaction.atomic():
                ruleset.save(force_insert=True)
        except IntegrityError:
            # Another writer took this number first; the next try sees it.
            ruleset.pk = None
            if (
                attempt + 1 == _VERSION_ATTEMPTS
                or not RuleSet.objects.filter(version=ruleset.version).exists()
            ):
                raise
        else:
            return ruleset
    raise AssertionError("unreachable")  # pragma: no cover


@transaction.atomic
def ruleset_copy(*, ruleset: RuleSet, actor: Actor = None) -> RuleSet:
    """A new draft with the name and rules of ``ruleset`` (how a rollback starts)."""
    copy = ruleset_add_draft(
        ruleset=RuleSet(name=ruleset.name, note=f"Copy of version {ruleset.version}"), actor=actor
    )
    Rule.objects.bulk_create(
        Rule(ruleset=copy, **{name: getattr(rule, name) for name in _STORED_RULE_FIELDS})
        for rule in ruleset.rules.order_by("priority")
    )
    return copy


def ruleset_compile_errors(ruleset: RuleSet) -> list[RuleError]:
    """What keeps ``ruleset``'s rules from compiling against today's teams, reps and lists."""
    references = rule_references()
    rules = [rule.to_data() for rule in ruleset.rules.order_by("priority")]
    try:
        compile_ruleset(
            {"name": ruleset.name, "rules": rules},
            value_lists=references.value_lists,
            known_teams=references.teams,
            known_reps=references.reps,
        )
    except RuleErrors as exc:
        return list(exc.errors)
    return []


PUBLISH_LOCK = "routing:publish"


class ConfigurationBusy(Exception):
    """Another import or publish of the routing configuration holds the lock, or a replay reads
    it (``routing.configuration``); nothing was written."""


REPLAY_BUSY = (
    "A publish or import of the routing configuration is in progress: a replay now would "
    "decide some leads with the old configuration and some with the new one. Nothing was "
    "replayed; try again when it has finished."
)


@contextmanager
def configuration_reading() -> Iterator[None]:
    """Hold the publish lock shared while a replay or a check reads the live configuration
    (PostgreSQL; a session lock, released on leaving, so a long replay holds no transaction
    open): a publish or import meanwhile is refused with ConfigurationBusy (it takes the lock
    exclusively without waiting long, ``routing.configuration.configuration_lock``), and a
    replay while one is under way is refused the same way, with ``REPLAY_BUSY``. Replays do
    not exclude each other. Nothing on SQLite, which has one writer at a time."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_try_advisory_lock_shared(hashtextextended(%s, 0))", [PUBLISH_LOCK]
        )
        row = cursor.fetchone()
    if not (row and row[0]):
        raise ConfigurationBusy(REPLAY_BUSY)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_unlock_shared(hashtextextended(%s, 0))", [PUBLISH_LOCK]
            )


def _publish_lock() -> None:
    """Serialise publishes (PostgreSQL; SQLite serialises all writers): the second of two
    waits for the first to commit, then archives what it published."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [PUBLISH_LOCK])


class AlreadyPublished(RuleErrors):
    """The draft was published (or archived) by someone else meanwhile."""


@transaction.atomic
def ruleset_publish(
    *,
    ruleset: RuleSet,
    actor: Actor = None,
    note: str = "",
    failing_cases: Sequence[str] = (),
) -> RuleSet:
    """Make a draft the live version, archiving the one published before; returns it.

    ``failing_cases`` (the saved test cases that failed and that someone chose to publish over)
    are recorded in the audit event.

    ``note``, when given, is added to the version's note as its last line. Raises
    AlreadyPublished (a RuleErrors) when it is no longer a draft, and RuleErrors when its rules
    no longer compile (a team renamed, a value list deleted). Publishes are serialised: of two
    at once, the second waits for the first, then archives it.
    """
    _publish_lock()
    locked = RuleSet.objects.select_for_update().get(pk=ruleset.pk)
    if locked.status != RuleSetStatus.DRAFT:
        raise AlreadyPublished(
            [RuleError("ruleset", f"version {locked.version} is {locked.status}, not a draft")]
        )
    errors = ruleset_compile_errors(locked)
    if errors:
        raise RuleErrors(errors)
    if note.strip():
        locked.note = "\n".join(filter(None, [locked.note.strip(), note.strip()]))
        RuleSet.objects.filter(pk=locked.pk).update(note=locked.note)
    previous = RuleSet.objects.filter(status=RuleSetStatus.PUBLISHED).values_list(
        "version", flat=True
    )
    replaced = list(previous)
    RuleSet.objects.filter(status=RuleSetStatus.PUBLISHED).update(status=RuleSetStatus.ARCHIVED)
    locked.status = RuleSetStatus.PUBLISHED
    locked.published_at = timezone.now()
    locked.published_by = _user(actor)
    # An update() of exactly these fields: save() refuses to change a ruleset's status.
    RuleSet.objects.filter(pk=locked.pk).update(
        status=locked.status, published_at=locked.published_at, published_by=locked.published_by
    )
    event_record(
        type=EventType.RULES_PUBLISHED,
        actor=f"user:{actor.get_username()}" if actor is not None else "system",
        at=locked.published_at,
        ruleset_version=locked.version,
        data={
            "ruleset": locked.name,
            "version": locked.version,
            "replaced_version": replaced[0] if replaced else None,
            "note": locked.note,
            "rules": locked.rules.count(),
            **({"failing_test_cases": list(failing_cases)} if failing_cases else {}),
        },
    )
    return locked


# --- Export -------------------------------------------------------------------------------------


def _moment(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def rules_export(version: int | None = None) -> dict[str, Any]:
    """The rules-format.md document for the published ruleset (or ``version``).

    Raises RuleSet.DoesNotExist when there is no such version (or nothing is published).
    """
    ruleset = ruleset_published() if version is None else ruleset_by_version(version=version)
    if ruleset is None:
        raise RuleSet.DoesNotExist(
            "no published ruleset" if version is None else f"no ruleset version {version}"
        )
    from routing.timeoff.file import calendars_export

    reps = sorted(Rep.objects.all(), key=lambda rep: (rep.email.lower(), rep.email))
    emails = {rep.id: rep.email for rep in reps}
    teams = sorted(Team.objects.prefetch_related("memberships"), key=lambda team: team.name)
    team_names = {team.id: team.name for team in teams}
    return {
        "sources": [
            {
                "slug": source.slug,
                "name": source.name,
                "kind": source.kind,
                "kind_options": _public_options(source),
                "allow_query_token": source.allow_query_token,
                "field_map": source.field_map,
                "rate_limit_per_minute": source.rate_limit_per_minute,
            }
            for source in sorted(Source.objects.all(), key=lambda source: source.slug)
        ],
        "reps": [
            {
                "email": rep.email,
                "name": rep.name,
                # Not active / out_of_office_until: live facts about people, not design (an
                # import of this file later must not reset who is away). A file may set them.
                "timezone": rep.timezone,
                "working_hours": rep.working_hours,
                "max_open": rep.max_open,
                "max_per_day": rep.max_per_day,
                # Nor absences: planned leave is live state too (the roster API, the admin);
                # an export imported later must not wipe leave planned since.
            }
            for rep in reps
        ],
        "teams": [
            {
                "name": team.name,
                "strategy": team.strategy,
                "respect_working_hours": team.respect_working_hours,
                "sla_minutes": team.sla_minutes,
                "members": [
                    {"rep": emails[member.rep_id], "weight": member.weight}
                    for member in sorted(team.memberships.all(), key=lambda m: (m.position, m.id))
                ],
            }
            for team in teams
        ],
        "holiday_calendars": calendars_export(emails, team_names),
        "territories": [
            {
                "name": territory.name,
                "countries": territory.countries,
                "regions": territory.regions,
                "postal_prefixes": territory.postal_prefixes,
                **(
                    {"team": team_names[territory.team_id]}
                    if territory.team_id is not None
                    else {"rep": emails[territory.rep_id]}  # type: ignore[index]  # XOR
                ),
            }
            for territory in Territory.objects.order_by("id")
        ],
        "accounts": [
            {
                "domain": account.domain,
                "name": account.name,
                "owner": None if account.owner_id is None else emails[account.owner_id],
                "tier": account.tier,
            }
            for account in sorted(Account.objects.all(), key=lambda account: account.domain)
        ],
        "value_lists": [
            {"name": value_list.name, "values": value_list.values}
            for value_list in sorted(ValueList.objects.all(), key=lambda vl: vl.name)
        ],
        "ruleset": {
            "name": ruleset.name,
            "rules": [rule.to_data() for rule in ruleset.rules.all()],
        },
        "test_cases": [
            {
                "name": case.name,
                "lead": case.lead,
                "source": case.source.slug if case.source is not None else None,
                "expected_status": case.expected_status,
                "expected_rep": None
                if case.expected_rep_id is None
                else emails[case.expected_rep_id],
                "expected_team": (
                    None if case.expected_team_id is None else team_names[case.expected_team_id]
                ),
            }
            for case in sorted(
                RoutingTestCase.objects.select_related("source"), key=lambda case: case.name
            )
        ],
    }
