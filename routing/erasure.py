"""Erase one person: every lead of theirs loses its personal data, the decisions stay.

``person_erase`` runs in one transaction per person (nothing half-erased): it finds their leads
(by the e-mail or phone given, and by their person key's lookup hash), locks them (a lead being
routed is erased once its worker commits), overwrites their personal fields and payloads,
destroys their person keys (so the personal content sealed into the append-only audit log can
never be opened again, while its hash chain still verifies), clears the outbox bodies, the
refused inbox rows and the CRM/enrichment/fetch results held for them, and appends an
``erased`` event to each lead's chain: who, when, why and what was cleared, nothing personal.
Which rule, which rep, when: the assignments and the events' plain fields remain.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import connection, transaction
from django.db.models import Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from audit.models import EventType
from audit.services import event_record
from leads import privacy
from leads.models import Lead, PersonKey, RefusedPayload
from routing.delivery.models import Delivery, DeliveryAttempt, DeliveryStatus
from routing.models import AdminJob, AdminJobKind, Assignment

logger = logging.getLogger(__name__)

ERASED = privacy.ERASED
ERASED_PAYLOAD: dict[str, Any] = {"erased": True}
ERASED_TRACE: list[dict[str, Any]] = [{"rule": None, "matched": False, "why": ERASED}]

# What erasure overwrites on a lead, and with what (field by field through ``Lead``; the display
# name becomes "erased person"). Everything that says who the person is, where they are, who
# they work for or how they reached us goes. What stays, on purpose: ``country`` (a country
# names nobody, and reports of the decisions count by it), ``flags`` (what normalisation found
# wrong, e.g. "invalid_email": no value of the person), ``priority`` and ``tags`` (what the
# rules decided), the statuses, times and counters, ``person_key`` (destroyed: the link from
# its sealed events stays) and ``duplicate_of`` (which lead it matched: structure, not data).
LEAD_ERASED_VALUES: dict[str, Any] = {
    "first_name": ERASED,
    "last_name": "",
    "email": "",
    "email_domain": "",
    "phone": "",
    "company": "",
    "domain": "",
    "title": "",
    "region": "",
    "city": "",
    "postal_code": "",
    "employees": None,
    "annual_revenue": None,
    "industry": "",
    "lead_score": None,
    "utm_source": "",
    "utm_medium": "",
    "utm_campaign": "",
    "raw_payload": ERASED_PAYLOAD,
    "custom": {},
    "enrichment": {},
    "crm": {},
    "fetch": {},
    "last_error": "",
    "dedup_key": "",
    "idempotency_key": None,
    "request_fingerprint": "",
}

REDACTED = "[redacted]"
# An e-mail address, and a run of at least PHONE_MIN_DIGITS digits written as phones are
# (spaces, dots, dashes, slashes, brackets, a leading +) in an erasure's reason.
_REASON_EMAIL = re.compile(r"[^\s@<>()\[\],;:\"']+@[^\s@<>()\[\],;:\"']+")
_REASON_DIGITS = re.compile(r"\+?\(?\d(?:[\s./()\-]{0,3}\d)+")
# ... except a date (2026-12-03, 03.12.2026, 03/12/2026): a reason often says when it was asked.
_REASON_DATE = re.compile(r"\d{4}-\d{2}-\d{2}|\d{1,2}[./]\d{1,2}[./]\d{4}")


def reason_redact(reason: str) -> str:
    """The reason of an erasure as it may enter the append-only audit log: any e-mail address
    and any phone-like run of digits (``PHONE_MIN_DIGITS`` or more) replaced by "[redacted]".

    The reason is typed by a person and stays in the log for good: the data they erase must
    not be written there by mistake ("as asked by ann@example.com")."""
    text = _REASON_EMAIL.sub(REDACTED, reason)

    def digits(match: re.Match[str]) -> str:
        run = match.group(0)
        if _REASON_DATE.fullmatch(run.strip()):
            return run
        return REDACTED if sum(ch.isdigit() for ch in run) >= PHONE_MIN_DIGITS else run

    return _REASON_DIGITS.sub(digits, text)


class ErasureRefused(ValueError):
    """The request names no person (no e-mail and no phone)."""


@dataclass(slots=True)
class ErasureResult:
    leads: int = 0
    keys: int = 0
    assignments: int = 0
    deliveries: int = 0
    delivery_attempts: int = 0
    refused_payloads: int = 0
    already_erased: int = 0
    lead_ids: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return bool(self.leads or self.keys or self.refused_payloads)

    def counts(self) -> dict[str, int]:
        return {
            "leads": self.leads,
            "person_keys": self.keys,
            "assignments": self.assignments,
            "deliveries": self.deliveries,
            "delivery_attempts": self.delivery_attempts,
            "refused_payloads": self.refused_payloads,
        }

    def sentence(self) -> str:
        if not self.found:
            return "nothing held about this person (unknown, or erased before)"
        counts = ", ".join(
            f"{value} {name.replace('_', ' ')}" for name, value in self.counts().items()
        )
        return f"erased: {counts}"


# The fewest digits a phone given to find a person must have: "+49" or "030" would name
# everyone whose number holds them.
PHONE_MIN_DIGITS = 7


def person_identifiers_check(email: str, phone: str) -> tuple[str, str]:
    """The e-mail and phone someone typed to name a person, checked: a whole e-mail address and
    a phone of at least ``PHONE_MIN_DIGITS`` digits; ``ErasureRefused`` says what is wrong.

    A fragment ("gmail.com", "+49") must never reach the search: it would name everyone whose
    data holds it, and erase or export them all.
    """
    email, phone = email.strip(), phone.strip()
    if email:
        try:
            validate_email(email)
        except ValidationError:
            raise ErasureRefused(
                "that is not a whole e-mail address: give the person's full address"
            ) from None
    if phone and sum(ch.isdigit() for ch in phone) < PHONE_MIN_DIGITS:
        raise ErasureRefused(
            f"that is not a whole phone number: give at least {PHONE_MIN_DIGITS} digits"
        )
    return email, phone


def _email_pattern(needle: str) -> re.Pattern[str]:
    # The address as a whole value: not inside a longer one ("ann@x.com" in "joann@x.com").
    return re.compile(
        rf"(?<![A-Za-z0-9._%+\-]){re.escape(needle)}(?![A-Za-z0-9\-]|\.[A-Za-z0-9])",
        re.IGNORECASE,
    )


def _phone_pattern(needle: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![0-9]){re.escape(needle)}(?![0-9])")


@dataclass(frozen=True, slots=True)
class _Patterns:
    """The person's e-mails and phones as whole values to find in a payload's text."""

    emails: set[str]
    email_patterns: list[re.Pattern[str]]
    phone_patterns: list[re.Pattern[str]]


def _patterns(emails: set[str], phones: set[str]) -> _Patterns:
    return _Patterns(
        emails={privacy.normalise_email(e) for e in emails},
        email_patterns=[_email_pattern(n) for e in emails for n in _needles(e, "")],
        phone_patterns=[_phone_pattern(n) for p in phones for n in _needles("", p)],
    )


# Any e-mail address in a payload's text.
_ANY_EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+")


def _holds(text: str, patterns: _Patterns) -> bool:
    """Whether the text holds one of the person's e-mails, or one of their phones and no one
    else's e-mail: as on a lead, a phone beside another e-mail may be a shared switchboard."""
    if any(pattern.search(text) for pattern in patterns.email_patterns):
        return True
    if not any(pattern.search(text) for pattern in patterns.phone_patterns):
        return False
    found = {privacy.normalise_email(m) for m in _ANY_EMAIL.findall(text)}
    return found <= patterns.emails


def _needles(email: str, phone: str) -> list[str]:
    out = []
    if email:
        out += [email, privacy.normalise_email(email)]
    if phone:
        out += [phone, privacy.normalise_phone(phone)]
    return sorted({n for n in out if len(n) >= 3})


def _refused_ids(emails: set[str], phones: set[str]) -> set[int]:
    """Refused inbox rows whose body holds one of the e-mails or phones as a whole value.

    The database finds the bodies that contain it byte for byte; each is then checked for the
    whole value (``_holds``), so "ann@example.com" does not take joann@example.com's rows.
    """
    table = RefusedPayload._meta.db_table
    candidates: set[int] = set()
    with connection.cursor() as cursor:
        for needle in _all_needles(emails, phones):
            # Without regard to case (an e-mail is typed as "Ann@Example.com" as often as
            # not). A body is bytes and need not be UTF-8: PostgreSQL compares it as its
            # `escape` text (ASCII as is, other bytes as \nnn), SQLite as its bytes.
            if connection.vendor == "postgresql":
                sql = (
                    f"SELECT id FROM {table} "  # noqa: S608 (our own table's name)
                    "WHERE position(%s in lower(encode(body, 'escape'))) > 0"
                )
                cursor.execute(sql, [_escaped(needle.lower())])
            else:
                sql = f"SELECT id FROM {table} WHERE instr(lower(body), %s) > 0"  # noqa: S608
                cursor.execute(sql, [needle.lower()])
            candidates |= {row[0] for row in cursor.fetchall()}
    patterns = _patterns(emails, phones)
    found: set[int] = set()
    for pk, body in RefusedPayload.objects.filter(pk__in=candidates).values_list("pk", "body"):
        if _holds(bytes(body or b"").decode("utf-8", "replace"), patterns):
            found.add(pk)
    return found


def _escaped(text: str) -> str:
    """``text`` as PostgreSQL's ``encode(bytes, 'escape')`` writes its UTF-8 bytes."""
    out = []
    for byte in text.encode():
        if byte == 0x5C:
            out.append("\\\\")
        elif byte == 0 or byte >= 0x80:
            out.append(f"\\{byte:03o}")
        else:
            out.append(chr(byte))
    return "".join(out)


def _all_needles(emails: set[str], phones: set[str]) -> list[str]:
    return sorted(
        {n for e in emails for n in _needles(e, "")} | {n for p in phones for n in _needles("", p)}
    )


def refused_ids_holding(emails: set[str], phones: set[str]) -> set[int]:
    """Refused inbox rows whose body holds one of these e-mails or phones (whole values)."""
    return _refused_ids(emails, phones)


def _lookups(emails: set[str], phones: set[str]) -> list[str]:
    return [privacy.lookup_hash(email=e) for e in sorted(emails)] + [
        privacy.lookup_hash(phone=p) for p in sorted(phones)
    ]


def _person_leads(
    emails: set[str], phones: set[str], lead_ids: list[Any], *, lock: bool = True
) -> list[Lead]:
    """The leads these identifiers (or ids) name, in id order (locked unless ``lock`` False)."""
    match = Q(pk__in=list(lead_ids))
    for email in emails:
        match |= Q(email__iexact=privacy.normalise_email(email))
    for phone in phones:
        # A phone names the person of a lead without an e-mail only (whose key is the
        # phone's): on a lead with an e-mail it may be a switchboard that colleagues share,
        # and following it erased (and exported) them, and every lead of their e-mails.
        match |= Q(email="") & (Q(phone=privacy.normalise_phone(phone)) | Q(phone=phone))
    match |= Q(person_key__lookup__in=_lookups(emails, phones))
    # Leads not normalised yet (still queued) hold the person only in their raw payload.
    raw = Q()
    for email in emails:
        for needle in _needles(email, ""):
            raw |= Q(raw_text__icontains=needle)
    for phone in phones:
        for needle in _needles("", phone):
            raw |= Q(raw_text__icontains=needle)
    if raw:
        # Contains it (the database), then holds it as a whole value (checked here): a queued
        # lead of joann@example.com is not ann@example.com's.
        patterns = _patterns(emails, phones)
        candidates = (
            Lead.objects.filter(normalized_at__isnull=True)
            .annotate(raw_text=Cast("raw_payload", TextField()))
            .filter(raw)
            .values_list("pk", "raw_text")
        )
        match |= Q(pk__in=[pk for pk, text in candidates if _holds(str(text or ""), patterns)])
    rows = Lead.objects.filter(match).order_by("pk")
    if lock and connection.features.has_select_for_update:
        rows = rows.select_for_update(of=("self",))
    return list(rows)


def person_identify(
    *, email: str = "", phone: str = "", lead_ids: list[Any] | None = None, lock: bool = False
) -> tuple[list[Lead], set[str], set[str]]:
    """The person's leads, e-mails and phones: whoever the e-mail, phone or lead ids name, and
    every e-mail their leads hold (not every phone: a phone found that way may be a switchboard
    others share). ``lock``: the leads are locked (inside a transaction)."""
    email, phone = email.strip(), phone.strip()
    emails = {email} if email else set()
    phones = {phone} if privacy.normalise_phone(phone).lstrip("+") else set()
    leads: list[Lead] = []
    for _ in range(4):
        leads = _person_leads(emails, phones, lead_ids or [], lock=lock)
        found = {lead.email for lead in leads if lead.email}
        if {e.lower() for e in found} <= {e.lower() for e in emails}:
            break
        emails |= found
    return leads, emails, phones


@dataclass(slots=True)
class Cleared:
    """What ``leads_around_clear`` cleared around some leads."""

    refused_payloads: int = 0
    assignments: int = 0
    deliveries: int = 0
    delivery_attempts: int = 0
    admin_jobs: int = 0


# A replay's stored result (routing/admin_jobs.py, ``replay_result_data``) names each lead it
# decided by its e-mail and company: those of erased or pruned leads are blanked in place.
_REPLAY_PERSONAL = ("email", "company")
_REPLAY_ID_CHUNK = 200


def admin_jobs_redact(*, lead_ids: list[Any]) -> int:
    """Blank what the stored replay results say about these leads' people (their e-mail and
    company); the rows stay (which lead, before and after). The number of jobs changed."""
    wanted = {str(pk) for pk in lead_ids}
    if not wanted:
        return 0
    ids = sorted(wanted)
    candidates: set[int] = set()
    for start in range(0, len(ids), _REPLAY_ID_CHUNK):
        contains = Q()
        for lead_id in ids[start : start + _REPLAY_ID_CHUNK]:
            contains |= Q(result_text__contains=lead_id)
        candidates |= set(
            AdminJob.objects.filter(kind=AdminJobKind.REPLAY)
            .annotate(result_text=Cast("result", TextField()))
            .filter(contains)
            .values_list("pk", flat=True)
        )
    changed = 0
    jobs = AdminJob.objects.filter(pk__in=candidates).order_by("pk")
    if connection.features.has_select_for_update:
        jobs = jobs.select_for_update()
    for job in jobs:
        result = job.result if isinstance(job.result, dict) else {}
        rows = result.get("rows")
        if not isinstance(rows, list):
            continue
        touched = False
        for row in rows:
            if isinstance(row, dict) and str(row.get("lead_id")) in wanted:
                for name in _REPLAY_PERSONAL:
                    if row.get(name):
                        row[name] = ""
                        touched = True
        if touched:
            AdminJob.objects.filter(pk=job.pk).update(result=result)
            changed += 1
    return changed


def leads_around_clear(*, lead_ids: list[Any], refused_ids: set[int] | None = None) -> Cleared:
    """Clear what is personal *around* these (locked) leads, inside the caller's transaction:
    their refused inbox rows (and ``refused_ids``) deleted, their assignments' traces, their
    deliveries' bodies (pending ones cancelled) and attempts' excerpts blanked, the admin's log
    lines naming them, and their e-mail and company in stored replay results. Shared by
    erasure and retention (routing/retention/)."""
    cleared = Cleared()
    refused = set(refused_ids or ()) | set(
        RefusedPayload.objects.filter(lead_id__in=lead_ids).values_list("pk", flat=True)
    )
    if refused:
        cleared.refused_payloads, _ = RefusedPayload.objects.filter(pk__in=refused).delete()
    cleared.assignments = Assignment.objects.filter(lead_id__in=lead_ids).update(trace=ERASED_TRACE)
    deliveries = Delivery.objects.filter(assignment__lead_id__in=lead_ids)
    Delivery.objects.filter(
        pk__in=deliveries.filter(status=DeliveryStatus.PENDING).values("pk")
    ).update(status=DeliveryStatus.CANCELLED, next_attempt_at=None)
    cleared.deliveries = Delivery.objects.filter(pk__in=deliveries.values("pk")).update(
        payload=ERASED_PAYLOAD, last_error=""
    )
    cleared.delivery_attempts = DeliveryAttempt.objects.filter(
        delivery__assignment__lead_id__in=lead_ids
    ).update(error="", response_excerpt="")
    # The admin's change log names a lead by its display name (its e-mail).
    LogEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(Lead),
        object_id__in=[str(pk) for pk in lead_ids],
    ).update(object_repr=ERASED, change_message="")
    cleared.admin_jobs = admin_jobs_redact(lead_ids=lead_ids)
    return cleared


def person_erase(
    *,
    email: str = "",
    phone: str = "",
    actor: str,
    reason: str,
    lead_ids: list[Any] | None = None,
) -> ErasureResult:
    """Erase everything personal held about the person with this e-mail or phone.

    ``lead_ids``: leads of this person to erase whatever their fields say (the lead an erasure
    was asked for by id: one still queued holds the person only in its raw payload). Unknown,
    or erased before: an empty result (``found`` False), nothing written, no error.
    """
    email, phone = email.strip(), phone.strip()
    if not email and not privacy.normalise_phone(phone).lstrip("+") and not lead_ids:
        raise ErasureRefused("name the person: an e-mail or a phone")
    if not lead_ids:  # typed by someone, not read off the person's own lead
        email, phone = person_identifiers_check(email, phone)
    result = ErasureResult()
    now = timezone.now()
    with transaction.atomic(durable=True):
        leads, emails, phones = person_identify(
            email=email, phone=phone, lead_ids=lead_ids, lock=True
        )
        lookups = _lookups(emails, phones)
        key_ids = {lead.person_key_id for lead in leads if lead.person_key_id is not None}
        key_ids |= set(PersonKey.objects.filter(lookup__in=lookups).values_list("pk", flat=True))
        result.keys = PersonKey.objects.filter(pk__in=key_ids, wrapped__isnull=False).update(
            wrapped=None, lookup=None, erased_at=now
        )
        # Re-checked under the lock: of two erasures at once, the second finds the leads
        # erased by the first and writes nothing again (no second `erased` event).
        fresh = [lead for lead in leads if lead.erased_at is None]
        result.already_erased = len(leads) - len(fresh)
        lead_ids = [lead.pk for lead in fresh]
        cleared = leads_around_clear(lead_ids=lead_ids, refused_ids=_refused_ids(emails, phones))
        result.refused_payloads = cleared.refused_payloads
        result.assignments = cleared.assignments
        result.deliveries = cleared.deliveries
        result.delivery_attempts = cleared.delivery_attempts
        for lead in fresh:
            for name, value in LEAD_ERASED_VALUES.items():
                setattr(lead, name, value)
            lead.erased_at = now
            lead.save(update_fields=[*LEAD_ERASED_VALUES, "erased_at"])
            result.leads += 1
            result.lead_ids.append(str(lead.pk))
        counts = result.counts()
        why = reason_redact(reason)[:500]
        for lead in fresh:
            event_record(
                type=EventType.ERASED,
                lead_id=lead.pk,
                actor=actor,
                at=now,
                data={"reason": why, "erased": counts},
            )
    privacy.cache_clear()
    logger.info("person erased by %s: %s", actor, result.sentence())
    return result


def is_erased(lead: Lead) -> bool:
    """Whether this lead's person was erased (``erased_at``, set by ``person_erase``)."""
    return lead.erased_at is not None


def lead_person_erase(*, lead_id: Any, actor: str, reason: str) -> ErasureResult:
    """Erase the person of one lead: this lead and every other lead of theirs (by its e-mail,
    else its phone: ``person_of_lead``), as ``person_erase``. A lead erased before answers
    ``already_erased`` and nothing is written again (checked again under the lock: two
    erasures at once write one); an unknown lead raises ``Lead.DoesNotExist``."""
    lead = Lead.objects.only("pk", "email", "phone", "erased_at").get(pk=lead_id)
    if is_erased(lead):
        return ErasureResult(already_erased=1, lead_ids=[str(lead.pk)])
    email, phone = person_of_lead(lead)
    return person_erase(email=email, phone=phone, actor=actor, reason=reason, lead_ids=[lead.pk])


def person_of_lead(lead: Lead) -> tuple[str, str]:
    """(e-mail, phone) that name a lead's person, as its key does: the e-mail when it has one,
    else the phone. The phone of a lead with an e-mail is not the person's name: it may be a
    switchboard, and following it would take the callers who left only that number."""
    return (lead.email, "") if lead.email else ("", lead.phone)
