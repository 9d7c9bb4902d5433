"""Lanes: which broker queues a lead's work goes to, so a bulk backlog cannot hold up a form lead.

Pure logic, no Django. A source's ``lane`` (blank: by intake path) decides the lane a lead is
accepted in; the lead keeps it (``Lead.lane``) for every later step: the first routing message,
a chunked batch, the stale sweeper's re-sends, a re-route, a retry, and its enrichment and CRM
lookup. docs/revops.md ("Lanes") and docs/operations.md ("Queues and workers") say more.

Routing has a queue per lane: ``routing.realtime``, ``routing`` (normal: the queue's old name,
so messages already queued and workers started with ``-Q routing`` keep working) and
``routing.bulk``. Enrichment and the CRM lookup have a realtime queue beside their own
(``enrichment.realtime``, ``crm.realtime``); normal and bulk share the plain one.
"""

from __future__ import annotations

from typing import Final

REALTIME: Final = "realtime"
NORMAL: Final = "normal"
BULK: Final = "bulk"
LANES: Final = (REALTIME, NORMAL, BULK)

# Intake paths (``lane_for``'s ``path``).
SINGLE: Final = "single"  # one record posted to a source's intake URL (a form, a webhook)
BATCH: Final = "batch"  # several records in one request, or the batch URL whatever its size
OTHER: Final = "other"  # a refused payload accepted by hand, a test send from the admin

_DEFAULT_BY_PATH: Final = {SINGLE: REALTIME, BATCH: BULK, OTHER: NORMAL}

ROUTING_QUEUES: Final = {REALTIME: "routing.realtime", NORMAL: "routing", BULK: "routing.bulk"}
# Stages that call a vendor: realtime has its own queue, normal and bulk share the plain one.
STAGE_QUEUES: Final = ("enrichment", "crm")


def lane_for(source_lane: str, path: str) -> str:
    """The lane a lead accepted on ``path`` goes in: the source's, else the path's default.

    A batch request is bulk even when it carries one record; a single post is realtime; an
    unknown source lane (an old row, a typo in a fixture) falls back to the path's default.
    """
    if source_lane in LANES:
        return source_lane
    return _DEFAULT_BY_PATH.get(path, NORMAL)


def lane_clean(lane: str | None) -> str:
    """A stored lane, or normal for anything else (an old row, an empty value)."""
    return lane if lane in LANES else NORMAL


def routing_queue(lane: str | None) -> str:
    """The routing queue of a lane (normal: ``routing``)."""
    return ROUTING_QUEUES[lane_clean(lane)]


def stage_queue(stage: str, lane: str | None) -> str:
    """The queue of an enrichment or CRM task for a lead in ``lane``."""
    if stage not in STAGE_QUEUES:
        raise ValueError(f"unknown stage {stage!r}")
    return f"{stage}.realtime" if lane_clean(lane) == REALTIME else stage


def lane_of_queue(queue: str) -> str | None:
    """The lane a routing queue serves (``routing.bulk`` → bulk), None for any other queue."""
    for lane, name in ROUTING_QUEUES.items():
        if queue == name:
            return lane
    return None


def all_queues() -> list[str]:
    """Every lane queue, realtime first (the order a worker should consume them in)."""
    stage = [f"{name}.realtime" for name in STAGE_QUEUES] + list(STAGE_QUEUES)
    return [ROUTING_QUEUES[lane] for lane in LANES] + stage


# kombu's Redis transport keeps one list per priority step of a queue and takes the lower step
# first; its default steps (and this project's: no ``priority_steps`` option is set).
PRIORITY_STEPS: Final = (0, 3, 6, 9)


def routing_priority(lane: str | None, high: bool, steps: tuple[int, ...] = PRIORITY_STEPS) -> int:
    """The broker priority (a step of ``steps``) of a routing message in ``lane``.

    A worker polls step by step, every one of its queues at each step (kombu's BRPOP keys: step
    0 of each queue in its ``--queues`` order, then step 3 of each, ...). So that a lane's high
    message goes first *within its lane* and a bulk one never ahead of realtime, the steps
    follow the lanes: realtime high 0, normal 3; normal high 3, normal 6; bulk high 6, normal
    9. At a shared step the lane order of ``--queues`` decides (realtime's normal messages
    before the normal lane's high ones). Fewer steps configured: the last step for the rest.
    """
    index = LANES.index(lane_clean(lane)) + (0 if high else 1)
    return steps[min(index, len(steps) - 1)]
