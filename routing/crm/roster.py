"""The roster: the CRM's users/owners mirrored as ``CrmOwner`` rows and mapped to reps by e-mail.

``crm_roster_sync(connection)`` reads every owner (``users()``), upserts a row per owner id,
links it to the rep with the same e-mail (ignoring case), creates a rep, *inactive*, for an
active CRM user who is no rep yet (RevOps places them in teams and activates them), and reports
reps whose CRM user is deactivated (flagged, never deactivated here: that is RevOps' call, and
``rep_reroute_open_leads`` follows it). Beat runs it every ``CRM_ROSTER_SYNC_SECONDS``; the admin
has a button. ``owner_reps`` and ``rep_owner_id`` translate between owner ids and reps.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models.functions import Lower
from django.utils import timezone

from routing.crm.base import CrmUser
from routing.crm.models import CrmConnection, CrmOwner

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OwnerRep:
    """The rep a CRM owner id maps to (``rep_id`` None: maps to nobody)."""

    owner_id: str
    rep_id: int | None
    rep_name: str = ""
    rep_email: str = ""
    owner_email: str = ""
    active_in_crm: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "owner_id": self.owner_id,
            "rep_id": self.rep_id,
            "rep_name": self.rep_name,
            "rep_email": self.rep_email,
            "owner_email": self.owner_email,
            "active_in_crm": self.active_in_crm,
        }


def owner_reps(kind: str, owner_ids: Iterable[str]) -> dict[str, OwnerRep]:
    """Each owner id's rep (one query); ids the roster does not know map to nobody."""
    wanted = {str(owner_id) for owner_id in owner_ids if owner_id}
    if not wanted:
        return {}
    found: dict[str, OwnerRep] = {
        owner_id: OwnerRep(owner_id=owner_id, rep_id=None) for owner_id in wanted
    }
    rows = CrmOwner.objects.filter(kind=kind, owner_id__in=wanted).select_related("rep")
    for row in rows:
        rep = row.rep
        found[row.owner_id] = OwnerRep(
            owner_id=row.owner_id,
            rep_id=rep.pk if rep is not None else None,
            rep_name=rep.name if rep is not None else "",
            rep_email=rep.email if rep is not None else "",
            owner_email=row.email,
            active_in_crm=row.active_in_crm,
        )
    return found


def rep_owner_id(kind: str, rep_id: int) -> str:
    """The CRM owner id of a rep ("" when the roster has none for it)."""
    value = (
        CrmOwner.objects.filter(kind=kind, rep_id=rep_id).values_list("owner_id", flat=True).first()
    )
    return value or ""


def rep_crm_user_deactivated(kind: str, rep_id: int) -> bool:
    """Is the rep's CRM user deactivated (the roster's last sync saw it inactive)?"""
    return CrmOwner.objects.filter(kind=kind, rep_id=rep_id, active_in_crm=False).exists()


@dataclass
class RosterReport:
    """What a roster sync did."""

    owners: int = 0
    linked: list[str] = field(default_factory=list)  # rep e-mails newly linked to an owner
    created: list[str] = field(default_factory=list)  # reps created inactive
    deactivated_in_crm: list[str] = field(default_factory=list)  # active reps the CRM disabled

    def summary(self) -> str:
        parts = [f"{self.owners} owner(s) read"]
        if self.linked:
            parts.append(f"{len(self.linked)} linked to reps")
        if self.created:
            parts.append(f"{len(self.created)} new rep(s) created inactive")
        if self.deactivated_in_crm:
            parts.append(
                f"{len(self.deactivated_in_crm)} active rep(s) deactivated in the CRM: "
                + ", ".join(self.deactivated_in_crm[:10])
            )
        return "; ".join(parts)


def _clean_users(users: Iterable[CrmUser]) -> dict[str, CrmUser]:
    by_id: dict[str, CrmUser] = {}
    for user in users:
        owner_id = str(user.id or "").strip()[:64]
        if owner_id:
            by_id[owner_id] = user
    return by_id


def roster_apply(
    connection: CrmConnection, users: Iterable[CrmUser], *, create_reps: bool = True
) -> RosterReport:
    """Mirror ``users`` (one sync's answer) into CrmOwner rows and reps; one transaction."""
    from routing.models import Rep

    now = timezone.now()
    report = RosterReport()
    by_id = _clean_users(users)
    report.owners = len(by_id)
    with transaction.atomic():
        existing = {
            row.owner_id: row
            for row in CrmOwner.objects.select_for_update().filter(kind=connection.kind)
        }
        emails = {(u.email or "").strip().lower() for u in by_id.values() if u.email}
        reps: dict[str, Rep] = {
            rep.email.strip().lower(): rep
            for rep in Rep.objects.annotate(email_key=Lower("email")).filter(email_key__in=emails)
        }
        taken = {
            row.rep_id for row in existing.values() if row.rep_id is not None
        }  # one owner per rep and kind
        for owner_id, user in sorted(by_id.items()):
            email = (user.email or "").strip()
            row = existing.get(owner_id) or CrmOwner(kind=connection.kind, owner_id=owner_id)
            row.email = email[:320]
            row.name = (user.name or "")[:200]
            row.active_in_crm = bool(user.active)
            row.synced_at = now
            rep: Rep | None = reps.get(email.lower()) if email else None
            if rep is None and create_reps and user.active and email and "@" in email:
                rep = Rep.objects.create(email=email, name=(user.name or email)[:200], active=False)
                reps[email.lower()] = rep
                report.created.append(rep.email)
            if row.rep_id is None and rep is not None and rep.pk not in taken:
                row.rep = rep
                taken.add(rep.pk)
                report.linked.append(rep.email)
            row.save()
            linked = row.rep if row.rep_id is not None else None
            if linked is not None and linked.active and not row.active_in_crm:
                report.deactivated_in_crm.append(linked.email)
        CrmConnection.objects.filter(pk=connection.pk).update(roster_synced_at=now)
    if report.deactivated_in_crm:
        logger.warning(
            "CRM %s: active reps deactivated in the CRM: %s",
            connection.name,
            ", ".join(report.deactivated_in_crm),
        )
    return report


def crm_roster_sync(connection: CrmConnection, *, create_reps: bool = True) -> RosterReport:
    """Read the CRM's owners (at the connection's pace) and mirror them; CrmError on failure."""
    from routing.crm.base import CrmError
    from routing.crm.connections import crm_client
    from routing.crm.health import crm_record_error, crm_record_ok
    from routing.crm.limits import spender

    try:
        users = crm_client(connection, spend=spender(connection)).users()
    except CrmError as exc:
        crm_record_error(connection, exc)
        raise
    crm_record_ok(connection)
    return roster_apply(connection, users, create_reps=create_reps)
