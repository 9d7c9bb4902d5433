"""The personal content of audit events, sealed at write and opened at read (leads/privacy.py).

An event about a lead whose person has a key stores its trace and the personal values of its
``data`` (``PERSONAL_DATA_KEYS``) only as ``sealed``: ciphertext under that person's key. The
rest of ``data`` stays plain (reports query it). Loading an event opens it again (the model's
``from_db``), so readers see the same ``data`` and ``trace`` as before; once the person is
erased they see "erased person" instead. Events written before sealing existed have no
``sealed`` and are read (and hashed) as they always were.
"""

from __future__ import annotations

from typing import Any

from leads import privacy

# The plain `data` key listing the sealed values' paths ("summary", "crm.hubspot.person").
MARK = "_sealed"


def _paths(personal: dict[str, Any]) -> list[str]:
    paths = []
    for key, value in personal.items():
        if key == "crm" and isinstance(value, dict):
            paths += [f"crm.{kind}.{name}" for kind, hidden in value.items() for name in hidden]
        else:
            paths.append(key)
    return sorted(paths)


def _blank(plain: dict[str, Any], paths: list[Any], word: str) -> dict[str, Any]:
    data = {key: value for key, value in plain.items() if key != MARK}
    for path in paths:
        parts = str(path).split(".")
        if len(parts) == 3 and parts[0] == "crm" and isinstance(data.get("crm"), dict):
            crm = {kind: dict(entry) for kind, entry in data["crm"].items()}
            crm.setdefault(parts[1], {})[parts[2]] = word
            data["crm"] = crm
        else:
            data[parts[0]] = word
    return data


def event_seal(values: dict[str, Any], person_key_id: int | None) -> None:
    """Move the personal content of an event's ``values`` into ``sealed`` (in place)."""
    values["person_key_id"] = None
    values["sealed"] = None
    if person_key_id is None:
        return
    plain, personal = privacy.split_personal(values["data"])
    trace = values["trace"]
    if not personal and not trace:
        return
    fernet = privacy.person_fernet(person_key_id)
    if fernet is None:
        # The person was erased while this lead was still being processed: nothing personal
        # is written about them any more.
        values["data"] = {**plain, **privacy.blanked(personal, privacy.ERASED)}
        values["trace"] = [{"rule": None, "matched": False, "why": privacy.ERASED}] if trace else []
        return
    # Which values are sealed (their names, nothing personal): shown as "erased person" later.
    values["data"] = {**plain, MARK: _paths(personal)}
    values["trace"] = []
    values["person_key_id"] = person_key_id
    values["sealed"] = privacy.seal(fernet, {"data": personal, "trace": trace})


def events_open(events: list[Any]) -> None:
    """``event_open`` for many events, their people's keys read in one query."""
    sealed = [event for event in events if _openable(event)]
    key_ids = {event.person_key_id for event in sealed if event.person_key_id}
    keys: dict[int, Any] = {}
    if key_ids:
        try:
            keys = privacy.person_fernets(key_ids)
        except privacy.PrivacyKeyError:  # one key cannot be unwrapped: each said on its own
            keys = {}
    for event in sealed:
        _event_open(event, keys)


def _openable(event: Any) -> bool:
    return bool(event.__dict__.get("sealed")) and {"data", "trace"} <= event.__dict__.keys()


def event_open(event: Any) -> None:
    """Put an event's sealed content back into its ``data`` and ``trace`` (in memory only)."""
    if _openable(event):
        _event_open(event, {})


def _event_open(event: Any, keys: dict[int, Any]) -> None:
    plain = event.data if isinstance(event.data, dict) else {}
    try:
        if not event.person_key_id:
            fernet = None
        elif event.person_key_id in keys:
            fernet = keys[event.person_key_id]
        else:
            fernet = privacy.person_fernet(event.person_key_id)
        word = privacy.ERASED
    except privacy.PrivacyKeyError:
        fernet, word = None, privacy.UNREADABLE
    opened: Any = None
    if fernet is not None:
        try:
            opened = privacy.unseal(fernet, event.sealed)
        except (privacy.PrivacyKeyError, ValueError, TypeError):
            opened, word = None, privacy.UNREADABLE
    event.erased = opened is None
    marked = plain.get(MARK)
    paths: list[Any] = marked if isinstance(marked, list) else []
    if opened is None:
        event.data = _blank(plain, paths, word)
        event.trace = [{"rule": None, "matched": False, "why": word}]
        return
    event.data = privacy.merge_personal(_blank(plain, [], word), opened.get("data") or {})
    event.trace = opened.get("trace") or []
