"""Typeform: the ``form_response`` webhook.

Shapes from Typeform's developer docs: "Example webhook payload"
(https://www.typeform.com/developers/webhooks/example-payload/) — ``form_response.answers[]``,
each with a ``type`` and the value under that type's name (``text``, ``email``,
``phone_number``, ``number``, ``boolean``, ``date``, ``url``, ``file_url``, ``choice.label``,
``choices.labels``, ``payment``), joined to ``form_response.definition.fields[]`` (the
question's ``title`` and ``ref``) by ``field.id``; ``hidden`` fields; ``calculated.score``;
``variables``; ``token`` (the response's id). Grouped questions (``group``, ``inline_group``,
``contact_info``) nest their questions under the field's ``properties.fields``, as in the
Create API's form definition (https://www.typeform.com/developers/create/reference/create-form/).
"Secure your webhooks" (https://www.typeform.com/developers/webhooks/secure-your-webhooks/):
``Typeform-Signature: sha256=<base64 HMAC-SHA256 of the raw body, keyed by the secret>``.

A question becomes a canonical field by its answer's type (e-mail, phone number) or by its ref
or title ("company", "What's your job title?"); every other answer is kept under the
question's title. The response token is the idempotency key: Typeform's re-sends of one
response carry the same token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import datetime
from typing import Any

from leads.normalize import canonical_key
from leads.sources.base import (
    Inbound,
    Options,
    Record,
    SourceKind,
    as_text,
    get,
    put,
    scalar_or_joined,
)
from leads.sources.labels import (
    CHOICE_TARGETS,
    NUMBER_TARGETS,
    TEXT_TARGETS,
    question_target,
)

SIGNATURE_HEADER = "Typeform-Signature"

# The answer type's own meaning wins over the question's wording.
_TYPE_TARGETS = {"email": "email", "phone_number": "phone"}
_TEXT_TYPES = frozenset({"text", "email", "phone_number", "url"})
# Never a canonical field, whatever the question says ("Do you have a favourite city?").
_OPAQUE_TYPES = frozenset({"boolean", "date", "file_url", "payment"})
# Links that are not the company's website.
_NOT_WEBSITE = ("linkedin", "twitter", "calendar", "github", "portfolio", "profile")


def _questions(fields: Any, index: dict[str, dict[str, Any]]) -> None:
    """field id and ref → field definition, groups included (their questions are answered one
    by one, each under its own id)."""
    if not isinstance(fields, list):
        return
    for field in fields:
        if not isinstance(field, dict):
            continue
        for key in ("id", "ref"):
            ident = field.get(key)
            if isinstance(ident, str) and ident and ident not in index:
                index[ident] = field
        inner = get(field, "properties", "fields")
        if isinstance(inner, list):
            _questions(inner, index)


def _value(answer: dict[str, Any]) -> Any:
    """An answer's value, as a scalar where it can be one."""
    kind = as_text(answer.get("type"))
    if kind == "choice":
        choice = answer.get("choice")
        return get(choice, "label") or get(choice, "other") if isinstance(choice, dict) else None
    if kind == "choices":
        choices = answer.get("choices")
        if not isinstance(choices, dict):
            return None
        labels = choices.get("labels")
        picked = [as_text(x) for x in labels] if isinstance(labels, list) else []
        if isinstance(choices.get("other"), str):
            picked.append(choices["other"])
        picked = [text for text in picked if text.strip()]
        return "; ".join(picked) or None
    if kind == "payment":
        return get(answer, "payment", "amount")
    if kind and kind in answer:
        return scalar_or_joined(answer[kind])
    return None


def _target(answer_type: str, field_type: str, ref: str, title: str) -> str | None:
    """The canonical field an answer fills, or None."""
    if answer_type in _TYPE_TARGETS:
        return _TYPE_TARGETS[answer_type]
    if answer_type in _OPAQUE_TYPES:
        return None
    if answer_type in _TEXT_TYPES:
        allowed: frozenset[str] = TEXT_TARGETS
    elif answer_type == "number":
        allowed = NUMBER_TARGETS
    elif answer_type in ("choice", "choices"):
        allowed = CHOICE_TARGETS
    else:
        return None
    # A readable ref ("company", "job_title") says what the author meant; a generated one
    # (a UUID) says nothing and maps to nothing.
    target = canonical_key(ref) if ref else None
    if target is not None and target in allowed:
        return target
    target = question_target(title, allowed)
    other_link = any(word in title.casefold() for word in _NOT_WEBSITE)
    if target is None and answer_type == "url" and field_type in ("website", "url", ""):
        target = None if other_link else "website"
    return target


def decode(record: Record, options: Options) -> Record:
    response = get(record, "form_response")
    if not isinstance(response, dict):
        # A response as the Responses API lists it ({"items": [...]}, one item each) reads
        # the same: the answers and hidden fields at its top level.
        response = record
    out: Record = {}
    index: dict[str, dict[str, Any]] = {}
    _questions(get(response, "definition", "fields"), index)

    answers = get(response, "answers")
    custom: list[tuple[str, Any]] = []
    for answer in answers if isinstance(answers, list) else ():
        if not isinstance(answer, dict):
            continue
        field = answer.get("field") if isinstance(answer.get("field"), dict) else {}
        field_id = as_text(get(field, "id"))
        ref = as_text(get(field, "ref"))
        question = index.get(field_id) or index.get(ref) or {}
        ref = ref or as_text(question.get("ref"))
        title = as_text(question.get("title")).strip()
        answer_type = as_text(answer.get("type"))
        field_type = as_text(get(field, "type")) or as_text(question.get("type"))
        value = _value(answer)
        if value is None or as_text(value).strip() == "":
            continue
        target = _target(answer_type, field_type, ref, title)
        if target is not None and target not in out:
            out[target] = value
        else:
            custom.append((title or ref or field_id or answer_type, value))
        if answer_type == "payment":
            put(out, f"{title or 'payment'} (paid by)", get(answer, "payment", "name"))
            put(out, f"{title or 'payment'} (succeeded)", get(answer, "payment", "success"))
    for key, value in custom:
        put(out, key, value)

    # Hidden fields are the form URL's own parameters (utm_source=..., email=...): kept under
    # their names, so the aliases read utm_* and anything else the author passes through.
    hidden = get(response, "hidden")
    if isinstance(hidden, dict):
        for key, value in hidden.items():
            if isinstance(key, str):
                put(out, key if key not in out else f"hidden {key}", value)
    score = get(response, "calculated", "score")
    variables = get(response, "variables")
    for variable in variables if isinstance(variables, list) else ():
        name = as_text(get(variable, "key"))
        if name:
            kind = as_text(get(variable, "type"))
            value = get(variable, kind) if kind else None
            if name == "score" and score is None:
                score = value
            else:
                put(out, f"variable {name}", value)
    put(out, "lead_score", score)

    put(out, "external_id", get(response, "token"))
    put(out, "typeform_event_id", get(record, "event_id"))
    put(out, "typeform_form_id", get(response, "form_id"))
    put(out, "typeform_form_title", get(response, "definition", "title"))
    put(out, "typeform_landing_id", get(response, "landing_id"))
    put(out, "submitted_at", get(response, "submitted_at"))
    put(out, "landed_at", get(response, "landed_at"))
    put(out, "typeform_ending_ref", get(response, "ending", "ref"))
    metadata = get(response, "metadata")
    if isinstance(metadata, dict):
        put(out, "referer", metadata.get("referer"))
        put(out, "user_agent", metadata.get("user_agent"))
    return out


def verify(inbound: Inbound, secret: str, now: datetime) -> bool:
    """``Typeform-Signature: sha256=<base64 HMAC-SHA256 of the body>`` (no timestamp: Typeform
    signs the body only)."""
    sent = inbound.header(SIGNATURE_HEADER).strip()
    if not secret or not sent.startswith("sha256="):
        return False
    digest = hmac.new(secret.encode("utf-8"), inbound.body, hashlib.sha256).digest()
    expected = base64.b64encode(digest).decode("ascii")
    return hmac.compare_digest(sent[len("sha256=") :].strip(), expected)


KIND = SourceKind(
    name="typeform",
    label="Typeform (form_response webhook)",
    docs="https://www.typeform.com/developers/webhooks/example-payload/",
    decode=decode,
    verify=verify,
    signature_header=SIGNATURE_HEADER,
)
