"""The refused-payload alert: a source whose refusals pass a threshold (a tool whose payload
shape changed, a field map gone stale) opens an alert per source, resolved by itself once the
source's open refusals in the window fall below the threshold again."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.utils import timezone

from leads.inbox import refusal_window, refusals_by_source
from routing.monitoring.alerts import alert_raise, alert_resolve, open_alert_subjects
from routing.monitoring.models import AlertKind


def refusals_check(*, now: datetime | None = None) -> dict[str, int]:
    """Open or refresh an alert per source over the threshold; resolve the others.

    Returns {source slug: open refusals in the window} for the sources over the threshold.
    """
    now = now or timezone.now()
    window = refusal_window()
    threshold = settings.REFUSED_ALERT_THRESHOLD
    counts = refusals_by_source(since=now - window)
    over = {slug: n for slug, n in counts.items() if n >= threshold}
    minutes = int(window.total_seconds() // 60)
    for slug, n in sorted(over.items()):
        alert_raise(
            kind=AlertKind.SOURCE,
            subject=slug,
            message=f"Source {slug} had {n} payload(s) refused in the last {minutes} minutes "
            f"(threshold {threshold}). Look at its refused inbox: has the tool's payload "
            "changed, or does the source need another kind or field map?",
            data={"source": slug, "refused": n, "window_minutes": minutes},
            now=now,
        )
    for subject in open_alert_subjects(AlertKind.SOURCE) - set(over):
        alert_resolve(kind=AlertKind.SOURCE, subject=subject, now=now)
    return over
