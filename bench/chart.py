"""``python -m bench.chart``: the throughput and latency chart of docs/benchmarks.md, as SVG.

The figures are the ones the benchmark runs printed and docs/benchmarks.md records (edit
``THROUGHPUT`` and ``LATENCY`` when a run replaces them); each bar sits beside its baseline
from the same run. Standard library only; writes docs/img/benchmarks.svg.
"""

from __future__ import annotations

import sys
from html import escape
from math import log10
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "benchmarks.svg"

# (label, measured, baseline, unit): throughput, higher is better.
THROUGHPUT: list[tuple[str, float, float, str]] = [
    ("single-lead intake vs bare DRF view", 337, 1534, "req/s"),
    ("batch intake (leads) vs bare DRF (requests)", 4770, 1534, "/s"),
    ("pipeline, 1 worker vs raw transaction", 43, 113, "leads/s"),
    ("pipeline, 2 workers vs raw transaction", 52, 114, "leads/s"),
    ("route_lead at 10,000 rules vs bare writes", 51, 259, "decisions/s"),
    ("engine: 1,000 rules indexed vs scanned", 71216, 5720, "decisions/s"),
]
# (label, measured, baseline, unit): latency, lower is better.
LATENCY: list[tuple[str, float, float, str]] = [
    ("intake p99 vs bare DRF p99", 273, 23.2, "ms"),
    ("accept to assigned p95 (50 leads/s) vs goal", 57, 1000, "ms"),
    ("history search, rare term, 1M leads: trigram vs scan", 1.6, 7700, "ms"),
    ("/metrics at 1M leads: counters vs full aggregates", 92, 5686, "ms"),
]

WIDTH, ROW, LEFT, BAR = 900, 34, 360, 420


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def _panel(title: str, rows: list[tuple[str, float, float, str]], top: int, note: str) -> str:
    parts = [
        f'<text x="16" y="{top + 18}" font-size="16" font-weight="600">{escape(title)}</text>',
        f'<text x="16" y="{top + 36}" font-size="12" fill="#555">{escape(note)}</text>',
    ]
    largest = max(max(m, b) for _, m, b, _ in rows)
    y = top + 50
    for label, measured, baseline, unit in rows:
        for k, (value, colour) in enumerate(((baseline, "#b8c2d6"), (measured, "#2456c7"))):
            # Log scale: the figures span five orders of magnitude.
            span = log10(largest * 1.2) - log10(0.5)
            width = max(2.0, BAR * (log10(max(value, 0.5)) - log10(0.5)) / span)
            parts.append(
                f'<rect x="{LEFT}" y="{y + k * 12}" width="{width:.1f}" height="10" '
                f'fill="{colour}"/>'
            )
            parts.append(
                f'<text x="{LEFT + width + 6:.1f}" y="{y + k * 12 + 9}" font-size="10" '
                f'fill="#333">{_number(value)} {escape(unit)}</text>'
            )
        ratio = measured / baseline if baseline else 0
        parts.append(f'<text x="16" y="{y + 10}" font-size="12">{escape(label)}</text>')
        parts.append(
            f'<text x="16" y="{y + 23}" font-size="11" fill="#2456c7">ratio {ratio:.3g}</text>'
        )
        y += ROW
    return "\n".join(parts)


def main() -> int:
    height = 60 + 50 + ROW * len(THROUGHPUT) + 60 + ROW * len(LATENCY) + 40
    top2 = 60 + ROW * len(THROUGHPUT) + 40
    svg = "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">',
            f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
            _panel(
                "Throughput (higher is better)",
                THROUGHPUT,
                0,
                "dark: measured; light: its baseline from the same run; log scale",
            ),
            _panel(
                "Latency and query time (lower is better)",
                LATENCY,
                top2,
                "dark: measured; light: baseline, goal or the code before; log scale",
            ),
            f'<text x="16" y="{height - 12}" font-size="11" fill="#777">'
            "Figures from docs/benchmarks.md (2 cores, PostgreSQL 15, Redis 7, loopback)."
            "</text>",
            "</svg>",
        ]
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(svg + "\n", encoding="utf-8")
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
