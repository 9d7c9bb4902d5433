"""Test-only: the stale sweeper in a loop, as its own process (bounded in runs and time).

``python -m tests.reliability.sweeper --every 2 --older-than 10 --for 240`` calls
``leads.services.leads_requeue_stale`` every ``--every`` seconds, on the database and broker
of its environment (the fault tests give it their throwaway redis-server), and prints what each
run re-enqueued. Production runs the same function from beat (``maintenance.requeue_stale``).
With ``--deliveries`` each run also publishes the deliveries that are due again
(``deliveries_sweep_due``, beat's delivery sweep): an attempt cut short by a kill leaves its
delivery leased, and only the sweep sends it again once the lease is over.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--older-than", type=float, default=10.0)
    parser.add_argument("--for", dest="duration", type=float, default=240.0)
    parser.add_argument("--deliveries", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    from django.db import close_old_connections

    from leads.services import leads_requeue_stale
    from routing.delivery.services import deliveries_sweep_due

    deadline = time.monotonic() + args.duration
    print("sweeper ready", flush=True)
    while time.monotonic() < deadline:
        close_old_connections()  # as the worker does around each task (a database restart)
        try:
            count = leads_requeue_stale(older_than=timedelta(seconds=args.older_than))
            deliveries = deliveries_sweep_due() if args.deliveries else 0
        except Exception as exc:  # a database hiccup: report it and sweep again next time
            print(f"sweep failed: {type(exc).__name__}: {exc}", flush=True)
        else:
            print(
                f"swept {count}" + (f", deliveries {deliveries}" if deliveries else ""), flush=True
            )
        time.sleep(args.every)


if __name__ == "__main__":
    main()
