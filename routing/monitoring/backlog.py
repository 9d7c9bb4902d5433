"""The backlog watch: is the pipeline draining? Measured from the database and the broker.

``backlog_measure`` reads what can be read without side effects: leads waiting in ``received``
(and the oldest), leads left in ``processing`` past their lease, unassigned leads, the broker's
queue lengths where the broker can tell (Redis: ``LLEN``; the filesystem broker: files per
queue; others: unknown), queues whose heartbeat no worker executed lately, and enrichment
failures. ``backlog_check`` turns that into alerts, opening and resolving them.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import QuerySet
from django.utils import timezone

from audit.models import Event, EventType
from config.celery import app as celery_app
from leads import lanes
from leads.models import Lead, LeadStatus
from routing.models import QueueHeartbeat
from routing.monitoring.alerts import alert_raise, alert_resolve, open_alert_subjects
from routing.monitoring.models import Alert, AlertKind, AlertStatus

logger = logging.getLogger(__name__)

__all__ = ["BacklogReport", "backlog_check", "backlog_measure", "broker_queue_lengths"]

PIPELINE = "pipeline"  # the subject of the one backlog alert
BROKER = "broker"
ENRICHMENT = "http"
UNASSIGNED = "leads"


@dataclass
class BacklogReport:
    """One look at the pipeline (ages in seconds; a queue length None means unknown)."""

    now: datetime
    received: int = 0
    oldest_received_seconds: float = 0.0
    stuck_processing: int = 0
    unassigned: int = 0
    oldest_unassigned_seconds: float = 0.0
    queue_lengths: dict[str, int | None] = field(default_factory=dict)
    broker_error: str | None = None
    stale_queues: dict[str, float] = field(default_factory=dict)
    enrichment_failures: int = 0
    enrichment_breaker_open: bool = False
    enrichment_refused: str = ""  # the provider's latest answer, when it refused our credentials
    problems: list[str] = field(default_factory=list)
    # Per lane (leads.lanes): leads waiting in received, the oldest one's wait, and the messages
    # in the lane's routing queue (None: unknown).
    lanes: dict[str, LaneBacklog] = field(default_factory=dict)

    def as_data(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "oldest_received_seconds": round(self.oldest_received_seconds, 1),
            "stuck_processing": self.stuck_processing,
            "unassigned": self.unassigned,
            "oldest_unassigned_seconds": round(self.oldest_unassigned_seconds, 1),
            "queue_lengths": self.queue_lengths,
            "broker_error": self.broker_error,
            "stale_queues": {k: round(v, 1) for k, v in self.stale_queues.items()},
            "enrichment_failures": self.enrichment_failures,
            "enrichment_breaker_open": self.enrichment_breaker_open,
            "enrichment_refused": self.enrichment_refused,
            "lanes": {name: lane.as_data() for name, lane in self.lanes.items()},
        }


@dataclass
class LaneBacklog:
    """One lane's share of the backlog."""

    received: int = 0
    oldest_received_seconds: float = 0.0
    queue_length: int | None = None

    def as_data(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "oldest_received_seconds": round(self.oldest_received_seconds, 1),
            "queue_length": self.queue_length,
        }


def _queue_names() -> list[str]:
    return [queue.name for queue in celery_app.conf.task_queues or ()]


def _filesystem_lengths(names: list[str]) -> dict[str, int | None]:
    folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
    counts: dict[str, int | None] = dict.fromkeys(names, 0)
    # A message is "<ms>_<uuid>.<queue>.msg" (kombu) or "p<priority>_<ns>_<uuid>.<queue>.msg"
    # (config.broker_filesystem.message_filename).
    with os.scandir(folder) as entries:
        for entry in entries:
            queue = entry.name.partition(".")[2].removesuffix(".msg")
            if queue in counts:
                counts[queue] = (counts[queue] or 0) + 1
    return counts


def broker_queue_lengths() -> tuple[dict[str, int | None], str | None]:
    """Messages waiting per declared queue, and the error when the broker did not answer."""
    names = _queue_names()
    if settings.BROKER_IS_FILESYSTEM:
        try:
            return _filesystem_lengths(names), None
        except OSError as exc:
            return dict.fromkeys(names), f"{type(exc).__name__}: {exc}"
    timeout = settings.READYZ_BROKER_TIMEOUT_SECONDS
    try:
        with celery_app.connection_for_read() as conn:
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0, timeout=timeout
            )
            channel: Any = conn.default_channel
            client = getattr(channel, "client", None)
            if client is None or not hasattr(client, "llen"):
                return dict.fromkeys(names), None  # a broker that cannot tell
            client.ping()
            lengths: dict[str, int | None] = {}
            steps = getattr(channel, "priority_steps", [0])
            for name in names:
                # kombu keeps one list per priority step: "<queue>", "<queue>\x06\x163", ...
                keys = {channel._q_for_pri(name, step) for step in steps}
                lengths[name] = sum(int(client.llen(key)) for key in keys)
            return lengths, None
    except Exception as exc:  # the broker is down or hung: that is the finding, not a crash
        return dict.fromkeys(names), f"{type(exc).__name__}: {exc}"[:300]


def _enrichment_breaker_open() -> bool:
    """Whether the HTTP provider's breaker is open or half-open (its open mark is set)."""
    if not settings.ENRICHMENT_HTTP_URL:
        return False
    from routing.enrichment.breaker import KEY_PREFIX
    from routing.enrichment.store import redis_client

    key = f"{KEY_PREFIX}:open_until"
    try:
        client = redis_client()
        value = client.get(key) if client is not None else cache.get(key)
    except Exception:  # the store is down: enrichment reports that itself
        logger.warning("could not read the enrichment breaker", exc_info=True)
        return False
    return value is not None


_AUTH_REFUSALS = ("HTTP 401", "HTTP 403")


def _enrichment_refused(since: datetime) -> str:
    """The reason of the HTTP provider's latest outcome when it refused our credentials.

    An expired or revoked key fails every lead at once (401/403: no retry, the breaker stays
    closed), so waiting for many failures would be waiting for many leads; the latest outcome
    says it at once, and the next success clears it.
    """
    latest = (
        Event.objects.filter(
            type__in=(EventType.ENRICHED, EventType.ENRICHMENT_FAILED),
            at__gte=since,
            data__provider="http",
        )
        .order_by("-at", "-id")
        .values_list("type", "data")
        .first()
    )
    if latest is None or latest[0] != EventType.ENRICHMENT_FAILED:
        return ""
    reason = str((latest[1] or {}).get("reason", ""))
    return reason if any(code in reason for code in _AUTH_REFUSALS) else ""


def _enrichment_recovered(now: datetime) -> bool:
    """Positive evidence that the open enrichment alert's cause is gone (True when none is open).

    Quiet is not evidence: with an expired key and no lead enriched lately, or with the breaker
    open so that no call is made, no failure is recorded either. So the alert resolves only
    after the provider answered: an ``enriched`` event from it (a success, or "no match", which
    a half-open probe that succeeds also records) since the alert last saw the problem, or
    when the HTTP provider is no longer configured.
    """
    from routing.enrichment.services import enrichment_http_enabled

    last_bad = (
        Alert.objects.filter(kind=AlertKind.ENRICHMENT, subject=ENRICHMENT, status=AlertStatus.OPEN)
        .values_list("last_seen_at", flat=True)
        .first()
    )
    if last_bad is None or not enrichment_http_enabled():
        return True
    return Event.objects.filter(
        type=EventType.ENRICHED, at__gte=last_bad, at__lte=now, data__provider="http"
    ).exists()


def _oldest(leads: QuerySet[Lead], column: str) -> datetime | None:
    return leads.order_by(column).values_list(column, flat=True).first()


def _age(now: datetime, since: datetime | None) -> float:
    return max(0.0, (now - since).total_seconds()) if since is not None else 0.0


def backlog_measure(*, now: datetime | None = None) -> BacklogReport:
    """Measure the backlog (a few aggregate queries and one broker round trip); writes nothing."""
    now = now or timezone.now()
    report = BacklogReport(now=now)
    # One statement per figure, each answered from an index over the few rows concerned (one
    # aggregate with FILTERs over the leads table read every lead: seconds at millions).
    received = Lead.objects.filter(status=LeadStatus.RECEIVED)  # lead_queued_idx
    unassigned = Lead.objects.filter(status=LeadStatus.UNASSIGNED)  # lead_status_idx
    report.received = received.count()
    # How long it has waited since it entered the queue (intake or a re-route), not since it
    # was first received: an unassigned lead retried now is not hours late.
    report.oldest_received_seconds = _age(now, _oldest(received, "queued_at"))
    report.stuck_processing = Lead.objects.filter(  # lead_leased_idx
        status=LeadStatus.PROCESSING, claimed_until__lt=now
    ).count()
    report.unassigned = unassigned.count()
    report.oldest_unassigned_seconds = _age(now, _oldest(unassigned, "received_at"))
    report.queue_lengths, report.broker_error = broker_queue_lengths()
    for lane in lanes.LANES:
        waiting = received.filter(lane=lane)  # lead_lane_queued_idx
        report.lanes[lane] = LaneBacklog(
            received=waiting.count(),
            oldest_received_seconds=_age(now, _oldest(waiting, "queued_at")),
            queue_length=report.queue_lengths.get(lanes.routing_queue(lane)),
        )
    stale_before = now - timedelta(seconds=settings.HEARTBEAT_STALE_SECONDS)
    report.stale_queues = {
        queue: _age(now, seen)
        for queue, seen in QueueHeartbeat.objects.filter(last_seen_at__lt=stale_before)
        .values_list("queue", "last_seen_at")
        .order_by("queue")
    }
    window = timedelta(seconds=settings.ENRICHMENT_ALERT_WINDOW_SECONDS)
    report.enrichment_failures = Event.objects.filter(
        type=EventType.ENRICHMENT_FAILED, at__gte=now - window
    ).count()
    report.enrichment_breaker_open = _enrichment_breaker_open()
    report.enrichment_refused = _enrichment_refused(now - window)
    return report


def _backlog_problems(report: BacklogReport) -> list[str]:
    depth_limit = settings.BACKLOG_ALERT_DEPTH
    age_limit = settings.BACKLOG_ALERT_AGE_SECONDS
    problems = []
    # A batch upload (the bulk lane) is a backlog by design, worked off in minutes: it has limits
    # of its own, and the general ones watch the other lanes.
    bulk = report.lanes.get(lanes.BULK) or LaneBacklog()
    others = [backlog for lane, backlog in report.lanes.items() if lane != lanes.BULK]
    received = report.received - bulk.received
    waiting = received + report.stuck_processing
    if waiting > depth_limit:
        problems.append(
            f"{waiting} leads waiting ({received} received, "
            f"{report.stuck_processing} left by a dead worker), more than {depth_limit}"
        )
    oldest = max((backlog.oldest_received_seconds for backlog in others), default=0.0)
    if received and oldest > age_limit:
        problems.append(f"the oldest lead has waited {oldest:.0f} s, more than {age_limit} s")
    bulk_depth = settings.BACKLOG_ALERT_BULK_DEPTH
    bulk_age = settings.BACKLOG_ALERT_BULK_AGE_SECONDS
    if bulk.received > bulk_depth:
        problems.append(f"{bulk.received} bulk leads waiting, more than {bulk_depth}")
    if bulk.received and bulk.oldest_received_seconds > bulk_age:
        problems.append(
            f"the oldest bulk lead has waited {bulk.oldest_received_seconds:.0f} s "
            f"({bulk.received} bulk waiting), more than {bulk_age} s"
        )
    # A realtime lead is a prospect still on the page: it has its own, shorter limit.
    realtime = report.lanes.get(lanes.REALTIME)
    realtime_limit = settings.BACKLOG_ALERT_REALTIME_AGE_SECONDS
    if realtime and realtime.received and realtime.oldest_received_seconds > realtime_limit:
        problems.append(
            f"the oldest realtime lead has waited {realtime.oldest_received_seconds:.0f} s "
            f"({realtime.received} realtime waiting), more than {realtime_limit} s"
        )
    bulk_queue = lanes.routing_queue(lanes.BULK)
    for queue, length in report.queue_lengths.items():
        limit = bulk_depth if queue == bulk_queue else depth_limit
        if length is not None and length > limit:
            problems.append(f"{length} messages in the {queue} queue, more than {limit}")
    return problems


def _expect_heartbeats(now: datetime) -> None:
    """A declared queue that never had a heartbeat gets a row dated now, with no worker: if no
    worker ever drains it, it goes stale like any other (a fresh deployment with no worker, a
    worker started with -Q that leaves a queue out)."""
    known = set(QueueHeartbeat.objects.values_list("queue", flat=True))
    missing = [name for name in _queue_names() if name not in known]
    if missing:
        QueueHeartbeat.objects.bulk_create(
            [QueueHeartbeat(queue=name, last_seen_at=now, worker="") for name in missing],
            ignore_conflicts=True,
        )


def backlog_check(*, now: datetime | None = None) -> BacklogReport:
    """Measure, then open or resolve the backlog, worker, broker, enrichment, unassigned alerts
    (and the Meta fetch's waiting alert).

    One ``backlog`` alert for the whole pipeline (whatever the cause: depth, age, a long queue),
    one ``worker`` alert per queue no worker drains, one ``broker`` alert when the broker does
    not answer. Each resolves itself on the first check that finds it clear.
    """
    given_now = now  # the counters stamp their own observation time (see counters_refresh)
    _expect_heartbeats(now or timezone.now())
    report = backlog_measure(now=now)
    now = report.now
    data = report.as_data()

    report.problems = _backlog_problems(report)
    if report.problems:
        alert_raise(
            kind=AlertKind.BACKLOG,
            subject=PIPELINE,
            message="Backlog: " + "; ".join(report.problems) + ".",
            data=data,
            now=now,
        )
    else:
        alert_resolve(
            kind=AlertKind.BACKLOG,
            subject=PIPELINE,
            now=now,
            clear_for=settings.ALERT_RESOLVE_AFTER_SECONDS,
        )

    for queue, age in report.stale_queues.items():
        alert_raise(
            kind=AlertKind.WORKER,
            subject=queue,
            message=f'No worker has drained the "{queue}" queue for {age:.0f} s '
            f"(its heartbeat is stale): start or fix the workers consuming it.",
            data={"queue": queue, "seconds_since_heartbeat": round(age, 1)},
            now=now,
        )
    for queue in open_alert_subjects(AlertKind.WORKER) - set(report.stale_queues):
        alert_resolve(
            kind=AlertKind.WORKER,
            subject=queue,
            now=now,
            clear_for=settings.ALERT_RESOLVE_AFTER_SECONDS,
        )

    if report.broker_error:
        alert_raise(
            kind=AlertKind.BROKER,
            subject=BROKER,
            message=f"The Celery broker does not answer: {report.broker_error}",
            data={"error": report.broker_error},
            now=now,
        )
    else:
        alert_resolve(
            kind=AlertKind.BROKER,
            subject=BROKER,
            now=now,
            clear_for=settings.ALERT_RESOLVE_AFTER_SECONDS,
        )

    failures_limit = settings.ENRICHMENT_ALERT_FAILURES
    if (
        report.enrichment_refused
        or report.enrichment_breaker_open
        or report.enrichment_failures >= failures_limit
    ):
        if report.enrichment_refused:
            why = f"the provider refuses our credentials: {report.enrichment_refused}"
        elif report.enrichment_breaker_open:
            why = "the provider's circuit breaker is open"
        else:
            why = (
                f"{report.enrichment_failures} enrichment failures in the last "
                f"{settings.ENRICHMENT_ALERT_WINDOW_SECONDS // 60} minutes"
            )
        alert_raise(
            kind=AlertKind.ENRICHMENT,
            subject=ENRICHMENT,
            message=f"Enrichment is failing ({why}); leads are routed without it. "
            "Check the provider's credentials and status.",
            data={
                "failures": report.enrichment_failures,
                "breaker_open": report.enrichment_breaker_open,
                "refused": report.enrichment_refused,
            },
            now=now,
        )
    elif _enrichment_recovered(now):
        alert_resolve(
            kind=AlertKind.ENRICHMENT,
            subject=ENRICHMENT,
            now=now,
            clear_for=settings.ALERT_RESOLVE_AFTER_SECONDS,
        )

    count_limit = settings.UNASSIGNED_ALERT_COUNT
    age_limit = settings.UNASSIGNED_ALERT_AGE_SECONDS
    if report.unassigned > count_limit or (
        report.unassigned and report.oldest_unassigned_seconds > age_limit
    ):
        alert_raise(
            kind=AlertKind.UNASSIGNED,
            subject=UNASSIGNED,
            message=f"{report.unassigned} unassigned leads, the oldest received "
            f"{report.oldest_unassigned_seconds / 60:.0f} min ago: no rule or no eligible rep "
            "takes them.",
            data={
                "unassigned": report.unassigned,
                "oldest_seconds": round(report.oldest_unassigned_seconds, 1),
            },
            now=now,
        )
    else:
        alert_resolve(
            kind=AlertKind.UNASSIGNED,
            subject=UNASSIGNED,
            now=now,
            clear_for=settings.ALERT_RESOLVE_AFTER_SECONDS,
        )

    rules_check(now=now)
    _meta_fetch_check(now)
    _remember(report)
    _refresh_counters(given_now)
    return report


def _meta_fetch_check(now: datetime) -> None:
    """Leads waiting long for their Meta fetch (routing.fetch.meta); never fails the check."""
    from routing.fetch.meta import meta_fetch_waiting_check  # the fetch stage builds on leads

    try:
        meta_fetch_waiting_check(now=now)
    except Exception:
        logger.warning("could not check the leads waiting for a Meta fetch", exc_info=True)


def _refresh_counters(now: datetime | None) -> None:
    """Move the /metrics counters' high-water marks forward; best effort, never raises."""
    from routing.monitoring.counters import counters_refresh

    try:
        counters_refresh(now=now, wait=False)
    except Exception:
        logger.warning("could not refresh the metrics counters", exc_info=True)


def rules_check(*, now: datetime | None = None) -> tuple[str, ...]:
    """A `rules` alert while published rules are skipped because they no longer compile.

    The worker routes with the rules that still compile and logs the others on every compile;
    a team renamed or a value list deleted behind the admin's back is otherwise silent.
    """
    from routing.decisions import RulesetNotFound, live_config
    from routing.engine import RuleErrors

    try:
        broken = live_config().broken_rules
    except RulesetNotFound:
        broken = ()
    except RuleErrors as errors:
        broken = tuple(str(error) for error in errors.errors)
    if broken:
        alert_raise(
            kind=AlertKind.RULES,
            subject="published",
            message=f"{len(broken)} published rule(s) no longer compile and are skipped: "
            + "; ".join(broken)[:1500]
            + ". Fix them in a new draft and publish it.",
            data={"broken": list(broken)},
            now=now,
        )
    else:
        alert_resolve(
            kind=AlertKind.RULES,
            subject="published",
            now=now,
            clear_for=settings.ALERT_RESOLVE_AFTER_SECONDS,
        )
    return broken


_LAST_REPORT_KEY = "leadrouter:monitoring:backlog"


def _remember(report: BacklogReport) -> None:
    """Keep the last report in the cache for /metrics (broker queue lengths); best effort."""
    try:
        cache.set(_LAST_REPORT_KEY, {"at": time.time(), **report.as_data()}, timeout=600)
    except Exception:
        logger.debug("could not cache the backlog report", exc_info=True)


def last_backlog_report() -> dict[str, Any] | None:
    """The last report ``backlog_check`` cached, if any (any process, with a shared cache)."""
    try:
        value = cache.get(_LAST_REPORT_KEY)
    except Exception:
        return None
    return value if isinstance(value, dict) else None
