"""Celery tasks of the CRM stages: thin wrappers that take ids and call one service."""

from __future__ import annotations

import logging

from celery import shared_task

from routing.crm.base import CrmError
from routing.crm.health import crm_health_check
from routing.crm.lookup import crm_sweep_due, lead_crm_lookup
from routing.crm.models import CrmConnection
from routing.crm.roster import crm_roster_sync
from routing.crm.touches import crm_touches_run

logger = logging.getLogger(__name__)


@shared_task(name="crm.lookup_lead")
def lookup_lead(lead_id: str) -> str | None:
    """One try at the CRM lookups of a parked lead (a duplicate message is a no-op)."""
    return lead_crm_lookup(lead_id=lead_id)


@shared_task(name="crm.sweep_due")
def sweep_due() -> int:
    """Re-send due CRM lookups (beat runs this every CRM_SWEEP_INTERVAL_SECONDS)."""
    return crm_sweep_due()


@shared_task(name="maintenance.crm_health")
def crm_health() -> dict[str, str]:
    """Open or resolve each CRM connection's alert (probing it when it is failing or idle)."""
    return crm_health_check()


@shared_task(name="maintenance.crm_roster")
def crm_roster() -> dict[str, str]:
    """Read every active connection's owners and map them to reps."""
    done: dict[str, str] = {}
    for connection in CrmConnection.objects.filter(active=True).order_by("id"):
        try:
            done[connection.name] = crm_roster_sync(connection).summary()
        except CrmError as exc:
            done[connection.name] = f"failed: {exc}"
            logger.warning("CRM roster sync of %s failed: %s", connection.name, exc)
    return done


@shared_task(name="maintenance.crm_touches")
def crm_touches() -> dict[str, object]:
    """Read first touches and owner changes of assigned, untouched leads from each CRM."""
    return crm_touches_run()
