"""Test-only: the web process dies between a lead's commit and its publish (issue 9, reliability
guide test 5, "Commit-then-crash").

Loaded only into the test's gunicorn workers, by the ``post_worker_init`` hook of
tests/reliability/gunicorn_crash.py; production code never imports it. When
``LEADROUTER_TEST_CRASH_ONE_IN`` is set to N, the kickoff's hand-over to the publisher (run by
``transaction.on_commit`` once the lead and its ``received`` event are committed) ends the whole
process with ``os._exit`` for every lead whose posted e-mail carries a number that is N/2 modulo N
(``c10@...`` with N = 20, then ``c30@...``, ...): exactly one lead in N, the same ones on every
run (a share decided by the random lead id could come out as none), and the test knows which.
The client sees its connection drop, the lead row exists, and no message was published: only the
stale sweeper can get it routed.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Sequence

ONE_IN = int(os.environ.get("LEADROUTER_TEST_CRASH_ONE_IN", "0") or 0)
MARKER = "CRASH: web process exits after commit, before publishing lead"


def doomed(email: str, one_in: int = ONE_IN) -> bool:
    """Whether the hook crashes the process after committing the lead posted with ``email``."""
    found = re.search(r"(\d+)@", email or "")
    return one_in > 0 and found is not None and int(found.group(1)) % one_in == one_in // 2


def install() -> None:
    if ONE_IN <= 0:
        return
    from leads import services

    publisher = services.publisher
    submit = publisher.submit

    def crashing_submit(
        lead_ids: Sequence[uuid.UUID], lane: str | None = None, high: bool | None = None
    ) -> bool:
        from leads.models import Lead

        posted = dict(
            Lead.objects.filter(pk__in=list(lead_ids)).values_list("pk", "raw_payload__email")
        )
        for lead_id in lead_ids:
            if doomed(str(posted.get(lead_id) or "")):
                sys.stderr.write(f"{MARKER} {lead_id} (pid {os.getpid()})\n")
                sys.stderr.flush()
                os._exit(1)
        return submit(lead_ids, lane, high)

    publisher.submit = crashing_submit  # type: ignore[method-assign]
