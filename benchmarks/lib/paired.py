#!/usr/bin/env python3
"""Paired ratios from a compare.sh run: for each scenario and configuration, the median over rounds of
the per-round ratio to the baseline (same round, so the machine's state is shared), beside the plain
medians. report.md's "vs" columns are ratios of medians; this is the figure to quote for an A/B.

    python3 benchmarks/lib/paired.py OUT/results.csv BASELINE CONFIG[,CONFIG...]

Prints a Markdown table: req/s medians, paired req/s and CPU µs/request ratios, syscalls per request
(with --perf-stat) and the per-round req/s ratios, so the spread is visible.
"""
import collections
import csv
import statistics
import sys


def number(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("nan")


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path, baseline, configs = argv[1], argv[2], argv[3].split(",")
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["phase"] == "main"]
    by_round = collections.defaultdict(dict)
    for r in rows:
        by_round[(r["scenario"], r["round"])][r["config"]] = r

    print("| scenario | config | req/s median | baseline req/s | req/s paired | CPU/req paired "
          "| syscalls/req (config vs baseline) | per-round req/s ratios |")
    print("|---|---|---:|---:|---:|---:|---|---|")
    for scenario in sorted({s for s, _ in by_round}):
        rounds = sorted((rd for s, rd in by_round if s == scenario), key=number)
        for config in configs:
            pairs = [(by_round[(scenario, rd)][config], by_round[(scenario, rd)][baseline]) for rd in rounds
                     if config in by_round[(scenario, rd)] and baseline in by_round[(scenario, rd)]]
            if not pairs:
                continue
            rps = [number(a["rps"]) / number(b["rps"]) for a, b in pairs]
            cpu = [number(a["cpu_us_per_request"]) / number(b["cpu_us_per_request"]) for a, b in pairs]
            own = statistics.median(number(a["rps"]) for a, _ in pairs)
            base = statistics.median(number(b["rps"]) for _, b in pairs)
            sys_a = statistics.median(number(a.get("syscalls_per_request")) for a, _ in pairs)
            sys_b = statistics.median(number(b.get("syscalls_per_request")) for _, b in pairs)
            syscalls = f"{sys_a:.3f} vs {sys_b:.3f} ({sys_a / sys_b:.2f}×)" if sys_b == sys_b and sys_b else "n/a"
            print(f"| {scenario} | {config} | {own:,.0f} | {base:,.0f} | {statistics.median(rps):.2f}× "
                  f"| {statistics.median(cpu):.2f}× | {syscalls} | {' '.join(f'{x:.2f}' for x in rps)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
