"""Celery tasks of enrichment (queue ``enrichment``): thin wrappers that take ids."""

from __future__ import annotations

from celery import shared_task

from routing.enrichment.services import enrichment_sweep_due, lead_enrich


@shared_task(name="enrichment.enrich_lead")
def enrich_lead(lead_id: str) -> str | None:
    """One try at the HTTP provider for a parked lead (a duplicate message is a no-op)."""
    return lead_enrich(lead_id=lead_id)


@shared_task(name="enrichment.sweep_due")
def sweep_due() -> int:
    """Re-send due enrichment tries (beat runs this every ENRICHMENT_SWEEP_INTERVAL_SECONDS)."""
    return enrichment_sweep_due()
