"""Test-only: the fault tests' routing set-up (7 reps in one round robin, a source whose token is
``token-<slug>``) in the database of the environment's DATABASE_URL, for a throwaway cluster
that the test process itself is not connected to.

``python -m tests.reliability.seed --source pg-outage``
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    from routing.rules_io import rules_import
    from tests.leads.factories import SourceFactory
    from tests.reliability.harness import REPS, rules

    rules_import(rules(REPS), publish=True)
    SourceFactory(slug=args.source)
    print("seeded", flush=True)


if __name__ == "__main__":
    main()
