"""Time off's periodic job: planned absences that have started re-route their rep's leads."""

from __future__ import annotations

from celery import shared_task

from routing.timeoff.services import absences_start_due


@shared_task(name="maintenance.absences_start")
def absences_start() -> None:
    """Handle the absences whose start has passed (each once; safe to run twice)."""
    absences_start_due()
