"""The embedded broker (``filesystem://``) taking a worker's queues in order, as Redis does.

kombu's filesystem transport takes a worker's queues in turn (a fair cycle): a worker freed by a
bulk chunk takes the next queue in the cycle, often ``routing.bulk``, even with form leads
waiting in ``routing.realtime``. Realtime messages were then served about one per turn of the
cycle, and a few form posts a second queued up behind the backlog on a busy machine (4 s for the
tenth of ten leads, and once in CI a form lead routed after almost all of a 500-lead backlog).
On Redis the worker takes the first of its queues that holds a message
(``queue_order_strategy=priority``); this transport does the same on the filesystem: every poll
starts again at the worker's first queue (its ``--queues`` order, else CELERY_TASK_QUEUES').

Within a queue, a message's priority is honoured as on Redis (lower first: kombu's Redis
transport keeps a list per priority step and polls step 0 first): ``Channel._put`` names the
file ``p<priority>_<ns>_<uuid>.<queue>.msg`` (the priority clamped to 0-9, the monotonic clock
in nanoseconds zero-padded: kombu's own milliseconds left two messages of one millisecond in
the order of their random uuids), and kombu's ``_get`` takes the first matching name in sorted
order, so a queue's priority-0 messages are taken before its priority-3 ones, each priority
first in, first out.
Files named by kombu itself (``<ms>_<uuid>.<queue>.msg``, queued before this naming) sort before
every prefixed one: they are taken first, as any message queued ahead.

Selected by ``CELERY_BROKER_TRANSPORT`` when the broker URL is ``filesystem://`` (settings).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from queue import Empty  # what kombu's channels raise when a queue has no message
from time import monotonic_ns
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps
from kombu.utils.scheduling import FairCycle


class FirstWaitingCycle(FairCycle):
    """A cycle that always starts at its first resource: the first queue with a message wins."""

    def get(self, callback: Callable[..., Any] | None, **kwargs: Any) -> Any:
        self.pos = 0
        return super().get(callback, **kwargs)


def message_filename(queue: str, priority: int, ns: int, unique: str) -> str:
    """The file a message of ``priority`` (0-9, lower first) for ``queue`` is written to.

    Sorted names put a queue's messages in order of priority, then of time (the nanoseconds
    zero-padded to 20 digits, so a longer number never sorts before a shorter one). No dot
    before the queue's name: kombu matches ``name.partition(".")[2] == f"{queue}.msg"``."""
    return f"p{priority}_{ns:020d}_{unique}.{queue}.msg"


class Channel(filesystem.Channel):
    """kombu's filesystem channel, its queues taken in order (``FirstWaitingCycle``) and each
    queue's messages by priority (``message_filename``)."""

    def _reset_cycle(self) -> None:
        self._cycle = FirstWaitingCycle(self._get_and_deliver, self._active_queues, Empty)

    # kombu's filesystem channel calls it ``payload``, its abstract base ``message``.
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """kombu's ``_put``, the file named by the message's priority (``message_filename``)."""
        priority = self._get_message_priority(payload, reverse=False)
        name = message_filename(queue, priority, monotonic_ns(), str(uuid.uuid4()))
        path = os.path.join(self.data_folder_out, name)
        handle = None
        try:
            handle = open(path, "wb", buffering=0)  # noqa: SIM115 - locked and closed below
            filesystem.lock(handle, filesystem.LOCK_EX)  # type: ignore[attr-defined]
            handle.write(str_to_bytes(dumps(payload)))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {path!r} to directory") from exc
        finally:
            if handle is not None:
                filesystem.unlock(handle)
                handle.close()


class Transport(filesystem.Transport):
    """kombu's filesystem transport with ``Channel``."""

    Channel = Channel


def queue_has_message(folder: str | os.PathLike[str], queue: str) -> bool:
    """Whether the filesystem broker's ``folder`` holds a message for ``queue``.

    A message is ``<ms>_<uuid>.<queue>.msg`` (kombu's) or ``p<priority>_<ns>_<uuid>.<queue>.msg``
    (``message_filename``); kombu matches either by what follows the first dot."""
    wanted = f"{queue}.msg"
    try:
        with os.scandir(folder) as entries:
            return any(entry.name.partition(".")[2] == wanted for entry in entries)
    except FileNotFoundError:
        return False
