"""Enrichment: built-in providers run while routing, the HTTP provider on its own queue.

What the routing pipeline calls:

- ``enrichment_builtin(lead)`` → ``list[ProviderResult]``: runs the built-ins in memory;
  ``enrichment_event_data(results)`` is the ``data`` of the ``enriched`` event.
- ``enrichment_http_wanted(lead)``: park the lead for the HTTP provider?
- ``enrichment_enqueue_after_commit(lead_id)``: after parking, send it to the enrichment queue.
- ``enrichment_trace_note(lead)``: the trace line when it is routed without HTTP enrichment.
"""

from routing.enrichment.builtin import ProviderResult, enrichment_builtin, enrichment_event_data
from routing.enrichment.services import (
    enrichment_enqueue,
    enrichment_enqueue_after_commit,
    enrichment_http_enabled,
    enrichment_http_wanted,
    enrichment_sweep_due,
    enrichment_trace_note,
    lead_enrich,
)

__all__ = [
    "ProviderResult",
    "enrichment_builtin",
    "enrichment_enqueue",
    "enrichment_enqueue_after_commit",
    "enrichment_event_data",
    "enrichment_http_enabled",
    "enrichment_http_wanted",
    "enrichment_sweep_due",
    "enrichment_trace_note",
    "lead_enrich",
]
