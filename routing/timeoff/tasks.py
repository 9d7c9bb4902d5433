"""Time off's periodic job: planned absences that have started, and holidays that have begun,
re-route their rep's leads."""

from __future__ import annotations

from celery import shared_task

from routing.timeoff.services import absences_start_due, holidays_start_due


@shared_task(name="maintenance.absences_start")
def absences_start() -> None:
    """Handle the absences whose start has passed and the holidays that have begun (each once;
    safe to run twice)."""
    absences_start_due()
    holidays_start_due()
