"""Celery tasks of the fetch stages: thin wrappers that take ids and call one service. On the
``enrichment`` queue (``enrichment.*``): outside providers, each at its own pace."""

from __future__ import annotations

from celery import shared_task

from routing.fetch.meta import lead_meta_fetch, meta_fetch_sweep_due


@shared_task(name="enrichment.meta_fetch_lead")
def meta_fetch_lead(lead_id: str) -> str | None:
    """One try at fetching a parked lead from the Graph API (a duplicate message is a no-op)."""
    return lead_meta_fetch(lead_id=lead_id)


@shared_task(name="enrichment.meta_fetch_sweep")
def meta_fetch_sweep() -> int:
    """Send the fetches that are due (beat runs this every META_FETCH_SWEEP_INTERVAL_SECONDS)."""
    return meta_fetch_sweep_due()
