"""``GET /metrics``: Prometheus text read from the database at scrape time.

Counters kept in process memory would be wrong with several gunicorn and worker processes
(each counts its own); the database already holds every lead, assignment and event, so one
collector reads the totals from it whichever process is scraped. Counting whole tables on every
scrape would cost seconds at millions of leads, so the counters are stored totals up to a
high-water mark plus the rows past it (``counters``), and the gauges read the few waiting rows
through partial indexes. Results are kept for ``METRICS_CACHE_SECONDS`` per process.

Access: ``Authorization: Bearer <METRICS_TOKEN>``, or a client address inside
``METRICS_ALLOWED_NETWORKS``; otherwise 401 (or 403) as JSON.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from config.errors import error_body
from leads import lanes, privacy
from leads.models import Lead, LeadStatus, PersonKey, Source
from routing.loads import rep_load_drift_totals
from routing.models import QueueHeartbeat
from routing.monitoring.backlog import last_backlog_report
from routing.monitoring.counters import TIME_TO_ASSIGN_BUCKETS, counters_current
from routing.monitoring.models import Alert, AlertKind, AlertStatus
from routing.retention.services import retention_totals

logger = logging.getLogger(__name__)

__all__ = ["TIME_TO_ASSIGN_BUCKETS", "MetricsSnapshot", "metrics_snapshot", "metrics_view"]

_WAITING = (LeadStatus.RECEIVED, LeadStatus.PROCESSING)


@dataclass
class MetricsSnapshot:
    """Every value /metrics shows, at one moment."""

    received_by_source: dict[str, int] = field(default_factory=dict)
    processed_by_status: dict[str, int] = field(default_factory=dict)
    in_status: dict[str, int] = field(default_factory=dict)
    assign_buckets: list[tuple[float, int]] = field(default_factory=list)  # cumulative
    assign_count: int = 0
    assign_sum_seconds: float = 0.0
    backlog_leads: int = 0
    backlog_oldest_seconds: float = 0.0
    sla_breaches: int = 0
    delivery_failures: int = 0
    reassignments: int = 0
    alerts_open: dict[str, int] = field(default_factory=dict)
    heartbeat_age: dict[str, float] = field(default_factory=dict)
    queue_lengths: dict[str, int] = field(default_factory=dict)
    # Per lane (leads.lanes): leads waiting in received, and the oldest one's wait.
    lane_backlog: dict[str, int] = field(default_factory=dict)
    lane_oldest_seconds: dict[str, float] = field(default_factory=dict)
    rep_load_drift: dict[str, int] = field(default_factory=dict)
    # Retention (routing/retention/): what it pruned so far, and its last complete run.
    retention_pruned: dict[str, int] = field(default_factory=dict)
    retention_last_success: float = 0.0
    # Person keys not (yet) wrapped under the first master key: pending re-wrap, and lost.
    privacy_keys_to_rewrap: int = 0
    privacy_keys_lost: int = 0
    leads_failed_privacy_key: int = 0


def metrics_snapshot() -> MetricsSnapshot:
    """Every metric, without counting whole tables (``counters``: stored totals plus the rows
    past their marks; the backlog from the partial index on waiting leads)."""
    now = timezone.now()
    snap = MetricsSnapshot()
    current = counters_current(now=now)
    counters = current.counters
    slugs = {str(pk): slug for pk, slug in Source.objects.values_list("pk", "slug")}
    for source_id, n in counters.received_by_source.items():
        slug = slugs.get(source_id, source_id)
        snap.received_by_source[slug] = snap.received_by_source.get(slug, 0) + n
    snap.in_status = dict(current.statuses)
    # A counter must never go down: outcomes are counted from the append-only audit log (a lead
    # re-routed from unassigned counts its first outcome and its second), not from the leads'
    # current status, which moves back to `received` when a lead is retried.
    for status in LeadStatus.values:
        if status not in _WAITING:
            snap.processed_by_status[status] = counters.processed_by_status.get(status, 0)
    snap.assign_count = counters.assign_count
    snap.assign_sum_seconds = counters.assign_sum_seconds
    snap.assign_buckets = list(zip(TIME_TO_ASSIGN_BUCKETS, counters.assign_buckets, strict=True))
    snap.backlog_leads = current.statuses.get(LeadStatus.RECEIVED, 0)
    oldest = (
        Lead.objects.filter(status=LeadStatus.RECEIVED)  # lead_queued_idx
        .order_by("queued_at")
        .values_list("queued_at", flat=True)
        .first()
    )
    if oldest is not None:
        snap.backlog_oldest_seconds = max(0.0, (now - oldest).total_seconds())
    for lane in lanes.LANES:
        waiting = Lead.objects.filter(status=LeadStatus.RECEIVED, lane=lane)  # lead_lane_queued_idx
        snap.lane_backlog[lane] = waiting.count()
        since = waiting.order_by("queued_at").values_list("queued_at", flat=True).first()
        snap.lane_oldest_seconds[lane] = (
            max(0.0, (now - since).total_seconds()) if since is not None else 0.0
        )
    snap.sla_breaches = counters.sla_breaches
    snap.delivery_failures = counters.delivery_failures
    snap.reassignments = counters.reassignments
    snap.alerts_open = dict.fromkeys(AlertKind.values, 0)
    for kind, n in (
        Alert.objects.filter(status=AlertStatus.OPEN)
        .order_by()
        .values_list("kind")
        .annotate(n=Count("id"))
        .values_list("kind", "n")
    ):
        snap.alerts_open[kind] = n
    for queue, seen in QueueHeartbeat.objects.values_list("queue", "last_seen_at"):
        snap.heartbeat_age[queue] = max(0.0, (now - seen).total_seconds())
    snap.rep_load_drift = rep_load_drift_totals()
    retention = retention_totals()
    snap.retention_pruned = retention["pruned"]
    last = parse_datetime(retention["last_success_at"] or "")
    snap.retention_last_success = last.timestamp() if last is not None else 0.0
    try:
        snap.privacy_keys_to_rewrap = privacy.rewrap_pending().count()
    except privacy.PrivacyKeyError:  # a malformed PRIVACY_KEYS: said by the workers' errors
        snap.privacy_keys_to_rewrap = -1
    snap.privacy_keys_lost = PersonKey.objects.filter(
        wrapped__isnull=False, wrapped_by=privacy.LOST
    ).count()
    snap.leads_failed_privacy_key = Lead.objects.filter(
        status=LeadStatus.FAILED, last_error__startswith=f"{privacy.LEAD_ERROR_PREFIX}:"
    ).count()
    report = last_backlog_report() or {}
    for queue, length in (report.get("queue_lengths") or {}).items():
        if isinstance(length, int):
            snap.queue_lengths[queue] = length
    return snap


def _families(snap: MetricsSnapshot) -> list[Metric]:
    received = CounterMetricFamily(
        "leadrouter_leads_received", "Leads accepted by intake, by source.", labels=["source"]
    )
    for source, n in sorted(snap.received_by_source.items()):
        received.add_metric([source], n)
    processed = CounterMetricFamily(
        "leadrouter_leads_processed",
        "Leads the pipeline finished, by outcome (assigned, duplicate, excluded, ...).",
        labels=["status"],
    )
    for status, n in sorted(snap.processed_by_status.items()):
        processed.add_metric([status], n)
    in_status = GaugeMetricFamily(
        "leadrouter_leads", "Leads now in each status.", labels=["status"]
    )
    for status, n in sorted(snap.in_status.items()):
        in_status.add_metric([status], n)
    histogram = HistogramMetricFamily(
        "leadrouter_time_to_assign_seconds",
        "Seconds from a lead's receipt to its first owner.",
        buckets=[
            *((repr(float(bound)), n) for bound, n in snap.assign_buckets),
            ("+Inf", snap.assign_count),
        ],
        sum_value=snap.assign_sum_seconds,
    )
    alerts = GaugeMetricFamily("leadrouter_alerts_open", "Open alerts, by kind.", labels=["kind"])
    for kind, n in sorted(snap.alerts_open.items()):
        alerts.add_metric([kind], n)
    heartbeat = GaugeMetricFamily(
        "leadrouter_queue_heartbeat_age_seconds",
        "Seconds since a worker last executed the heartbeat of a queue.",
        labels=["queue"],
    )
    for queue, age in sorted(snap.heartbeat_age.items()):
        heartbeat.add_metric([queue], age)
    lengths = GaugeMetricFamily(
        "leadrouter_broker_queue_messages",
        "Messages waiting in a broker queue at the last backlog check.",
        labels=["queue"],
    )
    for queue, length in sorted(snap.queue_lengths.items()):
        lengths.add_metric([queue], length)
    lane_backlog = GaugeMetricFamily(
        "leadrouter_lane_backlog_leads",
        "Leads waiting in received, by lane (realtime, normal, bulk).",
        labels=["lane"],
    )
    for lane, n in snap.lane_backlog.items():
        lane_backlog.add_metric([lane], n)
    lane_oldest = GaugeMetricFamily(
        "leadrouter_lane_backlog_oldest_seconds",
        "Age of the oldest lead waiting in received, by lane (0 when none waits).",
        labels=["lane"],
    )
    for lane, age in snap.lane_oldest_seconds.items():
        lane_oldest.add_metric([lane], age)
    drift = CounterMetricFamily(
        "leadrouter_rep_load_drift",
        "Drift of the reps' load counters from their assignments, repaired by the "
        "reconciliation (open leads, today's assignments).",
        labels=["counter"],
    )
    for counter, n in sorted(snap.rep_load_drift.items()):
        drift.add_metric([counter], n)
    pruned = CounterMetricFamily(
        "leadrouter_retention_pruned",
        "What the retention job pruned: raw payloads, refused payloads, unrouted and personal "
        "leads (their personal fields), person keys retired and destroyed.",
        labels=["what"],
    )
    for what, n in sorted(snap.retention_pruned.items()):
        pruned.add_metric([what], n)
    return [
        received,
        processed,
        in_status,
        histogram,
        GaugeMetricFamily(
            "leadrouter_backlog_leads", "Leads waiting in received.", value=snap.backlog_leads
        ),
        GaugeMetricFamily(
            "leadrouter_backlog_oldest_seconds",
            "Age of the oldest lead waiting in received (0 when none waits).",
            value=snap.backlog_oldest_seconds,
        ),
        CounterMetricFamily(
            "leadrouter_sla_breaches", "SLA breaches recorded.", value=snap.sla_breaches
        ),
        CounterMetricFamily(
            "leadrouter_delivery_failures",
            "Deliveries (webhooks, e-mails) given up as failed.",
            value=snap.delivery_failures,
        ),
        CounterMetricFamily(
            "leadrouter_reassignments",
            "Reassignments, manual and automatic.",
            value=snap.reassignments,
        ),
        alerts,
        heartbeat,
        lengths,
        lane_backlog,
        lane_oldest,
        drift,
        pruned,
        GaugeMetricFamily(
            "leadrouter_privacy_keys_to_rewrap",
            "Person keys still wrapped under an older master key (after a rotation: the "
            "background re-wrap takes them; drop the old key only at 0).",
            value=snap.privacy_keys_to_rewrap,
        ),
        GaugeMetricFamily(
            "leadrouter_privacy_keys_lost",
            "Person keys none of PRIVACY_KEYS unwraps (their sealed history is unreadable).",
            value=snap.privacy_keys_lost,
        ),
        GaugeMetricFamily(
            "leadrouter_leads_failed_privacy_key",
            "Leads failed because their person key cannot be opened with PRIVACY_KEYS (a "
            "master key removed or lost); alert above 0, route them again once it is back.",
            value=snap.leads_failed_privacy_key,
        ),
        GaugeMetricFamily(
            "leadrouter_retention_last_success_timestamp_seconds",
            "When the retention job last ran through everything due (0: never).",
            value=snap.retention_last_success,
        ),
    ]


class DatabaseCollector:
    """A prometheus_client collector reading ``metrics_snapshot`` (cached a few seconds)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = 0.0
        self._families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if time.monotonic() - self._at >= settings.METRICS_CACHE_SECONDS or not self._families:
                self._families = _families(metrics_snapshot())
                self._at = time.monotonic()
            families = list(self._families)
        yield from families

    def clear(self) -> None:
        with self._lock:
            self._at = 0.0
            self._families = []


COLLECTOR = DatabaseCollector()
REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(COLLECTOR)


def _client_allowed(request: HttpRequest) -> bool:
    """Whether the client's address is in METRICS_ALLOWED_NETWORKS; never behind a proxy, where
    every request, from anywhere, arrives from the proxy's (often loopback) address."""
    if settings.BEHIND_TLS_PROXY:
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    for network in settings.METRICS_ALLOWED_NETWORKS:
        try:
            if address in ipaddress.ip_network(network, strict=False):
                return True
        except ValueError:
            logger.warning("METRICS_ALLOWED_NETWORKS: %r is not a network", network)
    return False


def _denied(request: HttpRequest) -> JsonResponse | None:
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if (
        token
        and scheme.lower() == "bearer"
        # As bytes: compare_digest refuses non-ASCII text (a 500 for any such header).
        and hmac.compare_digest(given.strip().encode("utf-8", "replace"), token.encode("utf-8"))
    ):
        return None
    if not header and _client_allowed(request):
        return None
    if header or token:
        response = JsonResponse(
            error_body("unauthorized", "A valid metrics token is required."), status=401
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    why = (
        "Behind a proxy metrics need METRICS_TOKEN (the client address is the proxy's)."
        if settings.BEHIND_TLS_PROXY
        else "Metrics are not served to this address."
    )
    return JsonResponse(error_body("forbidden", why), status=403)


@csrf_exempt
@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus text exposition of ``REGISTRY``, for an authorised scraper."""
    if request.method not in ("GET", "HEAD"):
        response = JsonResponse(error_body("method_not_allowed", "Use GET or HEAD."), status=405)
        response["Allow"] = "GET, HEAD"
        return response
    denied = _denied(request)
    if denied is not None:
        return denied
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
