"""``make bench``: run every benchmark in turn (each prints its own table)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

BENCHMARKS = [
    "bench.engine_pure",
    "bench.route_lead",
    "bench.pipeline",
    "bench.batch_cpu",
    "bench.crm",
    "bench.io_pool",
    "bench.intake",
    "bench.intake_parts",
    "bench.metrics",
    "bench.spike",
    "bench.history_search",
    "bench.privacy",
]


def main() -> int:
    failed = 0
    for name in BENCHMARKS:
        if importlib.util.find_spec(name) is None:
            continue
        print(f"\n## {name}\n", flush=True)
        failed |= subprocess.call([sys.executable, "-m", name, *sys.argv[1:]]) != 0
    return int(failed)


if __name__ == "__main__":
    raise SystemExit(main())
