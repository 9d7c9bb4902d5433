"""Source kinds: one decoder per marketing tool, and the one way a stored record becomes flat.

Every kind is a module ``leads.sources.<name>`` exposing ``KIND`` (a ``SourceKind``), with the
vendor's documented sample payloads in ``fixtures/`` beside it and a test per fixture under
``tests/leads/sources/``. Adding a kind: write the module, list it in ``KIND_MODULES``, add its
fixtures and tests, and a recipe in docs/revops.md (docs/api.md lists the names).

``flatten`` is what the kickoff, the worker, simulate and the try-it page all call, so that a
record is read the same way everywhere. Nothing here imports Django.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from leads.normalize import FULL_NAME, canonical_key, is_a_lead, map_fields
from leads.sources.base import Record, SourceKind
from leads.sources.deep import found_below
from leads.sources.paths import is_path, resolve

GENERIC = "generic"

# Module names under leads.sources, in the order the admin lists them (generic first).
KIND_MODULES: tuple[str, ...] = (
    GENERIC,
    # CRMs and marketing automation
    "hubspot",
    "salesforce",
    "marketo",
    "pardot",
    # forms and surveys
    "typeform",
    "tally",
    "jotform",
    "unbounce",
    "webflow",
    # ad platforms and scheduling
    "meta_lead_ads",
    "linkedin",
    "google_ads",
    "calendly",
    # product and e-mail tools
    "intercom",
    "segment",
    "mailchimp",
    # WordPress form plugins
    "gravity_forms",
    "wpforms",
    "contact_form_7",
    # webinars (CSV reports)
    "zoom",
    "gotowebinar",
    "on24",
)

FLAG_DECODER_FAILED = "decoder_failed"
FLAG_FOUND_BELOW = "found_below_top_level"


@functools.cache
def kinds() -> dict[str, SourceKind]:
    """Every built-in kind by name."""
    found: dict[str, SourceKind] = {}
    for module_name in KIND_MODULES:
        kind = importlib.import_module(f"leads.sources.{module_name}").KIND
        if kind.name in found:
            raise ValueError(f"two kinds are named {kind.name!r}")
        found[kind.name] = kind
    return found


def kind_get(name: str | None) -> SourceKind:
    """The kind called ``name``; the generic kind for a blank or unknown name."""
    return kinds().get(name or GENERIC) or kinds()[GENERIC]


def kind_choices() -> list[tuple[str, str]]:
    return [(kind.name, kind.label) for kind in kinds().values()]


# What a page shows in place of a secret kind option that is set (a token is never shown again).
SECRET_KEPT = "[secret: kept; type a new value to replace it]"  # noqa: S105 - a mask


def options_masked(kind: str | None, options: Any) -> dict[str, Any]:
    """A source's kind options as a page may show them: each secret option set is masked."""
    shown = dict(options) if isinstance(options, dict) else {}
    for name in kind_get(kind).secret_options:
        if shown.get(name):
            shown[name] = SECRET_KEPT
    return shown


def options_unmasked(edited: Any, stored: Any) -> Any:
    """Kind options edited on a page, with each masked secret back to its stored value (a mask
    whose value is gone is dropped)."""
    if not isinstance(edited, dict):
        return edited
    kept = stored if isinstance(stored, dict) else {}
    out = {}
    for key, value in edited.items():
        if value == SECRET_KEPT:
            if key in kept:
                out[key] = kept[key]
            continue
        out[key] = value
    return out


@dataclass(frozen=True)
class Flattened:
    """A stored record read by its source's kind: the flat record the field mapping sees."""

    record: Record
    flags: tuple[str, ...] = ()
    decoder_error: str = ""
    # map_fields(record, field_map)'s canonical half, kept so the kickoff does not map twice.
    canonical: dict[str, Any] | None = None
    # True when ``canonical`` is known to be a lead (is_a_lead), so the kickoff need not ask
    # again; None: not asked of this canonical.
    lead: bool | None = None


def _present_targets(canonical: Mapping[str, Any]) -> frozenset[str]:
    present = {
        target
        for target, value in canonical.items()
        if value not in (None, "") and not isinstance(value, dict | list)
    }
    if present & {"first_name", "last_name"}:
        present.add(FULL_NAME)
    return frozenset(present)


def flatten(
    record: Any,
    *,
    kind: str | None = GENERIC,
    field_map: Mapping[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> Flattened:
    """``record`` as a flat record: the kind's decoder, then the field map's paths, then (when
    that still is not a lead) the canonical values found below the top level. Never raises."""
    if not isinstance(record, dict):
        return Flattened({}, (FLAG_DECODER_FAILED,), "the record is not a JSON object")
    source_kind = kind_get(kind)
    flags: list[str] = []
    error = ""
    try:
        flat = source_kind.decode(record, options or {})
        if not isinstance(flat, dict):
            raise TypeError(f"the {source_kind.name} decoder returned {type(flat).__name__}")
    except Exception as exc:  # a decoder bug or an odd payload: read it generically instead
        error = f"{source_kind.label}: {type(exc).__name__}: {str(exc)[:300]}"
        flags.append(FLAG_DECODER_FAILED)
        flat = dict(record)

    # The field map's paths come first, so that a path wins over what the decoder found.
    mapping = field_map if isinstance(field_map, Mapping) else None
    if mapping:
        from_paths: Record = {}
        for key in mapping:
            if is_path(key) and key not in flat:
                found, value = resolve(record, key)
                if found:
                    from_paths[key] = value
        if from_paths:
            flat = {**from_paths, **{k: v for k, v in flat.items() if k not in from_paths}}

    canonical, _custom = map_fields(flat, mapping)
    if is_a_lead(canonical):
        return Flattened(flat, tuple(flags), error, canonical, lead=True)
    present = _present_targets(canonical)
    # A kind whose decoder read no one from the payload (a plain form post sent to a
    # Typeform or Segment source, say): the record's own top-level fields, as the generic
    # kind reads them, so that a lead plain at the top level is not refused for its kind.
    top: Record = {}
    if source_kind.name != GENERIC and not present:
        for key, value in record.items():
            if (
                isinstance(key, str)
                and key not in flat
                and value not in (None, "")
                and isinstance(value, str | int | float)
                and canonical_key(key) is not None
            ):
                top[key] = value
    below = found_below(record, skip=present | {canonical_key(key) or "" for key in top})
    extra = {**top, **{key: value for key, value in below.items() if key not in flat}}
    # A top-level key holding a structure ("email": {"value": ...}) yields to what was
    # found inside it: its structure stays in the raw payload.
    for key, value in below.items():
        if key in flat and isinstance(flat[key], dict | list):
            extra[key] = value
    if extra:
        flat = {**flat, **extra}
        canonical, _custom = map_fields(flat, mapping)
        if any(canonical_key(key) for key in extra if key not in top):
            flags.append(FLAG_FOUND_BELOW)
    return Flattened(flat, tuple(flags), error, canonical)


def source_flatten(source: Any, record: Any) -> Flattened:
    """``record`` read as its source reads it: the source's kind, kind options and field map.

    ``source`` is anything with those three attributes (the Source model, in practice).
    """
    options = getattr(source, "kind_options", None)
    return flatten(
        record,
        kind=getattr(source, "kind", GENERIC),
        field_map=getattr(source, "field_map", None) or None,
        options=options if isinstance(options, dict) else None,
    )


def record_is_lead(flattened: Flattened, field_map: Mapping[str, str] | None) -> bool:
    """The kickoff's check on a flattened record (leads.normalize.is_a_lead)."""
    canonical = flattened.canonical
    if canonical is None:
        canonical, _custom = map_fields(flattened.record, field_map)
    return is_a_lead(canonical)
