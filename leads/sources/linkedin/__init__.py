"""LinkedIn Lead Gen Forms: a lead form response, or the lead notification that announces one.

Shapes from LinkedIn's Marketing API docs on Microsoft Learn:

- "Lead Forms" / Lead Sync (https://learn.microsoft.com/en-us/linkedin/marketing/lead-sync/leadsync)
  and its schema page (https://learn.microsoft.com/en-us/linkedin/marketing/lead-sync/lead-sync-schema):
  a ``leadFormResponses`` element — ``id``, ``leadType``, ``owner``, ``submitter``,
  ``submittedAt``, ``testLead``, ``versionedLeadGenFormUrn``, ``leadMetadata``,
  ``associatedEntity`` and ``formResponse.answers[]`` of ``{questionId, answerDetails:
  {textQuestionAnswer: {answer}} | {multipleChoiceAnswer: {options: [option ids]}}}`` plus
  ``consentResponses``. With the ``form:(...)`` projection of LinkedIn's Postman collection
  ("Schedule periodic form response (lead) pulls") the element also carries the form:
  ``form.content.questions[]`` with ``questionId``, ``name``, localized ``question`` text,
  ``predefinedField`` (FIRST_NAME, EMAIL, COMPANY_NAME...) and the choice options, and
  ``form.hiddenFields``.
- The lead notification webhook (``type: LEAD_ACTION``, ``leadGenFormResponse`` URN,
  ``leadAction`` CREATED / DELETED, ``occurredAt``...), which carries ids only.
- "Webhooks" (https://learn.microsoft.com/en-us/linkedin/shared/api-guide/webhook-validation):
  the GET validation (``challengeCode`` → JSON ``{challengeCode, challengeResponse}``, the
  response being the hex HMAC-SHA256 of the code keyed by the app's client secret) and the
  ``X-LI-Signature`` header: the hex HMAC-SHA256 of ``"hmacsha256=" + body``.

Answers name questions by id only. A response that carries its form is read through it; else
the source option ``questions`` (``{"<questionId>": "<canonical field or label>"}``) says what
each id means; an answer left unexplained is kept as ``question <id>``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from datetime import datetime
from typing import Any

from leads.normalize import (
    CANONICAL_FIELDS,
    FULL_NAME,
    canonical_key,
    normalize_email,
    normalize_phone,
)
from leads.sources.base import (
    Inbound,
    Options,
    Record,
    Reply,
    SourceKind,
    as_text,
    get,
    json_in,
    put,
)

SIGNATURE_HEADER = "X-LI-Signature"
_SIGNATURE_PREFIX = "hmacsha256="

# LinkedIn's predefined question types (``predefinedField``) → canonical field, or a readable
# label for the ones no canonical field holds.
_PREDEFINED: dict[str, str] = {
    "FIRST_NAME": "first_name",
    "LAST_NAME": "last_name",
    "FULL_NAME": FULL_NAME,
    "EMAIL": "email",
    "WORK_EMAIL": "email",
    "PHONE_NUMBER": "phone",
    "WORK_PHONE_NUMBER": "phone",
    "COMPANY_NAME": "company",
    "JOB_TITLE": "title",
    "COUNTRY": "country",
    "STATE": "region",
    "CITY": "city",
    "ZIP_CODE": "postal_code",
    "POSTAL_CODE": "postal_code",
    "COMPANY_SIZE": "employees",
    "INDUSTRY": "industry",
    "COMPANY_WEBSITE": "website",
    "JOB_FUNCTION": "Job function",
    "SENIORITY": "Seniority",
    "GENDER": "Gender",
    "DEGREE": "Degree",
    "FIELD_OF_STUDY": "Field of study",
    "SCHOOL": "School",
    "START_DATE": "Start date",
    "GRADUATION_DATE": "Graduation date",
    "LINKEDIN_PROFILE_LINK": "LinkedIn profile",
}
_TARGETS = frozenset((*CANONICAL_FIELDS, FULL_NAME))
_URN_PREFIX = "urn:li:leadGenFormResponse:"
_UUID_RE = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def _scalar(value: Any) -> Any:
    if isinstance(value, list):
        parts = [as_text(item).strip() for item in value if not isinstance(item, dict | list)]
        parts = [part for part in parts if part]
        return "; ".join(parts) if parts else None
    if isinstance(value, dict):
        return None
    return value


def _blank(value: Any) -> bool:
    return value is None or as_text(value).strip() == ""


def _put(out: Record, key: str, value: Any) -> None:
    """``out[key] = value`` for a non-blank scalar; a taken key gets a numbered twin."""
    put(out, key, _scalar(value))


def _localized(value: Any) -> str:
    """A MultiLocaleString (``{"localized": {"en_US": "..."}}``) or plain text, as text."""
    value = json_in(value)
    if isinstance(value, dict):
        localized = value.get("localized")
        if isinstance(localized, dict):
            for text in localized.values():
                if isinstance(text, str) and text.strip():
                    return text.strip()
        return ""
    return as_text(value).strip()


def _question_id(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return str(value).strip() or None


def _bare_id(value: Any) -> str | None:
    """The response id without its URN prefix, so that a notification and the response it
    announces share one idempotency key."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    text = str(value).strip()
    return text.removeprefix(_URN_PREFIX) or None


class _Question:
    """What a form says about one question: where its answer goes and its choices' labels."""

    def __init__(self, item: dict[str, Any]) -> None:
        predefined = get(item, "predefinedField")
        self.predefined = predefined if isinstance(predefined, str) else ""
        self.label = _localized(get(item, "question")) or as_text(get(item, "name")).strip()
        self.name = as_text(get(item, "name")).strip()
        self.choices: dict[str, str] = {}
        details = get(item, "questionDetails", "multipleChoiceQuestionDetails", "options")
        for option in details if isinstance(details, list) else ():
            option_id = _question_id(get(option, "id"))
            text = _localized(get(option, "text")) or _localized(get(option, "value"))
            if option_id is not None and text:
                self.choices[option_id] = text


def _form_questions(response: Record) -> dict[str, _Question]:
    questions = get(response, "form", "content", "questions")
    if not isinstance(questions, list):
        questions = get(response, "form", "questions")
    found: dict[str, _Question] = {}
    for item in questions if isinstance(questions, list) else ():
        qid = _question_id(get(item, "questionId"))
        if qid is not None and isinstance(item, dict):
            found[qid] = _Question(item)
    return found


def _option_questions(options: Options) -> dict[str, str]:
    """The ``questions`` option: ``{"<questionId>": "<field or label>"}`` (or the same as JSON)."""
    raw = json_in(options.get("questions")) if isinstance(options, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {
        str(key).strip(): value.strip()
        for key, value in raw.items()
        if isinstance(value, str) and value.strip()
    }


def _target(name: str) -> str | None:
    """A canonical field for a mapping target or a question's own name, if it means one."""
    if name in _TARGETS:
        return name
    predefined = _PREDEFINED.get(name.strip().upper())
    if predefined in _TARGETS:
        return predefined
    return canonical_key(name)


def _answer_value(answer: dict[str, Any], question: _Question | None) -> Any:
    details = get(answer, "answerDetails")
    text = get(details, "textQuestionAnswer", "answer")
    if text is not None:
        return text
    chosen = get(details, "multipleChoiceAnswer", "options")
    if isinstance(chosen, list):
        # Choices by their labels where the form is at hand; their ids otherwise.
        labels = [
            (question.choices.get(as_text(option)) if question else None) or as_text(option)
            for option in chosen
            if not isinstance(option, dict | list)
        ]
        return "; ".join(label for label in labels if label.strip()) or None
    # Other answer kinds and older shapes ({"answer": "..."}): a scalar if there is one.
    return _scalar(get(answer, "answer"))


def _sniffed(value: Any) -> str | None:
    """For an answer nothing explains (no form, no ``questions`` option): ``email`` when it is
    a valid e-mail address, ``phone`` when it is a valid international number. Names, companies
    and countries cannot be told from their values, so those stay ``question <id>``."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if "@" in text:
        email, valid = normalize_email(text)
        return "email" if email and valid else None
    if text.startswith(("+", "00")) and normalize_phone(text, None):
        return "phone"
    return None


def _answers(response: Record, options: Options, out: Record) -> None:
    answers = get(response, "formResponse", "answers")
    if not isinstance(answers, list):
        answers = get(response, "answers")
    if not isinstance(answers, list):
        return
    questions = _form_questions(response)
    mapping = _option_questions(options)
    second: list[tuple[str, Any]] = []
    for answer in answers:
        if not isinstance(answer, dict):
            continue
        qid = _question_id(get(answer, "questionId"))
        question = questions.get(qid) if qid is not None else None
        value = _answer_value(answer, question)
        if _blank(value):
            continue
        label = (question.label if question else "") or f"question {qid}"
        mapped = mapping.get(qid or "")
        predefined = get(answer, "predefinedField") or (question.predefined if question else "")
        own_name = get(answer, "name") or (question.name if question else "")
        target: str | None = None
        if mapped:
            # The source's own mapping wins; a label that is no field names the answer.
            target = _target(mapped)
            label = mapped if target is None else label
        elif isinstance(predefined, str) and predefined:
            meaning = _PREDEFINED.get(predefined.upper())
            target = meaning if meaning in _TARGETS else None
            label = meaning if meaning and target is None else label
        elif isinstance(own_name, str) and own_name:
            target = _target(own_name)
        if target is None and not (mapped or predefined or own_name):
            target = _sniffed(value)
        if target is not None and _blank(out.get(target)):
            out[target] = value
        else:
            second.append((label, value))
    # Answers that no field took, under their question's text (never a bare field name, which
    # would shadow the field).
    for label, value in second:
        _put(out, f"{label} (answer)" if label in _TARGETS else label, value)


def _urn_text(value: Any) -> str:
    """An owner / associated-entity object ({"sponsoredAccount": urn}) as its one URN."""
    value = json_in(value)
    if isinstance(value, dict):
        urns = [as_text(v) for v in value.values() if isinstance(v, str | int)]
        return "; ".join(urn for urn in urns if urn)
    return as_text(value)


# Keys of a response decoded on purpose; any other scalar is kept under its own name (a tool
# that forwards LinkedIn leads flat, "First Name" / "Email", is read through the aliases).
_RESPONSE_HANDLED = frozenset(
    {
        "id",
        "leadType",
        "submittedAt",
        "testLead",
        "owner",
        "ownerInfo",
        "submitter",
        "versionedLeadGenFormUrn",
        "associatedEntity",
        "associatedEntityInfo",
        "leadMetadata",
        "leadMetadataInfo",
        "form",
        "formResponse",
        "answers",
    }
)
_NOTIFICATION_HANDLED = frozenset(
    {
        "leadGenFormResponse",
        "type",
        "leadAction",
        "occurredAt",
        "leadType",
        "leadGenForm",
        "owner",
        "associatedEntity",
    }
)


def _rest(record: Record, handled: frozenset[str], out: Record) -> None:
    for key, value in record.items():
        if isinstance(key, str) and key not in handled:
            _put(out, key, value)


def _response(response: Record, options: Options, out: Record) -> None:
    _answers(response, options, out)
    _put(out, "external_id", _bare_id(get(response, "id")))
    _put(out, "linkedin_lead_type", get(response, "leadType"))
    _put(out, "linkedin_submitted_at", get(response, "submittedAt"))
    _put(out, "linkedin_test_lead", get(response, "testLead"))
    _put(out, "linkedin_owner", _urn_text(get(response, "owner")))
    _put(out, "linkedin_submitter", get(response, "submitter"))
    _put(out, "linkedin_form", get(response, "versionedLeadGenFormUrn"))
    _put(out, "linkedin_associated_entity", _urn_text(get(response, "associatedEntity")))
    metadata = get(response, "leadMetadata")
    if isinstance(metadata, dict):
        for part in metadata.values():
            if isinstance(part, dict):
                _put(out, "linkedin_campaign", part.get("campaign"))
    campaign_name = get(
        response, "leadMetadataInfo", "sponsoredLeadMetadataInfo", "campaign", "name"
    )
    _put(out, "linkedin_campaign_name", campaign_name)
    _put(out, "linkedin_form_name", get(response, "form", "name"))
    hidden = get(response, "form", "hiddenFields")
    for item in hidden if isinstance(hidden, list) else ():
        name = get(item, "name")
        if isinstance(name, str) and name.strip():
            _put(out, name.strip(), get(item, "value"))
    consents = get(response, "formResponse", "consentResponses")
    for item in consents if isinstance(consents, list) else ():
        consent_id = _question_id(get(item, "consentId"))
        if consent_id is not None:
            _put(out, f"consent {consent_id}", as_text(get(item, "accepted")))
    _rest(response, _RESPONSE_HANDLED, out)


def _notification(record: Record, out: Record) -> None:
    _put(out, "external_id", _bare_id(get(record, "leadGenFormResponse")))
    _put(out, "linkedin_lead_response", get(record, "leadGenFormResponse"))
    _put(out, "linkedin_notification_type", get(record, "type"))
    _put(out, "linkedin_lead_action", get(record, "leadAction"))
    _put(out, "linkedin_occurred_at", get(record, "occurredAt"))
    _put(out, "linkedin_lead_type", get(record, "leadType"))
    _put(out, "linkedin_form", get(record, "leadGenForm"))
    _put(out, "linkedin_owner", _urn_text(get(record, "owner")))
    _put(out, "linkedin_associated_entity", _urn_text(get(record, "associatedEntity")))
    _rest(record, _NOTIFICATION_HANDLED, out)


NOTIFICATION_MESSAGE = (
    " This is a LinkedIn lead notification: it carries only the form response's id, not the "
    "person. Post the form response itself to this source (Lead Sync API "
    "GET /rest/leadFormResponses/{id}, or Zapier's 'New Form Response'; docs/revops.md), which "
    "is a lead with the same id."
)


def awaits_fetch(record: Record, options: Options) -> str | None:
    """Why a lead notification is refused (LeadRouter does not fetch from LinkedIn's API), None
    for anything else."""
    if get(record, "leadGenFormResponse") is not None and get(record, "formResponse") is None:
        return NOTIFICATION_MESSAGE
    return None


def decode(record: Record, options: Options) -> Record:
    out: Record = {}
    if get(record, "leadGenFormResponse") is not None and get(record, "formResponse") is None:
        _notification(record, out)
        return out
    response = record
    # A finder page ({"elements": [response, ...]}) read as its first response.
    elements = get(record, "elements")
    if get(record, "formResponse") is None and isinstance(elements, list):
        response = next((item for item in elements if isinstance(item, dict)), record)
    _response(response, options, out)
    return out


def verify(inbound: Inbound, secret: str, now: datetime) -> bool:
    """``X-LI-Signature``: hex HMAC-SHA256 of ``"hmacsha256=" + body`` keyed by the client
    secret (a header that repeats the ``hmacsha256=`` prefix is read too)."""
    sent = inbound.header(SIGNATURE_HEADER).strip().lower().removeprefix(_SIGNATURE_PREFIX)
    if not secret or not sent:
        return False
    message = _SIGNATURE_PREFIX.encode() + inbound.body
    expected = hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()
    return hmac.compare_digest(sent.encode(), expected.encode())


def handshake(inbound: Inbound, secret: str, options: Options) -> Reply | None:
    """LinkedIn's GET validation: ``challengeCode`` answered with its HMAC under the secret."""
    code = inbound.query.get("challengeCode", "")
    if inbound.method.upper() != "GET" or not code:
        return None
    # Only a UUID, as LinkedIn sends: answering any string would make this an oracle that signs
    # "hmacsha256=<any body>" for whoever asks (the handshake runs before authentication).
    if not _UUID_RE.fullmatch(code):
        return Reply(400, b"The challengeCode is not a UUID.")
    if not secret:
        return Reply(403, b"The source has no client secret to answer the challenge with.")
    response = hmac.new(secret.encode("utf-8"), code.encode("utf-8"), hashlib.sha256).hexdigest()
    body = json.dumps({"challengeCode": code, "challengeResponse": response})
    return Reply(200, body.encode("utf-8"), "application/json")


KIND = SourceKind(
    name="linkedin",
    label="LinkedIn Lead Gen Forms",
    docs="https://learn.microsoft.com/en-us/linkedin/marketing/lead-sync/leadsync",
    decode=decode,
    verify=verify,
    signature_header=SIGNATURE_HEADER,
    handshake=handshake,
    awaits_fetch=awaits_fetch,
    options={
        "questions": 'What each question id means: {"<questionId>": "<canonical field or '
        'label>"}, e.g. {"1": "first_name", "7": "Budget"}; needed when responses arrive '
        "without their form.",
    },
)
