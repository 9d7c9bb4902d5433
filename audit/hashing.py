"""The hash chain: what each event's hash covers, computed the same way at write and verify."""

from __future__ import annotations

import hashlib
import json
import math
from datetime import UTC, datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

# The columns the hash covers, in a fixed order (ids of the FKs, not objects).
HASHED = (
    "chain",
    "seq",
    "lead_id",
    "type",
    "at",
    "actor",
    "rep_id",
    "team_id",
    "rule_id",
    "rep_name",
    "team_name",
    "rule_name",
    "ruleset_version",
    "data",
    "trace",
    "prev_hash",
)
# Covered too when an event has sealed personal content (leads/privacy.py): the ciphertext, so
# the chain holds after the person's key is destroyed. Events without it hash as they always did.
SEALED = ("person_key_id", "sealed")


def plain_json(value: Any) -> Any:
    """``value`` as the database will give it back: JSON types only, integral floats as ints.

    PostgreSQL's jsonb keeps numbers as numerics (``1e20`` comes back as an integer) and both
    backends refuse NaN; normalising before storing makes what is hashed equal to what is read.
    """
    if (type(value) is dict or type(value) is list) and not value:
        return type(value)()  # an empty one reads back as itself
    loaded = json.loads(json.dumps(value, cls=DjangoJSONEncoder, allow_nan=False))
    return _integral(loaded)


def _integral(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(key): _integral(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral(item) for item in value]
    return value


def _at(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def event_hash(values: dict[str, Any]) -> str:
    """SHA-256 over the canonical JSON of the hashed columns of one event."""
    return hashlib.sha256(event_hash_text(values).encode("utf-8")).hexdigest()


def event_hash_text(values: dict[str, Any]) -> str:
    """The canonical JSON of the hashed columns of one event: what ``event_hash`` hashes."""
    canonical: dict[str, Any] = {}
    for name in HASHED:
        value = values.get(name)
        if name == "at":
            value = _at(value) if isinstance(value, datetime) else value
        elif name == "lead_id" and value is not None:
            value = str(value)
        elif name in ("data", "trace"):
            value = _integral(value)
        canonical[name] = value
    if values.get("sealed") or values.get("person_key_id") is not None:
        for name in SEALED:
            canonical[name] = values.get(name)
    return json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
