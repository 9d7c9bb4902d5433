"""Personal data sealed under a per-person key, so that erasure can destroy it (crypto-shredding).

Each person (a normalised e-mail, else a phone, else the one lead that names them by neither)
has a ``PersonKey`` row: a random Fernet data key, wrapped (encrypted) by the master key
``PRIVACY_KEYS`` that lives outside the database, and found by an HMAC of the address
(``PRIVACY_HASH_KEY``), never the address itself. The personal
content of audit events (their trace, and the ``data`` values that quote the lead) is stored
sealed with that key; erasure nulls the wrapped key, so what was sealed stays in the append-only
log, still covered by its hash chain, and can never be opened again.

Rotation of the master key: put a new key first in ``PRIVACY_KEYS`` (all keys unwrap, the first
wraps), run ``manage.py privacy_rewrap`` (each person's data key re-wrapped under the new one;
nothing sealed changes, since it is sealed with the data keys), then drop the old key.

A process keeps an unwrapped key ``PRIVACY_KEY_CACHE_SECONDS`` (one read per lead, not per
event or field); an erasure clears its own process's cache at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import IntegrityError, transaction

ERASED = "erased person"
# What an opened event shows when its person's key is gone (erased) or cannot be unwrapped.
UNREADABLE = "unreadable (the privacy key that wraps it is not configured)"

# Top-level `data` keys of audit events that can quote a lead's personal fields; the rest of
# `data` (reason, kind, tags, manual, provider...) stays plain: reports and counters query it.
PERSONAL_DATA_KEYS = frozenset({"summary", "matched_on", "error", "person", "company"})
# Inside a `crm` mapping (by CRM kind): what the CRM said about the person.
PERSONAL_CRM_KEYS = frozenset({"person", "company", "person_owner"})

_CACHE_SIZE = 4096
# How ``Lead.last_error`` starts on a lead failed because its person key cannot be opened
# (routing.services; counted in /metrics as leadrouter_leads_failed_privacy_key).
LEAD_ERROR_PREFIX = "privacy key"


class PrivacyKeyError(ValueError):
    """``PRIVACY_KEYS`` holds no usable Fernet key, or none of them unwraps a stored key."""


def _master() -> MultiFernet:
    keys = [k.strip() for k in settings.PRIVACY_KEYS if k.strip()]
    try:
        return MultiFernet([Fernet(key.encode()) for key in keys])
    except (ValueError, TypeError) as exc:
        raise PrivacyKeyError(
            "PRIVACY_KEYS holds a value that is not a Fernet key (32 url-safe base64 bytes; "
            "make one with `manage.py privacy_rewrap --new-key`)"
        ) from exc


# The shortest ``PRIVACY_HASH_KEY`` accepted: the generated one is 43 characters (32 random bytes).
HASH_KEY_MIN_LENGTH = 32


def key_material_problems() -> list[str]:
    """What is wrong with the configured key material, in words that never quote a key (empty:
    usable). Checked at start-up (config/checks.py, leadrouter.E003; the worker's start)."""
    problems = []
    keys = [k.strip() for k in settings.PRIVACY_KEYS if k.strip()]
    if not keys:
        problems.append("PRIVACY_KEYS holds no key")
    for n, key in enumerate(keys, start=1):
        try:
            Fernet(key.encode())
        except (ValueError, TypeError):
            problems.append(
                f"PRIVACY_KEYS key {n} of {len(keys)} is not a Fernet key (32 bytes in url-safe "
                "base64, 44 characters)"
            )
    hash_key = settings.PRIVACY_HASH_KEY
    if len(hash_key.strip()) < HASH_KEY_MIN_LENGTH:
        problems.append(
            f"PRIVACY_HASH_KEY is shorter than {HASH_KEY_MIN_LENGTH} characters"
            if hash_key.strip()
            else "PRIVACY_HASH_KEY is empty"
        )
    elif hash_key != hash_key.strip():
        # A pasted newline or space changes every lookup hash: each person would get a new key.
        problems.append("PRIVACY_HASH_KEY starts or ends with white space")
    return problems


def unopenable_key_groups() -> list[tuple[str, int]]:
    """(``wrapped_by``, how many) of the live person keys that no key in ``PRIVACY_KEYS``
    unwraps, found by trying one key per master-key fingerprint (a few queries, whatever the
    number of people). Keys already marked ``LOST`` are included under that name."""
    from django.db.models import Count

    from leads.models import PersonKey

    master = _master()
    groups = (
        PersonKey.objects.filter(wrapped__isnull=False)
        .order_by()
        .values_list("wrapped_by")
        .annotate(n=Count("pk"))
    )
    found = []
    for wrapped_by, n in groups:
        if wrapped_by == LOST:
            found.append((wrapped_by, n))
            continue
        sample = (
            PersonKey.objects.filter(wrapped__isnull=False, wrapped_by=wrapped_by)
            .values_list("wrapped", flat=True)
            .first()
        )
        try:
            master.decrypt((sample or "").encode())
        except InvalidToken:
            found.append((wrapped_by, n))
    return found


def new_master_key() -> str:
    return Fernet.generate_key().decode()


# ``PersonKey.wrapped_by`` of a key no configured master key unwraps: the background re-wrap
# leaves it (``manage.py privacy_rewrap`` tries it again, e.g. once the lost key is put back).
LOST = "lost"


def primary_fingerprint() -> str:
    """Which master key wraps new keys (the first of ``PRIVACY_KEYS``), as stored in
    ``PersonKey.wrapped_by``: a hash of it, never the key."""
    _master()  # a malformed key is said as such
    key = next(k.strip() for k in settings.PRIVACY_KEYS if k.strip())
    return hashlib.sha256(b"leadrouter-privacy-master:" + key.encode()).hexdigest()[:16]


def normalise_email(email: str) -> str:
    return email.strip().lower()


def normalise_phone(phone: str) -> str:
    text = phone.strip()
    digits = "".join(ch for ch in text if ch.isdigit())
    return ("+" if text.startswith("+") else "") + digits


def lookup_hash(*, email: str = "", phone: str = "", lead_id: Any = None) -> str:
    """The keyed hash that finds a person's key: of the e-mail when given, else the phone,
    else (a lead naming its person by neither) the lead's own id."""
    if email.strip():
        text = "email:" + normalise_email(email)
    elif normalise_phone(phone).lstrip("+"):
        text = "phone:" + normalise_phone(phone)
    elif lead_id is not None and str(lead_id):
        text = f"lead:{lead_id}"
    else:
        raise ValueError("a person is found by an e-mail or a phone")
    return hmac.new(settings.PRIVACY_HASH_KEY.encode(), text.encode(), hashlib.sha256).hexdigest()


class _KeyCache:
    """person key id -> (expires at, Fernet or None when erased), bounded, thread-safe."""

    def __init__(self) -> None:
        self._items: OrderedDict[int, tuple[float, Fernet | None]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key_id: int) -> tuple[bool, Fernet | None]:
        with self._lock:
            item = self._items.get(key_id)
            if item is None or item[0] < time.monotonic():
                return False, None
            self._items.move_to_end(key_id)
            return True, item[1]

    def put(self, key_id: int, value: Fernet | None) -> None:
        ttl = float(settings.PRIVACY_KEY_CACHE_SECONDS)
        if ttl <= 0:
            return
        with self._lock:
            self._items[key_id] = (time.monotonic() + ttl, value)
            self._items.move_to_end(key_id)
            while len(self._items) > _CACHE_SIZE:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_cache = _KeyCache()


def cache_clear() -> None:
    _cache.clear()


def unwrap(wrapped: str) -> Fernet:
    """A person's data key from its wrapped form; PrivacyKeyError when no master key opens it."""
    fernet = _unwrap(wrapped)
    if fernet is None:
        raise PrivacyKeyError("no wrapped key")
    return fernet


def _unwrap(wrapped: str | None) -> Fernet | None:
    if not wrapped:
        return None
    try:
        return Fernet(_master().decrypt(wrapped.encode()))
    except InvalidToken as exc:
        raise PrivacyKeyError(
            "a person's key cannot be unwrapped with PRIVACY_KEYS (a master key was removed "
            "or lost)"
        ) from exc


def person_fernet(key_id: int) -> Fernet | None:
    """The person's data key (None: erased). One read per key per cache period."""
    from leads.models import PersonKey

    hit, value = _cache.get(key_id)
    if hit:
        return value
    wrapped = PersonKey.objects.filter(pk=key_id).values_list("wrapped", flat=True).first()
    value = _unwrap(wrapped)
    _cache.put(key_id, value)
    return value


def person_fernets(key_ids: set[int]) -> dict[int, Fernet | None]:
    """Many people's keys in one query (a page of events): id -> Fernet, None when erased."""
    from leads.models import PersonKey

    found: dict[int, Fernet | None] = {}
    wanted = set()
    for key_id in key_ids:
        hit, value = _cache.get(key_id)
        if hit:
            found[key_id] = value
        else:
            wanted.add(key_id)
    if wanted:
        rows = dict(PersonKey.objects.filter(pk__in=wanted).values_list("pk", "wrapped"))
        for key_id in wanted:
            value = _unwrap(rows.get(key_id))
            _cache.put(key_id, value)
            found[key_id] = value
    return found


def person_key_for(*, email: str = "", phone: str = "", lead_id: Any = None) -> int | None:
    """The id of the person's key, created on first use; None without an e-mail, a phone or a
    ``lead_id``, or with ``PRIVACY_SEALING`` off (the benchmark's comparison: events are then
    stored plain).

    A lead that names its person by neither e-mail nor phone (a name and an employer) gets a
    key of its own, found by its id: its events quote the person too (a rule on the company
    explains itself with the company), and only a key erasure destroys makes them unreadable
    in the append-only log."""
    from leads.models import PersonKey

    if not settings.PRIVACY_SEALING:
        return None
    deferred = _deferred.get()
    if deferred is not None and lead_id is not None:
        deferred[lead_id] = (email, phone, lead_id)  # found with the others: person_keys_for
        return None

    try:
        lookup = lookup_hash(email=email, phone=phone, lead_id=lead_id)
    except ValueError:
        return None
    # The wrapped key comes with the id and is cached: sealing the lead's events right after
    # reads no key again (one read per lead, not a second one for the data key).
    existing = PersonKey.objects.filter(lookup=lookup).values_list("pk", "wrapped").first()
    if existing is not None:
        key_id, wrapped = existing
        hit, _ = _cache.get(key_id)
        if not hit:
            # A key that cannot be unwrapped is said where it is used (audit.sealing.event_seal).
            with contextlib.suppress(PrivacyKeyError):
                _cache.put(key_id, _unwrap(wrapped))
        return int(key_id)
    data_key = Fernet.generate_key()
    wrapped = _master().encrypt(data_key).decode()
    try:
        with transaction.atomic():
            key_id = PersonKey.objects.create(
                lookup=lookup, wrapped=wrapped, wrapped_by=primary_fingerprint()
            ).pk
    except IntegrityError:  # another worker created it meanwhile
        return PersonKey.objects.filter(lookup=lookup).values_list("pk", flat=True).get()
    fernet = Fernet(data_key)
    connection = transaction.get_connection()
    if connection.vendor == "postgresql":
        # A sequence never hands out an id twice, even after a rollback: cached at once, so
        # the lead's events are sealed without reading the key just written.
        _cache.put(key_id, fernet)
    else:
        # SQLite reuses the id of a rolled-back row: cached only once the row is committed.
        transaction.on_commit(lambda: _cache.put(key_id, fernet))
    return key_id


_deferred: ContextVar[dict[Any, tuple[str, str, Any]] | None] = ContextVar(
    "person_keys_deferred", default=None
)


@contextlib.contextmanager
def person_keys_deferred() -> Iterator[dict[Any, tuple[str, str, Any]]]:
    """Inside, ``person_key_for`` (with a ``lead_id``) finds no key: it notes the person by the
    lead's id in the mapping yielded and returns None; the caller then finds them all at once
    with ``person_keys_for`` and sets each lead's ``person_key_id`` (``routing.batch``)."""
    pending: dict[Any, tuple[str, str, Any]] = {}
    token = _deferred.set(pending)
    try:
        yield pending
    finally:
        _deferred.reset(token)


def person_keys_for(people: Mapping[Any, tuple[str, str, Any]]) -> dict[Any, int | None]:
    """``person_key_for`` for many people at once, by the caller's keys: (e-mail, phone, lead
    id) each. Three statements whatever their number: the keys that exist, one insert of the
    missing ones (a key another worker creates meanwhile wins: ``ON CONFLICT DO NOTHING``), and
    their ids read back. The keys are cached as ``person_key_for`` caches them."""
    from leads.models import PersonKey

    if not settings.PRIVACY_SEALING:
        return dict.fromkeys(people)
    lookups: dict[Any, str | None] = {}
    for key, (email, phone, lead_id) in people.items():
        try:
            lookups[key] = lookup_hash(email=email, phone=phone, lead_id=lead_id)
        except ValueError:
            lookups[key] = None
    wanted = sorted({lookup for lookup in lookups.values() if lookup})
    found: dict[str, int] = {}
    for stored_lookup, key_id, wrapped in PersonKey.objects.filter(lookup__in=wanted).values_list(
        "lookup", "pk", "wrapped"
    ):
        found[str(stored_lookup)] = int(key_id)
        hit, _ = _cache.get(key_id)
        if not hit:
            with contextlib.suppress(PrivacyKeyError):
                _cache.put(key_id, _unwrap(wrapped))
    missing = [lookup for lookup in wanted if lookup not in found]
    if missing:
        data_keys = {lookup: Fernet.generate_key() for lookup in missing}
        master = _master()
        wrapped_by = primary_fingerprint()
        mine = {lookup: master.encrypt(data_keys[lookup]).decode() for lookup in missing}
        PersonKey.objects.bulk_create(
            [
                PersonKey(lookup=lookup, wrapped=mine[lookup], wrapped_by=wrapped_by)
                for lookup in missing
            ],
            ignore_conflicts=True,
        )
        postgresql = transaction.get_connection().vendor == "postgresql"
        for stored_lookup, key_id, wrapped in PersonKey.objects.filter(
            lookup__in=missing
        ).values_list("lookup", "pk", "wrapped"):
            lookup = str(stored_lookup)
            found[lookup] = int(key_id)
            if wrapped != mine[lookup]:  # another worker's, committed meanwhile
                with contextlib.suppress(PrivacyKeyError):
                    _cache.put(key_id, _unwrap(wrapped))
                continue
            fernet = Fernet(data_keys[lookup])
            if postgresql:  # as person_key_for: an id is never handed out twice
                _cache.put(key_id, fernet)
            else:
                transaction.on_commit(_cache_on_commit(int(key_id), fernet))
    return {key: found.get(lookup) if lookup else None for key, lookup in lookups.items()}


def _cache_on_commit(key_id: int, fernet: Fernet) -> Any:
    return lambda: _cache.put(key_id, fernet)


def seal(fernet: Fernet, value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return fernet.encrypt(text.encode("utf-8")).decode()


def unseal(fernet: Fernet, sealed: str) -> Any:
    """What ``seal`` sealed; PrivacyKeyError when ``fernet`` is not the key it was sealed with."""
    try:
        return json.loads(fernet.decrypt(sealed.encode()).decode("utf-8"))
    except InvalidToken as exc:
        raise PrivacyKeyError("sealed with another key, or altered") from exc


def split_personal(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what stays plain, what is sealed) of an event's ``data``."""
    plain: dict[str, Any] = {}
    personal: dict[str, Any] = {}
    for key, value in data.items():
        if key in PERSONAL_DATA_KEYS:
            personal[key] = value
        elif key == "crm" and isinstance(value, dict):
            kinds_plain: dict[str, Any] = {}
            kinds_personal: dict[str, Any] = {}
            for kind, entry in value.items():
                if isinstance(entry, dict):
                    kinds_plain[kind] = {
                        k: v for k, v in entry.items() if k not in PERSONAL_CRM_KEYS
                    }
                    hidden = {k: v for k, v in entry.items() if k in PERSONAL_CRM_KEYS}
                    if hidden:
                        kinds_personal[kind] = hidden
                else:
                    kinds_plain[kind] = entry
            plain[key] = kinds_plain
            if kinds_personal:
                personal[key] = kinds_personal
        else:
            plain[key] = value
    return plain, personal


def merge_personal(plain: dict[str, Any], personal: dict[str, Any]) -> dict[str, Any]:
    """The inverse of ``split_personal``."""
    merged = dict(plain)
    for key, value in personal.items():
        if key == "crm" and isinstance(value, dict) and isinstance(merged.get("crm"), dict):
            crm = {kind: dict(entry) for kind, entry in merged["crm"].items()}
            for kind, hidden in value.items():
                crm.setdefault(kind, {}).update(hidden)
            merged["crm"] = crm
        else:
            merged[key] = value
    return merged


def blanked(personal: dict[str, Any], word: str) -> dict[str, Any]:
    """What readers see of sealed ``data`` values when they cannot be opened: ``word``."""
    out: dict[str, Any] = {}
    for key, value in personal.items():
        if key == "crm" and isinstance(value, dict):
            out[key] = {
                kind: dict.fromkeys(hidden, word) if isinstance(hidden, dict) else word
                for kind, hidden in value.items()
            }
        else:
            out[key] = word
    return out


def rewrap_pending(*, include_lost: bool = False) -> Any:
    """The live person keys not (known to be) wrapped under the first master key."""
    from leads.models import PersonKey

    rows = PersonKey.objects.filter(wrapped__isnull=False).exclude(wrapped_by=primary_fingerprint())
    return rows if include_lost else rows.exclude(wrapped_by=LOST)


def rewrap_batch(*, batch: int = 500, include_lost: bool = False) -> tuple[int, int]:
    """Re-wrap up to ``batch`` pending keys under the first master key, in one transaction
    (keys locked with SKIP LOCKED: two runs never take the same one). (handled, lost): keys no
    configured master key unwraps are marked ``LOST`` and left, or, with ``include_lost``,
    raise PrivacyKeyError."""
    from leads.models import PersonKey

    master = _master()
    primary = primary_fingerprint()
    handled = lost = 0
    with transaction.atomic():
        rows = rewrap_pending(include_lost=include_lost).order_by("pk")
        rows = rows.select_for_update(skip_locked=True)
        for key_id, wrapped in list(rows.values_list("pk", "wrapped")[:batch]):
            handled += 1
            try:
                rotated = master.rotate(wrapped.encode()).decode()
            except InvalidToken as exc:
                if include_lost:
                    raise PrivacyKeyError(
                        f"person key {key_id} cannot be unwrapped with PRIVACY_KEYS"
                    ) from exc
                PersonKey.objects.filter(pk=key_id).update(wrapped_by=LOST)
                lost += 1
                continue
            PersonKey.objects.filter(pk=key_id).update(wrapped=rotated, wrapped_by=primary)
    return handled, lost


def rewrap_all(*, batch: int = 500) -> int:
    """Re-wrap every live person key under the first master key; the count re-wrapped.
    A key no configured master key unwraps raises PrivacyKeyError (nothing after it is done)."""
    done = 0
    while True:
        handled, _ = rewrap_batch(batch=batch, include_lost=True)
        done += handled
        if handled < batch:
            return done


def rewrap_scheduled(*, max_seconds: float = 60.0, batch: int = 500) -> tuple[int, int]:
    """The background re-wrap (beat): after a rotation, re-wrap the keys still under an older
    master key, batch by batch for at most ``max_seconds``; (re-wrapped, lost). A key that
    none of ``PRIVACY_KEYS`` unwraps is logged at ERROR and left (``LOST``)."""
    import logging

    logger = logging.getLogger(__name__)
    deadline = time.monotonic() + max_seconds
    done = lost = 0
    while time.monotonic() < deadline:
        handled, gone = rewrap_batch(batch=batch)
        done += handled - gone
        lost += gone
        if handled < batch:
            break
    if lost:
        logger.error(
            "%d person key(s) cannot be unwrapped with any of PRIVACY_KEYS (a master key was "
            "removed before the re-wrap finished?): their sealed history is unreadable until "
            "that key is put back and `manage.py privacy_rewrap` runs",
            lost,
        )
    if done:
        logger.info("re-wrapped %d person key(s) under the first PRIVACY_KEYS key", done)
    return done, lost
