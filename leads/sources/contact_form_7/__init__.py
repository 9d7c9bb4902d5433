"""Contact Form 7: submissions relayed by its webhook add-ons ("CF7 to Webhook" and the like).

Shapes from Contact Form 7's docs and the add-on's: CF7 names every form-tag
(https://contactform7.com/tag-syntax/) and its default form is ``[text* your-name]``,
``[email* your-email]``, ``[text* your-subject]``, ``[textarea your-message]``; tags the form
editor generates are named type-number (``tel-123``, ``email-456``, ``text-company`` once
renamed). "CF7 to Webhook" (https://wordpress.org/plugins/cf7-to-zapier/, github.com/
mariovalney/cf7-to-zapier) posts the submitted data as a JSON object keyed by those names
(a ``webhook:`` tag option renames a key), a checkbox or a select as an array of choices, a
file as its URL; relays that forward the raw POST add CF7's hidden ``_wpcf7*`` fields.

A name is read by the aliases, then without its CF7 prefix (``your-phone`` → phone,
``text-company`` → company), then by the prefix's type for a generated name (``tel-123`` is
a phone). CF7 has no submission id, so the idempotency key is left to the intake.
"""

from __future__ import annotations

import re
from typing import Any

from leads.normalize import canonical_key
from leads.sources.base import Options, Record, SourceKind, as_text, get, put, scalar_or_joined

# CF7 form-tag types (and the "your" of the default form) that begin a field's name.
_PREFIXES = frozenset(
    {
        "your",
        "text",
        "email",
        "url",
        "tel",
        "number",
        "range",
        "date",
        "textarea",
        "select",
        "menu",
        "checkbox",
        "radio",
        "acceptance",
        "quiz",
        "file",
        "hidden",
        "field",
    }
)
# What a generated name's type says it holds: ``tel-123`` is a phone whatever its number.
_PREFIX_TYPES = {"tel": "phone", "email": "email", "url": "website"}
_SEPARATOR = re.compile(r"[-_]")
# One-time answers to the form's spam check: secrets of no use to anyone afterwards.
_DROPPED = frozenset({"g-recaptcha-response", "_wpcf7_recaptcha_response", "cf-turnstile-response"})


def _target(name: str) -> str | None:
    """The canonical field a CF7 field name means, or None."""
    direct = canonical_key(name)
    if direct is not None:
        return direct
    parts = _SEPARATOR.split(name, maxsplit=1)
    if len(parts) != 2 or parts[0].casefold() not in _PREFIXES:
        return None
    prefix, rest = parts[0].casefold(), parts[1]
    if rest.isdigit():
        return _PREFIX_TYPES.get(prefix)
    return canonical_key(rest) or _PREFIX_TYPES.get(prefix)


def decode(record: Record, options: Options) -> Record:
    out: Record = {}
    later: list[tuple[str, Any]] = []
    for key, value in record.items():
        if not isinstance(key, str) or key in _DROPPED:
            continue
        name = key[:-2] if key.endswith("[]") and len(key) > 2 else key  # a raw POST's checkbox
        value = get(record, key)
        if isinstance(value, dict):
            # A file relayed as {name, url}, say: its parts, each under the field's name.
            for part, part_value in value.items():
                if isinstance(part, str):
                    later.append((f"{name} {part}", part_value))
            continue
        target = _target(name.strip())
        joined = scalar_or_joined(value)
        if (
            target is not None
            and target not in out
            and not isinstance(joined, dict | list)
            and as_text(joined).strip()
        ):
            out[target] = joined
            continue
        later.append((name, value))
    for name, value in later:
        put(out, name, value)
    return out


KIND = SourceKind(
    name="contact_form_7",
    label="Contact Form 7 (via CF7 to Webhook or another relay; JSON or form post)",
    docs="https://wordpress.org/plugins/cf7-to-zapier/",
    decode=decode,
)
