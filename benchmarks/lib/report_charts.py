"""report.py's charts (PNG, with matplotlib): requests/s and CPU per request by scenario, the ThreadCount sweep and
the open-loop latency percentiles.
"""

from __future__ import annotations

import sys
from pathlib import Path

from report_common import Summary, fmt_us, median, select


# ---- charts ---------------------------------------------------------------------------------


def make_charts(out: Path, data: dict) -> tuple[list[tuple[str, str]], str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return [], (f"Charts were not drawn: matplotlib is not importable by {sys.executable} "
                    "(install Debian's python3-matplotlib; compare.sh then uses /usr/bin/python3).")

    measurements = data["measurements"]
    configs = [c["name"] for c in data["configs"]]
    cmap = plt.get_cmap("tab10")
    colors = {name: cmap(i % 10) for i, name in enumerate(configs)}
    charts: list[tuple[str, str]] = []

    # Panels: every main scenario (with the ceiling borrowed from its twin), then hosting.
    panels = []
    for s in data["meta"].get("scenarios", []):
        rows = []
        for name in configs:
            sm = Summary(select(measurements, phase="main", scenario=s["name"], config=name))
            if sm.n:
                rows.append((name, sm))
        if rows:
            panels.append((s["name"], rows))
    hosting = data["meta"].get("hosting") or {}
    for s in hosting.get("scenarios", []):
        rows = []
        for model in hosting.get("models", []):
            for t in hosting.get("transports", []):
                sm = Summary(select(measurements, phase="hosting", scenario=s["name"], config=t, hosting=model))
                if sm.n:
                    rows.append((f"{t} {model}", sm))
        if rows:
            panels.append((f"hosting {s['name']}", rows))

    def bar_grid(filename: str, title: str, value, low, high, xlabel: str) -> None:
        if not panels:
            return
        cols = 3
        nrows = (len(panels) + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(15, 2.2 + 2.0 * nrows * 1.15), squeeze=False)
        for ax in axes.flat[len(panels):]:
            ax.axis("off")
        for ax, (name, rows) in zip(axes.flat, panels):
            labels = [r[0] for r in rows]
            vals = [value(r[1]) or 0 for r in rows]
            lo = [max(0.0, v - (low(r[1]) if low(r[1]) is not None else v)) for v, r in zip(vals, rows)]
            hi = [max(0.0, (high(r[1]) if high(r[1]) is not None else v) - v) for v, r in zip(vals, rows)]
            ys = range(len(rows))
            bar_colors = [colors.get(l.split()[0], "gray") for l in labels]
            ax.barh(ys, vals, xerr=[lo, hi], color=bar_colors, capsize=3, error_kw={"elinewidth": 1})
            ax.set_yticks(list(ys))
            ax.set_yticklabels(labels, fontsize=8)
            ax.invert_yaxis()
            ax.set_title(name, fontsize=10)
            ax.tick_params(axis="x", labelsize=8)
            ax.set_xlabel(xlabel, fontsize=8)
            ends = [v + h for v, h in zip(vals, hi)]
            top = max(ends) if ends else 0
            for y, v, end in zip(ys, vals, ends):
                ax.text(end + top * 0.02, y, fmt_us(v) if v < 1000 else f"{v / 1000:,.1f}k", va="center",
                        fontsize=7)
            ax.set_xlim(0, top * 1.22 if top else 1)
            if top >= 10000:
                ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x / 1000:,.0f}k"))
        fig.suptitle(title, fontsize=12)
        fig.tight_layout()
        fig.savefig(out / filename, dpi=90)
        plt.close(fig)
        charts.append((filename, title))

    bar_grid("rps.png", "Requests/s by scenario (median; whiskers: min–max over rounds)",
             lambda s: s.rps, lambda s: s.rps_min, lambda s: s.rps_max, "requests/s")
    bar_grid("cpu.png", "Server CPU µs per request by scenario (median over rounds; lower is better; "
             "hosting: Kestrel + proxy)", lambda s: s.cpu,
             lambda s: min((r["cpu_us_per_request"] for r in s.rows if r.get("cpu_us_per_request") is not None),
                           default=None),
             lambda s: max((r["cpu_us_per_request"] for r in s.rows if r.get("cpu_us_per_request") is not None),
                           default=None),
             "CPU µs / request")

    sweep = data["meta"].get("sweep")
    sweep_rows = select(measurements, phase="sweep")
    if sweep and sweep_rows:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for t in sweep["transports"]:
            xs, ys, lo, hi = [], [], [], []
            for n in sweep["threads"]:
                sm = Summary(select(sweep_rows, config=t, threads=n))
                if sm.n:
                    xs.append(n)
                    ys.append(sm.rps)
                    lo.append(sm.rps - sm.rps_min)
                    hi.append(sm.rps_max - sm.rps)
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=t, color=colors.get(t, "gray"))
        ax.set_xscale("log", base=2)
        ax.set_xticks(sweep["threads"])
        ax.set_xticklabels([str(n) for n in sweep["threads"]])
        ax.set_xlabel("ThreadCount (linux, libuv) / IOQueueCount (sockets)")
        ax.set_ylabel("requests/s (median)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{sweep['scenario']['title']}: unpinned, server and load share CPUs {sweep['cpus']}",
                     fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "sweep.png", dpi=90)
        plt.close(fig)
        charts.append(("sweep.png", "Requests/s by ThreadCount (unpinned)"))

    lat_rows = select(measurements, phase="latency")
    if lat_rows:
        names = [c for c in configs if select(lat_rows, config=c)]
        pcts = ["p50", "p90", "p99", "p99.9"]
        fig, ax = plt.subplots(figsize=(9, 4.2))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            rows = select(lat_rows, config=name)
            vals = [median(r["latency_us"][p] for r in rows) / 1000 for p in pcts]
            ax.bar([x + i * width for x in range(len(pcts))], vals, width, label=name, color=colors.get(name))
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(pcts))])
        ax.set_xticklabels(pcts)
        ax.set_yscale("log")
        ax.set_ylabel("latency, ms (log scale; median over rounds)")
        rate = (data["meta"].get("latency") or {}).get("rate")
        ax.set_title(f"Open-loop latency at {rate:,.0f} req/s, 256 connections, GET /json", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=90)
        plt.close(fig)
        charts.append(("latency.png", "Open-loop latency percentiles"))
    return charts, ""
