"""Test-only: a lead that kills the worker process processing it (issue 5, "poison lead").

Loaded only into test worker processes, with ``celery -A config worker -I
tests.reliability.poison``; production code never imports it. When
``LEADROUTER_TEST_POISON_EMAIL`` is set, the worker's pool process exits at once (``os._exit``,
no cleanup, like a segfault in a C extension) when it saves a lead with that e-mail while
processing it: after the claim counted an attempt, before anything is routed (one by one), or
with the outcome of its batch (``routing.batch``: the whole batch's transaction dies with it).
The quarantine itself (status ``failed``) is let through.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from django.db.models.signals import pre_save

POISON_EMAIL = os.environ.get("LEADROUTER_TEST_POISON_EMAIL", "").strip().lower()
MARKER = "POISON: killing worker process"


def _die_on_poison(sender: Any, instance: Any, **kwargs: Any) -> None:
    if not POISON_EMAIL or (instance.email or "").lower() != POISON_EMAIL:
        return
    if instance.status == "failed":  # the quarantine is let through
        return
    sys.stderr.write(f"{MARKER} {os.getpid()} on lead {instance.pk}\n")
    sys.stderr.flush()
    os._exit(1)


if POISON_EMAIL:
    pre_save.connect(
        _die_on_poison, sender="leads.Lead", weak=False, dispatch_uid="leadrouter-test-poison"
    )
