"""Periodic audit tasks (beat, ``maintenance`` queue): each calls one service."""

from __future__ import annotations

from celery import shared_task

from audit.heads import audit_heads_export_scheduled, audit_verify_scheduled


@shared_task(name="maintenance.audit_export_heads")
def audit_export_heads() -> None:
    """Write the signed chain heads into AUDIT_HEADS_DIR (nightly); alert when that fails."""
    audit_heads_export_scheduled()


# Verifying millions of events outlives the default time limit and the broker's visibility
# timeout: run it acknowledged early (a worker lost mid-way means one night without a check,
# which the next night repeats), with an hour's limit.
@shared_task(
    name="maintenance.audit_nightly", acks_late=False, time_limit=3600, soft_time_limit=3540
)
def audit_nightly() -> None:
    """Verify the log (chains, and the newest heads file), then export tonight's heads.

    A log that does not verify is not signed again: the newest heads file stays the one from
    before the damage, so the alert stays open night after night until someone looks (and,
    once the damage is understood, writes a new baseline with ``manage.py
    audit_export_heads``).
    """
    findings = audit_verify_scheduled()
    if findings:
        return
    audit_heads_export_scheduled()
