"""Test-only: the web process dies between a lead's commit and its publish (issue 9, reliability
guide test 5, "Commit-then-crash").

Loaded only into the test's gunicorn workers, by the ``post_worker_init`` hook of
tests/reliability/gunicorn_crash.py; production code never imports it. When
``LEADROUTER_TEST_CRASH_ONE_IN`` is set to N, the kickoff's hand-over to the publisher (run by
``transaction.on_commit`` once the lead and its ``received`` event are committed) ends the whole
process with ``os._exit`` for every lead whose id is a multiple of N (as an integer): about one in
N, and the test can tell which from the database. The client sees its connection drop, the lead
row exists, and no message was published: only the stale sweeper can get it routed.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Sequence

ONE_IN = int(os.environ.get("LEADROUTER_TEST_CRASH_ONE_IN", "0") or 0)
MARKER = "CRASH: web process exits after commit, before publishing lead"


def doomed(lead_id: uuid.UUID | str, one_in: int = ONE_IN) -> bool:
    """Whether the hook crashes the process after committing this lead."""
    return one_in > 0 and uuid.UUID(str(lead_id)).int % one_in == 0


def install() -> None:
    if ONE_IN <= 0:
        return
    from leads import services

    publisher = services.publisher
    submit = publisher.submit

    def crashing_submit(lead_ids: Sequence[uuid.UUID]) -> bool:
        for lead_id in lead_ids:
            if doomed(lead_id):
                sys.stderr.write(f"{MARKER} {lead_id} (pid {os.getpid()})\n")
                sys.stderr.flush()
                os._exit(1)
        return submit(lead_ids)

    publisher.submit = crashing_submit  # type: ignore[method-assign]
