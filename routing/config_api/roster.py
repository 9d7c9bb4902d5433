"""The roster API's services: create, change, upsert and deactivate reps; plan their time off.

A rep's fields are checked by the rules file's own checks (``rules_io.rep_fields_check``) and
then by ``Rep.full_clean`` (a renamed e-mail that rules still name is refused). Each change
locks the rep's row first, so two syncs changing one rep at once apply one after the other,
each to the row as the other left it (last writer wins per field, no lost update). A change
that makes a rep unavailable (inactive, out of office, an absence under way) re-routes their
untouched leads after it commits, through ``reps_became_unavailable_after``, the import's and
the admin's path. Every write is a ``config_changed`` event by ``actor`` in its transaction.

A rep's design (name, e-mail, time zone, working hours, caps; a new rep) is part of the routed
configuration: a change of it runs as a live change (``routing.drafts.live``), under the
configuration lock and the decide lock (taken before the rep's row: no lead is decided half on
the old design and half on the new), and is stored as the next numbered configuration version,
audited like a publish, which rollback covers. It is not gated by the saved test cases (the
roster records facts from HR, not a routing design). A change of only the rep's live state
(``active``, ``out_of_office_until``, absences) is no version; the database records it
(``RepStateChange``). While another publish, import or replay holds the configuration lock past
``LOCK_WAIT_SECONDS``, a design change is refused (409 ``configuration_busy``), nothing written.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models.functions import Lower
from django.utils import timezone

from audit.config_changes import config_change_record, stored_values
from routing.configuration import LOCK_WAIT_SECONDS, ConfigurationBusy
from routing.drafts.live import LiveChangeRefused, config_live_change
from routing.drafts.snapshots import LIVE_REP_KEYS
from routing.models import Rep
from routing.timeoff.models import RepAbsence
from routing.timeoff.services import (
    rep_absence_cancel,
    rep_absence_save,
    reps_became_unavailable_after,
)


class RosterError(Exception):
    """A roster change refused: ``code`` and ``status`` for the API, ``fields`` by key."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int = 400,
        fields: dict[str, list[str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.fields = fields


def _invalid(error: ValidationError) -> RosterError:
    fields = (
        {
            ("" if key == "__all__" else key): [str(m) for m in messages]
            for key, messages in error.message_dict.items()
        }
        if hasattr(error, "error_dict")
        else {"": [str(m) for m in error.messages]}
    )
    return RosterError("invalid_body", "The rep is invalid.", fields=fields)


def ref_is_id(ref: str) -> bool:
    """Whether a rep's reference is an id: ASCII digits only (``str.isdigit`` takes "²" too,
    which ``int`` refuses)."""
    ref = ref.strip()
    return ref.isascii() and ref.isdigit()


def rep_find(*, ref: str) -> Rep | None:
    """The rep of an id (ASCII digits) or an e-mail (ignoring case)."""
    ref = ref.strip()
    if ref_is_id(ref):
        return Rep.objects.filter(pk=int(ref)).first() if len(ref) < 12 else None
    return Rep.objects.annotate(key=Lower("email")).filter(key=ref.lower()).first()


def _locked(rep_id: int) -> Rep:
    return Rep.objects.select_for_update().get(pk=rep_id)


def _changes_design(rep: Rep | None, values: Mapping[str, Any]) -> bool:
    """Whether writing ``values`` creates a rep (``rep`` None) or changes a design field."""
    if rep is None:
        return True
    return any(
        getattr(rep, name) != value for name, value in values.items() if name not in LIVE_REP_KEYS
    )


@contextmanager
def _version_of_design(*, actor: str, what: str) -> Iterator[None]:
    """A design change of the roster as a configuration version (see the module docstring)."""
    try:
        with config_live_change(
            actor=actor,
            what=f"the roster API ({what})"[:200],
            wait_seconds=LOCK_WAIT_SECONDS,
            locks_claimed_rows=True,  # the decide lock before the rep's row (a lead locks it)
        ):
            yield
    except ConfigurationBusy as error:
        raise RosterError("configuration_busy", str(error), status=409) from None
    except LiveChangeRefused as error:
        raise RosterError("configuration_invalid", str(error), status=409) from None


class _DesignChanged(Exception):
    """The rep's design changed between the unlocked look and its row lock: do it as a version."""


def _save(rep: Rep, values: Mapping[str, Any]) -> None:
    for name, value in values.items():
        setattr(rep, name, value)
    try:
        rep.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as error:
        raise _invalid(error) from None
    taken = (
        Rep.objects.annotate(key=Lower("email"))
        .filter(key=rep.email.lower())
        .exclude(pk=rep.pk)
        .exists()
    )
    if taken:
        raise _taken(rep.email)
    try:
        with transaction.atomic():
            rep.save()
    except IntegrityError:  # the same e-mail saved by another request meanwhile
        raise _taken(rep.email) from None


def _taken(email: str) -> RosterError:
    return RosterError(
        "rep_exists",
        f"Another rep has the e-mail {email}.",
        status=409,
        fields={"email": ["Taken by another rep."]},
    )


@dataclass(frozen=True)
class RepWritten:
    """A rep after a roster write, and whether it was created by it."""

    rep: Rep
    created: bool


@transaction.atomic
def rep_create(*, values: Mapping[str, Any], actor: str) -> Rep:
    """Create a rep from checked values (``email`` and ``name`` required); audited, and a
    configuration version (a new rep is part of the design)."""
    missing = {key: ["is required"] for key in ("email", "name") if key not in values}
    if missing:
        raise RosterError("invalid_body", "A new rep needs an e-mail and a name.", fields=missing)
    with _version_of_design(actor=actor, what=f"{values['email']} added"):
        rep = Rep()
        _save(rep, values)
        config_change_record(actor=actor, obj=rep, action="added", after=stored_values(rep))
    return rep


def rep_update(
    *, rep_id: int, values: Mapping[str, Any], actor: str, action: str = "changed"
) -> Rep:
    """Change the given fields of a rep, under its row lock (audited); re-route their
    untouched leads after the commit if the change makes them unavailable. A change of the
    rep's design is a configuration version (see the module docstring)."""
    design = _changes_design(Rep.objects.filter(pk=rep_id).first(), values)
    for _attempt in range(2):
        try:
            return _rep_update(
                rep_id=rep_id, values=values, actor=actor, action=action, design=design
            )
        except _DesignChanged:
            design = True
    raise AssertionError("unreachable")  # pragma: no cover


@transaction.atomic
def _rep_update(
    *, rep_id: int, values: Mapping[str, Any], actor: str, action: str, design: bool
) -> Rep:
    if not design:
        return _rep_write(rep_id=rep_id, values=values, actor=actor, action=action, design=False)
    with _version_of_design(actor=actor, what=f"rep {rep_id} {action}"):
        return _rep_write(rep_id=rep_id, values=values, actor=actor, action=action, design=True)


def _rep_write(
    *, rep_id: int, values: Mapping[str, Any], actor: str, action: str, design: bool
) -> Rep:
    rep = _locked(rep_id)  # raises Rep.DoesNotExist
    if not design and _changes_design(rep, values):
        raise _DesignChanged  # another sync changed the rep meanwhile: again, as a version
    why = "deactivated" if values.get("active") is False else "became unavailable"
    with reps_became_unavailable_after(emails=[rep.email], actor=actor, why=f"{why} (roster API)"):
        before = stored_values(rep)
        _save(rep, values)
        config_change_record(
            actor=actor, obj=rep, action=action, before=before, after=stored_values(rep)
        )
    return rep


@transaction.atomic
def rep_upsert(*, email: str, values: Mapping[str, Any], actor: str) -> RepWritten:
    """Create the rep of ``email`` or change it (the keys given; the rest as they are)."""
    given = values.get("email")
    if given is not None and given.lower() != email.strip().lower():
        raise RosterError(
            "invalid_body",
            "The body's e-mail differs from the URL's: change an e-mail with PATCH.",
            fields={"email": [f"must be {email.strip()} (the URL's) or left out"]},
        )
    values = {**values, "email": given or email.strip()}
    for attempt in range(2):
        rep = rep_find(ref=values["email"])
        if rep is not None:
            return RepWritten(rep_update(rep_id=rep.pk, values=values, actor=actor), False)
        try:
            with transaction.atomic():
                return RepWritten(rep_create(values=values, actor=actor), True)
        except RosterError as error:
            if error.code != "rep_exists" or attempt:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def rep_deactivate(*, rep_id: int, actor: str) -> Rep:
    """Deactivate a rep (no new leads; untouched ones re-routed); again is a no-op."""
    return rep_update(rep_id=rep_id, values={"active": False}, actor=actor, action="deactivate")


@transaction.atomic
def rep_absence_add(*, rep_id: int, start: Any, end: Any, note: str, actor: str) -> RepAbsence:
    """Plan an absence of a rep through ``rep_absence_save`` (audited, overlaps refused); one
    already under way re-routes their untouched leads after the commit."""
    rep = _locked(rep_id)
    with reps_became_unavailable_after(
        emails=[rep.email], actor=actor, why="on leave (roster API)"
    ):
        try:
            return rep_absence_save(
                absence=RepAbsence(rep_id=rep.pk, starts_at=start, ends_at=end, note=note),
                actor=actor,
            )
        except ValidationError as error:
            raise RosterError(
                "invalid_body", "The absence is invalid.", fields=_absence_fields(error)
            ) from None


def _absence_fields(error: ValidationError) -> dict[str, list[str]]:
    names = {"starts_at": "from", "ends_at": "to"}
    if not hasattr(error, "error_dict"):
        return {"": [str(m) for m in error.messages]}
    return {
        ("" if key == "__all__" else names.get(key, key)): [str(m) for m in messages]
        for key, messages in error.message_dict.items()
    }


def rep_absence_remove(*, rep_id: int, absence_id: int, actor: str) -> None:
    """Cancel a planned absence that has not started (``rep_absence_cancel``)."""
    if rep_absence_cancel(rep_id=rep_id, absence_id=absence_id, actor=actor):
        return
    if RepAbsence.objects.filter(pk=absence_id, rep_id=rep_id).exists():
        raise RosterError(
            "absence_started",
            "This absence has started: end it in the admin, which re-routes or keeps the "
            "rep's leads as the team says.",
            status=409,
        )
    raise RosterError("not_found", "The rep has no such absence.", status=404)


def rep_absences_planned(*, rep_id: int) -> list[RepAbsence]:
    """A rep's absences not over yet, in order."""
    return list(
        RepAbsence.objects.filter(rep_id=rep_id, ends_at__gt=timezone.now()).order_by(
            "starts_at", "id"
        )
    )
