"""The embedded broker (``filesystem://``) taking a worker's queues in order, as Redis does.

kombu's filesystem transport takes a worker's queues in turn (a fair cycle): a worker freed by a
bulk chunk takes the next queue in the cycle, often ``routing.bulk``, even with form leads
waiting in ``routing.realtime``. Realtime messages were then served about one per turn of the
cycle, and a few form posts a second queued up behind the backlog on a busy machine (4 s for the
tenth of ten leads, and once in CI a form lead routed after almost all of a 500-lead backlog).
On Redis the worker takes the first of its queues that holds a message
(``queue_order_strategy=priority``); this transport does the same on the filesystem: every poll
starts again at the worker's first queue (its ``--queues`` order, else CELERY_TASK_QUEUES').

Selected by ``CELERY_BROKER_TRANSPORT`` when the broker URL is ``filesystem://`` (settings).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from queue import Empty  # what kombu's channels raise when a queue has no message
from typing import Any

from kombu.transport import filesystem
from kombu.utils.scheduling import FairCycle


class FirstWaitingCycle(FairCycle):
    """A cycle that always starts at its first resource: the first queue with a message wins."""

    def get(self, callback: Callable[..., Any] | None, **kwargs: Any) -> Any:
        self.pos = 0
        return super().get(callback, **kwargs)


class Channel(filesystem.Channel):
    """kombu's filesystem channel, its queues taken in order (``FirstWaitingCycle``)."""

    def _reset_cycle(self) -> None:
        self._cycle = FirstWaitingCycle(self._get_and_deliver, self._active_queues, Empty)


class Transport(filesystem.Transport):
    """kombu's filesystem transport with ``Channel``."""

    Channel = Channel


def queue_has_message(folder: str | os.PathLike[str], queue: str) -> bool:
    """Whether the filesystem broker's ``folder`` holds a message for ``queue``.

    kombu names a message ``<ms>_<uuid>.<queue>.msg`` and matches it so when consuming."""
    wanted = f"{queue}.msg"
    try:
        with os.scandir(folder) as entries:
            return any(entry.name.partition(".")[2] == wanted for entry in entries)
    except FileNotFoundError:
        return False
