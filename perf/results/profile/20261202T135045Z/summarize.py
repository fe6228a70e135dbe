"""One markdown table per measure.py output: median (min to max) over rounds per target.

``python summarize.py c64.jsonl [baseline]``: ratios to the baseline (default
``bare_stream``) are paired within a round (the two ran back to back) before the median.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def _spread(values: list[float], digits: int = 1) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    med = statistics.median(values)
    return f"{med:,.{digits}f} ({min(values):,.{digits}f}–{max(values):,.{digits}f})"


def main(path: str, baseline: str = "bare_stream") -> None:
    with open(path) as lines:
        rows = [json.loads(line) for line in lines if line.startswith("{")]
    by_target: dict[str, list[dict]] = defaultdict(list)
    base = {r["round"]: r for r in rows if r["model"] == baseline and r["path"] == "grpc"}
    for r in rows:
        by_target[f"{r['model']} ({r['path']})"].append(r)
    print(
        "| target | tokens/s | ÷ floor | server CPU µs/response | ÷ floor | µs/token "
        "| tokens/response | TTFT p50 ms | gap p50 / p99 ms | frontend µs/token | others' CPU |"
    )
    print("|" + "---|" * 11)
    for name, rs in by_target.items():
        ratio_t = [
            r["tokens_per_s"] / base[r["round"]]["tokens_per_s"] for r in rs if r["round"] in base
        ]
        ratio_c = [
            r["server_cpu_us_per_response"] / base[r["round"]]["server_cpu_us_per_response"]
            for r in rs
            if r["round"] in base and r["server_cpu_us_per_response"]
        ]
        gap_p50 = _spread([r["gap_p50_ms"] for r in rs], 2)
        gap = f"{gap_p50} / {_spread([r['gap_p99_ms'] for r in rs])}"
        print(
            f"| {name} | {_spread([r['tokens_per_s'] for r in rs], 0)} | {_spread(ratio_t, 2)} "
            f"| {_spread([r['server_cpu_us_per_response'] for r in rs])} | {_spread(ratio_c, 2)} "
            f"| {_spread([r['server_cpu_us_per_token'] for r in rs])} "
            f"| {_spread([r['tokens_per_response'] for r in rs], 2)} "
            f"| {_spread([r['ttft_p50_ms'] for r in rs])} | {gap} "
            f"| {_spread([r.get('frontend_cpu_us_per_token') for r in rs])} "
            f"| {_spread([r['others_cpu_share'] * 100 for r in rs], 0)} % |"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
