"""How long a publish of the whole configuration keeps leads waiting (PostgreSQL).

    .venv/bin/python -m bench.config_publish [--territories 20000]

Needs PostgreSQL (BENCH_DATABASE_URL, default a fresh `leadrouter_config_bench` on localhost). It
recreates that database, migrates it, imports a configuration of 10 reps in one team and
``--territories`` territories (one country and five postal prefixes each, owned by the team),
then measures, ``--rounds`` times each, in alternating order:
  - *draft publish*: a draft whose territories all changed (new postal prefixes) published;
  - *live change*: a change of one team's SLA recorded as a version (``config_live_change``, as
    an admin save is);
  - the baseline: the same territory rows updated in one transaction with one bulk UPDATE (the
    least rewriting them can cost).
For each, the time a lead's claim would wait: a probe process takes the decide lock shared
(as a claim does) in a loop while it runs, and the longest wait is the time the publish held it
exclusively. Figures: the longest wait in ms, and its ratio to the baseline's total time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TEAM = "Inbound SDR"


def _document(territories: int, shift: int) -> dict[str, Any]:
    reps = [{"email": f"rep{i}@bench.example", "name": f"Rep {i}"} for i in range(10)]
    return {
        "reps": reps,
        "teams": [{"name": TEAM, "members": [{"rep": r["email"]} for r in reps]}],
        "territories": [
            {
                "name": f"T{t:05d}",
                "countries": ["US"],
                "postal_prefixes": [f"{(t * 5 + j + shift) % 100000:05d}" for j in range(5)],
                "team": TEAM,
            }
            for t in range(territories)
        ],
        "ruleset": {
            "name": "Bench",
            "rules": [
                {"name": "Everyone", "priority": 10, "action": {"type": "team", "team": TEAM}}
            ],
        },
    }


_PROBE = """
import sys, time, select, psycopg
conn = psycopg.connect(sys.argv[1])
longest = 0.0
while not select.select([sys.stdin], [], [], 0)[0]:
    start = time.perf_counter()
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))", [sys.argv[2]])
    longest = max(longest, time.perf_counter() - start)
    time.sleep(0.002)
print(longest)
"""


class Probe:
    """Takes the decide lock shared in a loop, as every lead's claim does, from a process of its
    own (a thread would wait for the publisher's GIL too); the longest wait, in seconds."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.longest = 0.0

    def __enter__(self) -> Probe:
        from routing.decisions import DECIDE_LOCK

        self.process = subprocess.Popen(
            [sys.executable, "-c", _PROBE, self.database_url, DECIDE_LOCK],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        out, _err = self.process.communicate("stop\n", timeout=600)
        self.longest = float(out.strip() or 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--territories", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args, _others = parser.parse_known_args()
    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/leadrouter_config_bench"
    )
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "DATABASE_URL": database_url,
            "LEADROUTER_VAR_DIR": tempfile.mkdtemp(prefix="leadrouter-config-bench-"),
            "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
            "LOG_LEVEL": "WARNING",
        }
    )
    from bench.route_lead import recreate_database

    recreate_database(database_url)
    subprocess.run(
        [str(BIN / "python"), "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=dict(os.environ),
        check=True,
    )
    import django

    django.setup()
    from django.db import connection, transaction
    from django.db.models import F

    from routing.drafts.live import config_live_change
    from routing.drafts.services import (
        config_draft_create,
        config_draft_publish,
        config_draft_replace,
    )
    from routing.models import Team, Territory
    from routing.rules_io import rules_import

    rules_import(_document(args.territories, 0), publish=True)
    results: dict[str, list[tuple[float, float]]] = {"draft": [], "live": [], "baseline": []}

    def draft_publish(round_: int) -> None:
        draft = config_draft_create(actor="bench")
        document = dict(draft.document)
        document["territories"] = _document(args.territories, round_ + 1)["territories"]
        config_draft_replace(draft_id=draft.pk, document=document, actor="bench")
        with Probe(database_url) as probe:
            start = time.perf_counter()
            config_draft_publish(draft_id=draft.pk, actor="bench")
            took = time.perf_counter() - start
        results["draft"].append((took, probe.longest))

    def live_change(round_: int) -> None:
        with Probe(database_url) as probe:
            start = time.perf_counter()
            with config_live_change(actor="bench", what="bench"):
                Team.objects.filter(name=TEAM).update(sla_minutes=10 + round_)
            took = time.perf_counter() - start
        results["live"].append((took, probe.longest))

    def baseline(round_: int) -> None:
        with Probe(database_url) as probe:
            start = time.perf_counter()
            with transaction.atomic():
                Territory.objects.update(postal_prefixes=F("postal_prefixes"), regions=[])
            took = time.perf_counter() - start
        results["baseline"].append((took, probe.longest))

    for round_ in range(args.rounds):
        for step in (
            (draft_publish, live_change, baseline)
            if round_ % 2 == 0
            else (
                baseline,
                live_change,
                draft_publish,
            )
        ):
            step(round_)
    connection.close()
    base = min(total for total, _wait in results["baseline"])
    load = os.getloadavg()
    print(f"territories: {args.territories}, rounds: {args.rounds}")
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("| path | total (ms, best / worst) | longest claim wait (ms) | wait / baseline |")
    print("|---|---|---|---|")
    for name, rows in results.items():
        totals = [total * 1000 for total, _ in rows]
        wait = max(w for _, w in rows) * 1000
        print(
            f"| {name} | {min(totals):.0f} / {max(totals):.0f} | {wait:.0f} | "
            f"{wait / (base * 1000):.1f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
