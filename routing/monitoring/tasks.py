"""Periodic monitoring tasks (beat, ``maintenance`` queue): each calls one service."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from routing.loads import rep_loads_reconcile
from routing.monitoring.backlog import backlog_check
from routing.monitoring.refusals import refusals_check
from routing.monitoring.sla import BREACH_NOTICE_TASK, breach_notice_send, sla_check
from routing.monitoring.sla_warning import sla_warn
from routing.monitoring.unassigned import unassigned_retry
from routing.monitoring.watchdog import connect_beat_watchdog


@shared_task(name="maintenance.check_backlog")
def check_backlog() -> None:
    """Measure the backlog, heartbeats, broker and enrichment; open or resolve alerts."""
    backlog_check()


@shared_task(name="maintenance.check_sla")
def check_sla() -> None:
    """Handle every breached SLA once (event, notification, reassignment where the rule says)."""
    sla_check()


@shared_task(name="maintenance.warn_sla")
def warn_sla() -> None:
    """Warn each rep once when an untouched lead's SLA is about to run out (their channels)."""
    sla_warn()


@shared_task(name=BREACH_NOTICE_TASK)
def notify_sla_breach(
    *, subject: str, text: str, recipients: list[str], payload: dict[str, Any]
) -> None:
    """Send one SLA breach notification (``delivery`` queue: kept out of check_sla's loop)."""
    breach_notice_send(subject=subject, text=text, recipients=recipients, payload=payload)


@shared_task(name="maintenance.check_refusals")
def check_refusals() -> None:
    """Open or resolve the per-source alert on refused payloads."""
    refusals_check()


@shared_task(name="maintenance.retry_unassigned")
def retry_unassigned() -> None:
    """Send a bounded batch of unassigned leads through routing again."""
    unassigned_retry()


@shared_task(name="maintenance.reconcile_rep_loads")
def reconcile_rep_loads() -> None:
    """Compare each rep's load counters with the assignments; repair and count any drift."""
    rep_loads_reconcile()


connect_beat_watchdog()
