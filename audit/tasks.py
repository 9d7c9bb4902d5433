"""Periodic audit tasks (beat, ``maintenance`` queue): each calls one service."""

from __future__ import annotations

from celery import shared_task

from audit.heads import audit_heads_export_scheduled


@shared_task(name="maintenance.audit_export_heads")
def audit_export_heads() -> None:
    """Write the signed chain heads into AUDIT_HEADS_DIR (nightly); alert when that fails."""
    audit_heads_export_scheduled()
