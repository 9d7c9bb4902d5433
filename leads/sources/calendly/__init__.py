"""Calendly: webhook subscriptions for booked and canceled meetings and routing form submissions.

Shapes from Calendly's developer docs: "Receive data from scheduled events in real time with
webhook subscriptions"
(https://developer.calendly.com/receive-data-from-scheduled-events-in-real-time-with-webhook-subscriptions)
and the webhook payload reference (https://developer.calendly.com/api-docs/): an envelope
``{"event": "invitee.created" | "invitee.canceled" | "routing_form_submission.created",
"created_at", "created_by", "payload": {...}}``. For the invitee events the payload is the
Invitee resource (``uri``, ``email``, ``name``, ``first_name``, ``last_name``,
``text_reminder_number``, ``timezone``, ``questions_and_answers[{question, answer, position}]``,
``tracking{utm_*, salesforce_uuid}``, ``scheduled_event{name, start_time, ...}``, ``cancellation``
...); for routing forms it is the submission (``uri``, ``routing_form``,
``questions_and_answers[{question_uuid, question, answer}]``, ``tracking``, ``result``,
``submitter``). Signing: "Webhook signatures" — ``Calendly-Webhook-Signature: t=<unix time>,
v1=<hex HMAC-SHA256 of "<t>.<body>" keyed by the webhook signing key>``, with Calendly's
suggested 3-minute tolerance against replays.

Booking questions are the host's own, so their answers are read by question text ("Company",
"Phone number", "What is your job title?"); every other answer is kept under its question.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import datetime
from typing import Any

from leads.normalize import CANONICAL_FIELDS, FULL_NAME, canonical_key
from leads.sources.base import Inbound, Options, Record, SourceKind, as_text, get, put

SIGNATURE_HEADER = "Calendly-Webhook-Signature"
TOLERANCE_SECONDS = 3 * 60
_TARGETS = frozenset((*CANONICAL_FIELDS, FULL_NAME))

# Question text → canonical field, for short questions only (a sentence-long question is
# about something else). Checked in order: "Company website" is a website, not a company.
_QUESTION_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), target)
    for pattern, target in (
        (r"\b(e-?mail)\b", "email"),
        (r"\b(website|web site|url|homepage)\b", "website"),
        (r"\bdomain\b", "domain"),
        (r"\b(phone|mobile|telephone|cell)\b", "phone"),
        (r"\b(employees|company size|team size|headcount|how many people)\b", "employees"),
        (r"\brevenue\b", "annual_revenue"),
        (r"\bindustry\b", "industry"),
        (r"\b(company|organi[sz]ation|employer|business name)\b", "company"),
        (r"\b(job title|title|role|position)\b", "title"),
        (r"\bfirst name\b", "first_name"),
        (r"\b(last name|surname)\b", "last_name"),
        (r"\bcountry\b", "country"),
        (r"\b(state|province|region)\b", "region"),
        (r"\bcity\b", "city"),
        (r"\b(zip|postal code|postcode)\b", "postal_code"),
    )
)
_QUESTION_MAX_WORDS = 8

# Invitee / submission keys decoded on purpose; other scalars are kept under their own names.
_HANDLED = frozenset(
    {
        "uri",
        "email",
        "name",
        "first_name",
        "last_name",
        "text_reminder_number",
        "questions_and_answers",
        "tracking",
        "scheduled_event",
        "cancellation",
        "payment",
        "no_show",
        "reconfirmation",
        "result",
        "event",
    }
)


def _blank(value: Any) -> bool:
    return value is None or isinstance(value, dict | list) or as_text(value).strip() == ""


def _put(out: Record, key: str, value: Any) -> None:
    """``out[key] = value`` for a non-blank scalar; a taken key gets a numbered twin."""
    if isinstance(value, list):
        parts = [as_text(v).strip() for v in value if not isinstance(v, dict | list)]
        value = "; ".join(part for part in parts if part) or None
    put(out, key, value)


def question_target(question: str) -> str | None:
    """The canonical field a booking question asks for, or None."""
    text = " ".join(question.split()).rstrip("?:* ")
    target = canonical_key(text)
    if target is not None:
        return target
    if not text or len(text.split()) > _QUESTION_MAX_WORDS:
        return None
    for pattern, field in _QUESTION_RULES:
        if pattern.search(text):
            return field
    if re.search(r"\bname\b", text, re.IGNORECASE):
        return FULL_NAME  # "Your name", "What is your name?" (company names matched above)
    return None


def _questions(items: Any, out: Record) -> None:
    for item in items if isinstance(items, list) else ():
        question = get(item, "question")
        answer = get(item, "answer")
        if isinstance(answer, list):
            parts = [as_text(v).strip() for v in answer if not isinstance(v, dict | list)]
            answer = "; ".join(part for part in parts if part)
        if not isinstance(question, str) or not question.strip() or _blank(answer):
            continue
        question = question.strip()
        target = question_target(question)
        if target is not None and _blank(out.get(target)):
            out[target] = answer
        else:
            _put(out, f"{question} (answer)" if question in _TARGETS else question, answer)


def _tracking(tracking: Any, out: Record) -> None:
    if not isinstance(tracking, dict):
        return
    for key, value in tracking.items():
        if isinstance(key, str):
            # utm_source / utm_medium / utm_campaign are fields; utm_content, utm_term and
            # salesforce_uuid are kept as they are.
            _put(out, key, value)


def _scheduled_event(event: Any, out: Record) -> None:
    if not isinstance(event, dict):
        return
    _put(out, "event_name", get(event, "name"))
    _put(out, "event_start_time", get(event, "start_time"))
    _put(out, "event_end_time", get(event, "end_time"))
    _put(out, "event_status", get(event, "status"))
    _put(out, "event_uri", get(event, "uri"))
    _put(out, "event_type", get(event, "event_type"))
    location = get(event, "location")
    if isinstance(location, dict):
        _put(out, "event_location_type", get(location, "type"))
        _put(out, "event_location", get(location, "location") or get(location, "join_url"))
    # The hosts (event_memberships) are the customer's own people, not the lead: left out.


def _invitee(payload: Record, event: str, out: Record) -> None:
    _put(out, "email", get(payload, "email"))
    _put(out, "first_name", get(payload, "first_name"))
    _put(out, "last_name", get(payload, "last_name"))
    _put(out, FULL_NAME, get(payload, "name"))
    _questions(get(payload, "questions_and_answers"), out)
    # The SMS reminder number is the invitee's phone when no booking question asked for one.
    if _blank(out.get("phone")):
        _put(out, "phone", get(payload, "text_reminder_number"))
    else:
        _put(out, "text_reminder_number", get(payload, "text_reminder_number"))
    uri = as_text(get(payload, "uri"))
    # A cancellation is about the invitee a booking already made a lead of: it gets a key of
    # its own, so that it is not refused as a reused key with a different body.
    if uri and event == "invitee.canceled":
        uri = f"{uri}#canceled"
    _put(out, "external_id", uri)
    _tracking(get(payload, "tracking"), out)
    _scheduled_event(get(payload, "scheduled_event"), out)
    _put(out, "scheduled_event", get(payload, "event"))  # the older payloads' event URI
    _put(out, "cancel_reason", get(payload, "cancellation", "reason"))
    _put(out, "canceler_type", get(payload, "cancellation", "canceler_type"))
    _put(out, "canceled_by", get(payload, "cancellation", "canceled_by"))
    _put(out, "payment_amount", get(payload, "payment", "amount"))
    _put(out, "payment_currency", get(payload, "payment", "currency"))
    _put(out, "no_show_at", get(payload, "no_show", "created_at"))


def _submission(payload: Record, out: Record) -> None:
    _questions(get(payload, "questions_and_answers"), out)
    _put(out, "external_id", get(payload, "uri"))
    _tracking(get(payload, "tracking"), out)
    _put(out, "routing_result_type", get(payload, "result", "type"))
    _put(out, "routing_result", get(payload, "result", "value"))


def decode(record: Record, options: Options) -> Record:
    out: Record = {}
    event = as_text(get(record, "event"))
    payload = get(record, "payload")
    if not isinstance(payload, dict):
        # Not an envelope: a bare Invitee (or submission) resource, as the API returns it.
        payload = record
        event = ""
    if event.startswith("routing_form_submission") or get(payload, "routing_form") is not None:
        _submission(payload, out)
    else:
        _invitee(payload, event, out)
    for key, value in payload.items():
        if isinstance(key, str) and key not in _HANDLED:
            _put(out, key, value)
    _put(out, "calendly_event", event)
    _put(out, "calendly_created_at", get(record, "created_at") if payload is not record else "")
    return out


def _signature_parts(header: str) -> tuple[int | None, list[str]]:
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.strip().isdigit():
            timestamp = int(value.strip())
        elif key == "v1" and value.strip():
            signatures.append(value.strip().lower())
    return timestamp, signatures


def verify(inbound: Inbound, secret: str, now: datetime) -> bool:
    """``Calendly-Webhook-Signature: t=<ts>,v1=<hex HMAC-SHA256 of "<ts>.<body>">`` with the
    signing key, and ``t`` within three minutes of ``now``."""
    timestamp, signatures = _signature_parts(inbound.header(SIGNATURE_HEADER))
    if not secret or timestamp is None or not signatures:
        return False
    if abs(now.timestamp() - timestamp) > TOLERANCE_SECONDS:
        return False
    message = f"{timestamp}.".encode() + inbound.body
    expected = hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest().encode()
    return any(hmac.compare_digest(sent.encode(), expected) for sent in signatures)


KIND = SourceKind(
    name="calendly",
    label="Calendly (webhooks: booked / canceled meetings, routing forms)",
    docs="https://developer.calendly.com/receive-data-from-scheduled-events-in-real-time-with-webhook-subscriptions",
    decode=decode,
    verify=verify,
    signature_header=SIGNATURE_HEADER,
)
