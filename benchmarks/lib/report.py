"""Writes report.md, results.csv and the PNG charts from a compare.sh results.json.

compare.py calls generate() at the end of a run; it can also be re-run on a finished run:
    python3 benchmarks/lib/report.py artifacts/benchmarks/<timestamp>

The charts need matplotlib (Debian's python3-matplotlib, for /usr/bin/python3); without it the
report says so and is otherwise complete.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUSY_MACHINE = 0.10         # median "other load" above this earns a warning at the top of the report
LOAD_BOUND_UTIL = 0.95      # wrk at or above this share of its CPUs may itself be the limit
BULK_RESPONSE_BYTES = 64 * 1024   # responses this large per request earn a MiB/s column (compare.py's)


# ---- numbers --------------------------------------------------------------------------------

def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt_int(v) -> str:
    return "–" if v is None else f"{v:,.0f}"


def fmt_us(v) -> str:
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def fmt_count(v) -> str:
    return "–" if v is None else f"{v:.2f}"


def fmt_ratio(v) -> str:
    return "–" if v is None else f"{v:.2f}×"


def fmt_pct(v) -> str:
    return "–" if v is None else f"{v * 100:.0f}%"


def fmt_latency(us) -> str:
    if us is None:
        return "–"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.0f} µs"


def ratio(a, b):
    return a / b if a is not None and b else None


class Summary:
    """The rounds of one (phase, scenario, config, ...) cell."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows
        self.n = len(rows)
        self.rps = median(r["rps"] for r in rows)
        self.rps_min = min((r["rps"] for r in rows), default=None)
        self.rps_max = max((r["rps"] for r in rows), default=None)
        self.cpu = median(r.get("cpu_us_per_request") for r in rows)
        self.mib = median(r.get("mib_per_s") for r in rows)
        self.proxy_cpu = median(r["proxy_cpu_s"] / r["requests"] * 1e6 if r["requests"] else None for r in rows)
        self.server_util = median(r.get("server_cpu_util") for r in rows)
        self.load_util = median(r.get("load_cpu_util") for r in rows)
        self.other_util = median(r.get("other_cpu_util") for r in rows)
        self.switches = median(r.get("switches_per_request") for r in rows)
        self.syscalls = median(r.get("syscalls_per_request") for r in rows)
        self.errors = sum(r["error_total"] for r in rows)
        self.error_rounds = sum(1 for r in rows if r["error_total"])
        kinds: dict[str, int] = defaultdict(int)
        for r in rows:
            for k, v in r["errors"].items():
                kinds[k] += v
        self.error_kinds = {k: v for k, v in kinds.items() if v}

    def errors_text(self) -> str:
        if not self.errors:
            return "0"
        detail = ", ".join(f"{k} {v:,}" for k, v in sorted(self.error_kinds.items()))
        return f"⚠ {self.errors:,} in {self.error_rounds}/{self.n} rounds ({detail})"


def select(measurements: list[dict], **where) -> list[dict]:
    return [m for m in measurements if all(m.get(k) == v for k, v in where.items())]


# ---- results.csv ----------------------------------------------------------------------------

def write_csv(out: Path, data: dict) -> None:
    error_keys = sorted({k for m in data["measurements"] for k in m["errors"]})
    columns = ["phase", "scenario", "mode", "hosting", "threads", "config", "round", "connections", "depth",
               "path", "rps", "requests", "duration_s", "bytes", "mib_per_s", "server_cpu_s", "proxy_cpu_s", "cpu_us_per_request",
               "server_cpu_util", "load_cpu_util", "other_cpu_util", "switches_per_request", "syscalls_per_request",
               "error_total"] + [f"err_{k}" for k in error_keys] + [
               "target_rate", "p50_us", "p90_us", "p99_us", "p99.9_us", "max_us", "lag_p99_us", "fraction",
               "bulk_mib_per_s", "how", "blocked_ms", "worst_wait_us", "command"]
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for m in data["measurements"]:
            lat = m.get("latency_us") or {}
            row = {**m, **{f"err_{k}": m["errors"].get(k, 0) for k in error_keys},
                   "p50_us": lat.get("p50"), "p90_us": lat.get("p90"), "p99_us": lat.get("p99"),
                   "p99.9_us": lat.get("p99.9"), "max_us": lat.get("max"),
                   "lag_p99_us": (m.get("send_lag_us") or {}).get("p99")}
            writer.writerow(["" if row.get(c) is None else
                             (f"{row[c]:.4f}" if isinstance(row[c], float) else row[c]) for c in columns])


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


# ---- report.md ------------------------------------------------------------------------------

def reasons_for(events: list[dict], phase: str, config: str, scenario: str | None, mode: str | None) -> str:
    """Why a cell has no (or fewer) measurements: the events that name it."""
    hits = []
    for e in events:
        if e["phase"] != phase or e["config"] != config:
            continue
        if e["scenario"] not in ("*", scenario):
            continue
        if e["scenario"] == "*" and mode and e.get("mode") not in (None, mode, "any"):
            continue
        hits.append(e)
    if not hits:
        return ""
    states = sorted({e["state"] for e in hits})
    reason = hits[0]["reason"]
    if len(reason) > 160:
        reason = reason[:157] + "…"
    return f"{'/'.join(states)}: {reason}"


def scenario_table(data: dict, scenario: dict) -> list[str]:
    measurements = data["measurements"]
    baseline = data["meta"].get("baseline", "sockets")
    counted = any(m.get("switches_per_request") is not None for m in measurements)  # --perf-stat
    # Large responses (the download scenarios) also show what wrk received, in MiB/s.
    bulk = any(m.get("mib_per_s") is not None and m["requests"] and m["bytes"] >= m["requests"] * BULK_RESPONSE_BYTES
               for m in select(measurements, phase="main", scenario=scenario["name"]))
    lines = ["| Configuration | Median req/s | Min–max req/s | vs " + baseline + (" | MiB/s" if bulk else "")
             + " | CPU µs/req | vs " + baseline
             + " | Server CPU | wrk CPU | Other load" + (" | Switches/req | Syscalls/req" if counted else "")
             + " | Rounds | Errors |",
             "|---|---:|---:|---:|" + ("---:|" if bulk else "") + "---:|---:|---:|---:|---:|"
             + ("---:|---:|" if counted else "") + "---:|---|"]
    summaries = {}
    for c in data["configs"]:
        name = c["name"]
        source = scenario["name"]
        if c["kind"] == "ceiling" and scenario["twin"] and not select(measurements, phase="main",
                                                                       scenario=source, config=name):
            source = scenario["twin"]
        summaries[name] = (Summary(select(measurements, phase="main", scenario=source, config=name)), source)
    base = summaries.get(baseline, (None,))[0]
    notes = []
    for c in data["configs"]:
        name = c["name"]
        sm, source = summaries[name]
        label = name
        if c["kind"] == "ceiling":
            if scenario["path"] not in ("/plaintext", "/json"):
                continue
            label = "ceiling (raw C epoll)"
            if source != scenario["name"]:
                label += " ¹"
                notes.append("¹ The ceiling has no modes: the same measurements as in the table of "
                             f"`{source}`.")
        if not sm.n:
            why = reasons_for(data["events"], "main", name, scenario["name"],
                              scenario["mode"] if c["kind"] != "ceiling" else None) or "not measured"
            lines.append(f"| {label} | – | – | – | " + ("– | " if bulk else "") + "– | – | – | – | – | "
                         + ("– | – | " if counted else "") + f"0 | {why} |")
            continue
        load = fmt_pct(sm.load_util) + (" ²" if sm.load_util is not None and sm.load_util >= LOAD_BOUND_UTIL else "")
        rps_ratio = ratio(sm.rps, base.rps if base and base.n else None)
        cpu_ratio = ratio(sm.cpu, base.cpu if base and base.n else None)
        extra = reasons_for(data["events"], "main", name, scenario["name"],
                            scenario["mode"] if c["kind"] != "ceiling" else None)
        errors = sm.errors_text() + (f"; {extra}" if extra else "")
        lines.append(f"| {label} | {fmt_int(sm.rps)} | {fmt_int(sm.rps_min)}–{fmt_int(sm.rps_max)} | "
                     f"{fmt_ratio(rps_ratio)} | " + (f"{fmt_int(sm.mib)} | " if bulk else "")
                     + f"{fmt_us(sm.cpu)} | {fmt_ratio(cpu_ratio)} | "
                     f"{fmt_pct(sm.server_util)} | {load} | {fmt_pct(sm.other_util)} | "
                     + (f"{fmt_count(sm.switches)} | {fmt_count(sm.syscalls)} | " if counted else "")
                     + f"{sm.n} | {errors} |")
        if sm.load_util is not None and sm.load_util >= LOAD_BOUND_UTIL:
            notes.append("² wrk used its whole CPU: the load generator may be the limit here, so requests/s "
                         "understates the server; compare CPU µs/request instead.")
    notes = sorted(set(notes), key=notes.index)
    return lines + [""] + ([" ".join(notes), ""] if notes else [])


def hosting_section(data: dict) -> list[str]:
    hosting = data["meta"].get("hosting")
    rows = select(data["measurements"], phase="hosting")
    if not hosting:
        return []
    lines = ["## Hosting models", "",
             "Kestrel alone, behind nginx (TCP upstream, and Unix-socket upstream) and behind Caddy, each with "
             "keep-alive to the upstream. The proxy is pinned to the same server CPU set as Kestrel, so these "
             "rows show what a proxy costs on the same hardware; CPU µs/request counts Kestrel and the proxy "
             "together (the proxy's share in brackets). \"vs direct\" compares with Kestrel alone on the same "
             "transport in the same rounds.", ""]
    for s in hosting["scenarios"]:
        lines += [f"### {s['title']}", "",
                  "| Hosting | Transport | Median req/s | Min–max req/s | vs direct | CPU µs/req (proxy) | "
                  "Other load | Rounds | Errors |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for model in hosting["models"]:
            for t in hosting["transports"]:
                sm = Summary(select(rows, scenario=s["name"], config=t, hosting=model))
                if not sm.n:
                    why = reasons_for(data["events"], "hosting", t, model, None) or "not measured"
                    lines.append(f"| {model} | {t} | – | – | – | – | – | 0 | {why} |")
                    continue
                direct = Summary(select(rows, scenario=s["name"], config=t, hosting="direct"))
                vs = ratio(sm.rps, direct.rps if direct.n else None) if model != "direct" else None
                cpu = fmt_us(sm.cpu) + (f" ({fmt_us(sm.proxy_cpu)})" if model != "direct" else "")
                lines.append(f"| {model} | {t} | {fmt_int(sm.rps)} | {fmt_int(sm.rps_min)}–{fmt_int(sm.rps_max)} | "
                             f"{fmt_ratio(vs) if model != 'direct' else '1.00×'} | {cpu} | "
                             f"{fmt_pct(sm.other_util)} | {sm.n} | "
                             f"{sm.errors_text()} |")
        lines.append("")
    return lines


def latency_section(data: dict) -> list[str]:
    lat = data["meta"].get("latency")
    rows = select(data["measurements"], phase="latency")
    if not lat:
        return []
    lines = ["## Latency (open loop)", "",
             f"benchmarks/loadgen sends GET /json over {lat['connections']} connections at a fixed total rate of "
             f"**{lat['rate']:,.0f} req/s** ({lat['rate_source']}), on a schedule that does not wait for answers, "
             "and times each answer from the request's *intended* send time, so a server stall counts against "
             "every request it delayed (no coordinated omission). Histogram precision ≤ 0.78%. "
             f"{lat['duration_s']:g} s measured after {lat.get('warmup_s', 1.0):g} s at the same rate. Values are medians over rounds of "
             "each round's percentile; \"loadgen lag\" is how late the generator itself was (p99): when it is "
             "large the machine, not the server, delayed the requests. CPU µs/request at a fixed, modest rate "
             "includes the server's idle-time costs (timers, polling), which a saturated run hides.", "",
             "| Configuration | Achieved req/s | p50 | p90 | p99 | p99.9 | max (worst round) | "
             "CPU µs/req at this rate | loadgen lag p99 | Other load | Rounds | Errors |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in data["configs"]:
        name = c["name"]
        rs = select(rows, config=name)
        if not rs:
            why = reasons_for(data["events"], "latency", name, "json-256-open-loop", None) or "not measured"
            lines.append(f"| {name} | – | – | – | – | – | – | – | – | – | 0 | {why} |")
            continue
        sm = Summary(rs)

        def p(key):
            return fmt_latency(median(r["latency_us"][key] for r in rs))

        worst = max(r["latency_us"]["max"] for r in rs)
        lag = median(r["send_lag_us"]["p99"] for r in rs)
        lines.append(f"| {name} | {fmt_int(sm.rps)} | {p('p50')} | {p('p90')} | {p('p99')} | {p('p99.9')} | "
                     f"{fmt_latency(worst)} | {fmt_us(sm.cpu)} | {fmt_latency(lag)} | {fmt_pct(sm.other_util)} | "
                     f"{sm.n} | {sm.errors_text()} |")
    return lines + [""]


# ---- the open-loop phases (openloop.py) -------------------------------------------------------

def paired_ratios(rows: list[dict], base_rows: list[dict], value) -> list[float]:
    """Each round's value / the baseline's value in the same round."""
    base = {r["round"]: value(r) for r in base_rows}
    return [value(r) / base[r["round"]] for r in rows if base.get(r["round"]) and value(r) is not None]


def paired(rows: list[dict], base_rows: list[dict], value) -> str:
    """The median over rounds of each round's value / the baseline's value in the same round, with the
    min-max: the ratio to quote, since both windows of a round share the machine's state."""
    ratios = paired_ratios(rows, base_rows, value)
    if not ratios:
        return "–"
    if len(ratios) == 1:
        return fmt_ratio(ratios[0])
    return f"{fmt_ratio(median(ratios))} ({min(ratios):.2f}–{max(ratios):.2f})"


def spread(rows: list[dict], value, fmt) -> str:
    """Median (min–max) over rounds."""
    values = [value(r) for r in rows if value(r) is not None]
    if not values:
        return "–"
    text = fmt(median(values))
    return text if len(values) == 1 else f"{text} ({fmt(min(values))}–{fmt(max(values))})"


def percentile(key: str):
    return lambda r: r["latency_us"][key]


def lag_p99(r: dict):
    return r["send_lag_us"]["p99"]


def latency_cells(rows: list[dict], base_rows: list[dict]) -> str:
    """p50 | p99 (min–max) | p99.9 | p99 against the baseline, paired by round."""
    return (f"{fmt_latency(median(percentile('p50')(r) for r in rows))} | {spread(rows, percentile('p99'), fmt_latency)} | "
            f"{fmt_latency(median(percentile('p99.9')(r) for r in rows))} | {paired(rows, base_rows, percentile('p99'))}")


def not_measured(data: dict, phase: str, names: list[str]) -> list[str]:
    """One line for the selected configurations with no row in a phase, with the reason."""
    rows = select(data["measurements"], phase=phase)
    missing = [c["name"] for c in data["configs"] if c["name"] not in names and not select(rows, config=c["name"])]
    if not missing:
        return []
    reasons = []
    for name in missing:
        event = next((e for e in data["events"] if e["phase"] == phase and e["config"] == name), None)
        reason = f"{event['state']}: {event['reason']}" if event else "not measured"
        reasons.append(f"{name} ({reason[:157] + '…' if len(reason) > 160 else reason})")
    return ["Not measured: " + "; ".join(reasons) + ".", ""]


def fixed_section(data: dict) -> list[str]:
    fixed = data["meta"].get("fixed")
    if not fixed:
        return []
    rows = select(data["measurements"], phase="fixed")
    baseline = fixed["baseline"]
    lines = ["## Fixed rates (open loop)", "",
             f"benchmarks/loadgen sends requests on a fixed schedule (no coordinated omission) at fractions of "
             f"{baseline}'s saturated rate on each scenario. The server is pinned to CPU {data['meta'].get('server_cpus')} "
             f"and loadgen to CPU {data['meta'].get('client_cpus')}. Each fresh server gets "
             f"{fixed['prime_s']:g} s at the highest rate before its first window of a scenario, then every window "
             f"{fixed['warmup_s']:g} s of warm-up at its own rate, highest rate first; {fixed['duration_s']:g} s "
             "measured. **CPU µs/req** is the server's CPU time between loadgen's window markers over the answers "
             "that arrived in between; **Server CPU** is that time as a share of the pinned CPUs. Latencies are "
             "medians over rounds of each round's percentile; **lag** is how late loadgen itself sent (p99): when "
             f"it is large, the client, not the server, delayed the requests. **vs {baseline}**: the median over "
             "rounds of each round's ratio (min–max), both windows of a round minutes or, with `--order paired`, "
             "seconds apart.", ""]
    names = []
    for s in fixed["scenarios"]:
        base = fixed["base"].get(s["name"], {})
        lines += [f"### {s['name']}: {s['title']}", "",
                  f"`GET {s['path']}`, {s['connections']} keep-alive connections; 100% = {fmt_int(base.get('rate'))} "
                  f"req/s ({base.get('source', '?')}).", "",
                  f"| Rate | Configuration | Achieved req/s | CPU µs/req | vs {baseline} | Server CPU | p50 | p99 | p99.9 "
                  f"| p99 vs {baseline} | lag p99 | Other load | Rounds | Errors |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for fraction in fixed["fractions"]:
            target = fixed["rates"].get(s["name"], {}).get(str(fraction))
            base_rows = select(rows, scenario=s["name"], fraction=fraction, config=baseline)
            for c in data["configs"]:
                rs = select(rows, scenario=s["name"], fraction=fraction, config=c["name"])
                if not rs:
                    continue
                names.append(c["name"])
                sm = Summary(rs)
                lines.append(
                    f"| {fraction:.0%} ({fmt_int(target)}/s) | {c['name']} | {fmt_int(sm.rps)} | "
                    f"{spread(rs, lambda r: r.get('cpu_us_per_request'), fmt_us)} | "
                    f"{paired(rs, base_rows, lambda r: r.get('cpu_us_per_request'))} | {fmt_pct(sm.server_util)} | "
                    f"{latency_cells(rs, base_rows)} | {fmt_latency(median(lag_p99(r) for r in rs))} | "
                    f"{fmt_pct(sm.other_util)} | {sm.n} | {sm.errors_text()} |")
        lines.append("")
    return lines + not_measured(data, "fixed", names)


def mixed_section(data: dict) -> list[str]:
    mixed = data["meta"].get("mixed")
    if not mixed:
        return []
    rows = select(data["measurements"], phase="mixed")
    baseline = mixed["baseline"]
    small, bulk = mixed["small"], mixed["bulk"]
    lines = ["## Mixed load on one loop", "",
             f"One event loop (`--threads {mixed['threads']}`, IOQueueCount for Sockets) on the pinned server CPU. "
             f"wrk keeps {bulk['connections']} connections fetching `{bulk['path']}` (closed loop, niced so that "
             f"loadgen goes first on the shared client CPU) while loadgen sends `GET {small['path']}` over "
             f"{small['connections']} other connections at a fixed **{mixed['rate']:,.0f} req/s** (open loop: a "
             "request delayed behind the downloads counts from when it was due). "
             f"{mixed['warmup_s']:g} s warm-up with both running, {mixed['duration_s']:g} s measured. **Bulk MiB/s** "
             "is what wrk received over its whole run, which spans the small requests' warm-up and window. "
             f"Ratios: median of per-round ratios to {baseline} (min–max).", "",
             f"| Configuration | Small req/s | p50 | p99 | p99.9 | p99 vs {baseline} | Bulk MiB/s | vs {baseline} | "
             "Server CPU | lag p99 | Other load | Rounds | Errors |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    base_rows = select(rows, config=baseline)
    names = []
    for c in data["configs"]:
        rs = select(rows, config=c["name"])
        if not rs:
            continue
        names.append(c["name"])
        sm = Summary(rs)
        lines.append(
            f"| {c['name']} | {fmt_int(sm.rps)} | {latency_cells(rs, base_rows)} | "
            f"{spread(rs, lambda r: r['bulk_mib_per_s'], fmt_int)} | "
            f"{paired(rs, base_rows, lambda r: r['bulk_mib_per_s'])} | {fmt_pct(sm.server_util)} | "
            f"{fmt_latency(median(lag_p99(r) for r in rs))} | {fmt_pct(sm.other_util)} | {sm.n} | {sm.errors_text()} |")
    return lines + [""] + not_measured(data, "mixed", names)


def blocking_section(data: dict) -> list[str]:
    blocking = data["meta"].get("blocking")
    if not blocking:
        return []
    rows = select(data["measurements"], phase="blocking")
    baseline = blocking["baseline"]
    lines = ["## Blocking bystanders", "",
             f"A fresh server per block, pinned to CPU {blocking['server_cpu']} alone with one event loop "
             f"(`--threads {blocking['threads']}`). {blocking['bystanders']} keep-alive bystanders send `GET "
             f"{blocking['path']}` at a fixed total {blocking['rate']:,.0f} req/s (loadgen, open loop; "
             f"{blocking['warmup_s']:g} s warm-up). Then a request on an established keep-alive connection makes the "
             f"sample's handler block its thread for {blocking['ms']:,} ms (`/block?how=…`): `sleep` is "
             "`Thread.Sleep`, `result` is `.Result` on a task a `Task.Delay` completes, `lock` waits for a lock "
             "another thread holds. **Worst wait**: the longest latency of a bystander request due while the "
             "handler was blocked (by the handler's own start and end on CLOCK_MONOTONIC), counted from when it "
             "was due: median over rounds (min–max). **Answered before the handler returned**: of the bystander "
             "requests due during the block, how many were answered before it ended (issue 32 asks for all).", ""]
    names = []
    for how in blocking["hows"]:
        lines += [f"### how={how}", "",
                  f"| Configuration | Worst wait | vs {baseline} | Handler blocked | Due during the block | "
                  "Answered before the handler returned | lag p99 | Other load | Rounds | Errors |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        base_rows = select(rows, how=how, config=baseline)
        for c in data["configs"]:
            rs = select(rows, how=how, config=c["name"])
            if not rs:
                continue
            names.append(c["name"])
            sm = Summary(rs)
            due = sum(r["bystanders_during"] for r in rs)
            answered = sum(r["answered_before_return"] for r in rs)
            answered_text = f"{answered:,} ({answered / due:.0%})" if due else "–"
            lines.append(
                f"| {c['name']} | {spread(rs, lambda r: r['worst_wait_us'], fmt_latency)} | "
                f"{paired(rs, base_rows, lambda r: r['worst_wait_us'])} | "
                f"{fmt_latency(median(r['blocked_ms'] * 1000 for r in rs))} | {due:,} | {answered_text} | "
                f"{fmt_latency(median(lag_p99(r) for r in rs))} | {fmt_pct(sm.other_util)} | {sm.n} | "
                f"{sm.errors_text()} |")
        lines.append("")
    return lines + not_measured(data, "blocking", names)


def protocols_section(data: dict) -> list[str]:
    protocols = data["meta"].get("protocols")
    if not protocols:
        return []
    rows = select(data["measurements"], phase="protocols")
    baseline = protocols["baseline"]
    meta = data["meta"]
    paired_order = ", both windows seconds apart (`--order paired`)" if protocols.get("order") == "paired" else ""
    lines = ["## HTTP/2, gRPC and WebSocket (closed loop)", "",
             f"At saturation, as the main phase: the server pinned to CPU {meta.get('server_cpus')}, the load generator "
             f"to CPU {meta.get('client_cpus')}, each fresh server primed on its scenarios and each window warmed up "
             f"first. {protocols.get('h2load') or 'h2load (not installed: its scenarios were skipped)'} speaks HTTP/2 "
             "with prior knowledge (h2c) to a server started "
             "with `--protocols http2` (without TLS, Kestrel serves its default Http1AndHttp2 as HTTP/1.1 only); "
             f"`grpc-unary` posts one gRPC message of {protocols['grpc_message_bytes']} bytes (its length prefix "
             "before it) per call to the sample's echo method, verified once with curl (grpc-status 0, the message "
             "echoed) and in every window by the bytes that came back (*short*: answers without the message). "
             "benchmarks/wsload upgrades to WebSocket on a server with Kestrel's default and keeps one "
             f"{protocols['ws_message_bytes']}-byte message in flight per connection, each echo checked byte for "
             "byte: **msgs/s**. **CPU µs/req** is the server's CPU time over the window per answer (per echo); "
             "**Client CPU**, the load generator's share of its CPUs (² at ≥ 95%: it may be the limit). "
             f"**vs {baseline}**: the median over rounds of each round's ratio (min–max){paired_order}.", ""]
    names = []
    for s in protocols["scenarios"]:
        unit = "msgs/s" if s["path"] == "/ws" else "req/s"
        lines += [f"### {s['name']}: {s['title']}", "",
                  f"| Configuration | Median {unit} | Min–max | vs {baseline} | CPU µs/req | vs {baseline} | Server CPU | "
                  "Client CPU | Other load | Rounds | Errors |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        base_rows = select(rows, scenario=s["name"], config=baseline)
        for c in data["configs"]:
            rs = select(rows, scenario=s["name"], config=c["name"])
            if not rs:
                why = reasons_for(data["events"], "protocols", c["name"], s["name"], "middleware")
                if why:
                    lines.append(f"| {c['name']} | – | – | – | – | – | – | – | – | 0 | {why} |")
                continue
            names.append(c["name"])
            sm = Summary(rs)
            load = fmt_pct(sm.load_util) + (" ²" if sm.load_util is not None and sm.load_util >= LOAD_BOUND_UTIL else "")
            lines.append(
                f"| {c['name']} | {fmt_int(sm.rps)} | {fmt_int(sm.rps_min)}–{fmt_int(sm.rps_max)} | "
                f"{paired(rs, base_rows, lambda r: r['rps'])} | {fmt_us(sm.cpu)} | "
                f"{paired(rs, base_rows, lambda r: r.get('cpu_us_per_request'))} | {fmt_pct(sm.server_util)} | {load} | "
                f"{fmt_pct(sm.other_util)} | {sm.n} | {sm.errors_text()} |")
        lines.append("")
    return lines + not_measured(data, "protocols", names)


def adaptive_twin(name: str) -> str:
    """The ThreadPool row an Adaptive row is judged against: its name without "-adaptive" (linux-uring-adaptive:
    linux-uring)."""
    return name.replace("-adaptive", "")


# Issue 32's targets for the new scheduling mode, checked for every configuration whose name says
# "adaptive" against the reference rows of the same run (ratios of medians).
ISSUE32_INLINE, ISSUE32_CEILING, ISSUE32_SOCKETS = "linux-inline", "ceiling", "sockets"
ISSUE32_WORST_WAIT_US = 50_000
ISSUE32_LOW_FRACTION = 0.05         # at this load and below the bound against the C server is 2x, else 1.5x


def issue32_targets(data: dict) -> list[str]:
    measurements = data["measurements"]
    candidates = [c["name"] for c in data["configs"] if "adaptive" in c["name"]
                  and select(measurements, config=c["name"])
                  and any(m["phase"] in ("fixed", "mixed", "blocking", "protocols")
                          for m in select(measurements, config=c["name"]))]
    if not candidates:
        return []
    lines = ["## Issue 32's targets", "",
             f"Each configuration named *adaptive* against `{ISSUE32_INLINE}`, `{ISSUE32_CEILING}` and "
             f"`{ISSUE32_SOCKETS}` in this run: ratios of medians, **no** where missed; in the protocols phase, "
             "against its ThreadPool twin (the same name without *-adaptive*), the median of per-round ratios "
             "(min–max). A ratio inside the rows' min–max spread is not a result either way on a shared machine.", "",
             "| Configuration | Target | Where | Bound | Measured | Met |", "|---|---|---|---:|---:|---|"]

    def med(phase, config, value, **where):
        return median(value(r) for r in select(measurements, phase=phase, config=config, **where))

    def row(name, target, where, bound_text, measured, met):
        if measured is None:
            return
        lines.append(f"| {name} | {target} | {where} | {bound_text} | {measured} | {'yes' if met else '**no**'} |")

    fixed = data["meta"].get("fixed") or {}
    for name in candidates:
        for s in fixed.get("scenarios", []):
            for f in fixed.get("fractions", []):
                where = f"{s['name']} at {f:.0%}"
                cpu = med("fixed", name, lambda r: r.get("cpu_us_per_request"), scenario=s["name"], fraction=f)
                if cpu is None:
                    continue
                inline = med("fixed", ISSUE32_INLINE, lambda r: r.get("cpu_us_per_request"), scenario=s["name"], fraction=f)
                if inline:
                    row(name, f"CPU/req vs {ISSUE32_INLINE}", where, "≤ 1.10×", fmt_ratio(cpu / inline), cpu / inline <= 1.10)
                ceiling = med("fixed", ISSUE32_CEILING, lambda r: r.get("cpu_us_per_request"), scenario=s["name"], fraction=f)
                if ceiling:
                    bound = 2.0 if f <= ISSUE32_LOW_FRACTION else 1.5
                    row(name, "CPU/req vs the C server", where, f"≤ {bound:.2f}×", fmt_ratio(cpu / ceiling),
                        cpu / ceiling <= bound)
                for key in ("p99", "p99.9"):
                    mine = med("fixed", name, percentile(key), scenario=s["name"], fraction=f)
                    ref = med("fixed", ISSUE32_SOCKETS, percentile(key), scenario=s["name"], fraction=f)
                    if ref:
                        row(name, f"{key} vs {ISSUE32_SOCKETS}", where, f"≤ {fmt_latency(ref)}", fmt_latency(mine),
                            mine <= ref)
        mine = med("mixed", name, percentile("p99"))
        ref = med("mixed", ISSUE32_SOCKETS, percentile("p99"))
        if mine is not None and ref:
            row(name, f"small-request p99 vs {ISSUE32_SOCKETS}", "mixed", f"≤ {fmt_latency(ref)}", fmt_latency(mine),
                mine <= ref)
        mine = med("mixed", name, lambda r: r["bulk_mib_per_s"])
        ref = med("mixed", ISSUE32_SOCKETS, lambda r: r["bulk_mib_per_s"])
        if mine is not None and ref:
            row(name, f"bulk MiB/s vs {ISSUE32_SOCKETS}", "mixed", "≥ 0.90×", fmt_ratio(mine / ref), mine / ref >= 0.90)
        for how in (data["meta"].get("blocking") or {}).get("hows", []):
            worst = med("blocking", name, lambda r: r["worst_wait_us"], how=how)
            if worst is not None:
                row(name, "worst bystander wait", f"blocking, how={how}", f"< {fmt_latency(ISSUE32_WORST_WAIT_US)}",
                    fmt_latency(worst), worst < ISSUE32_WORST_WAIT_US)
        twin = adaptive_twin(name)
        for s in (data["meta"].get("protocols") or {}).get("scenarios", []) if twin != name else []:
            rows = select(measurements, phase="protocols", scenario=s["name"])
            ratios = paired_ratios(select(rows, config=name), select(rows, config=twin), lambda m: m["rps"])
            if ratios:
                # Three decimals: at 0.998× a "1.00×" beside "no" would read as a contradiction.
                spread_text = f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(ratios) > 1 else ""
                row(name, f"throughput vs {twin}", f"protocols, {s['name']}", "≥ 1.00×",
                    f"{median(ratios):.3f}×{spread_text}", median(ratios) >= 1.0)
    return lines + [""]


def sweep_section(data: dict) -> list[str]:
    sweep = data["meta"].get("sweep")
    rows = select(data["measurements"], phase="sweep")
    if not sweep:
        return []
    lines = ["## ThreadCount sweep (unpinned)", "",
             f"{sweep['scenario']['title']}. **Unpinned**: the server may run on CPUs {sweep['cpus']} and the "
             f"load generator (wrk -t{sweep['wrk_threads']}) runs on the same CPUs, so they compete; this shows how "
             "each transport's thread count behaves when it is not alone, not its best case. ThreadCount is "
             "`--threads` (linux: ThreadCount; sockets: IOQueueCount; libuv: ThreadCount). Cells: median req/s "
             "(min–max) · CPU µs/request.", "",
             "| Transport | " + " | ".join(f"threads={n}" for n in sweep["threads"]) + " |",
             "|---|" + "---:|" * len(sweep["threads"])]
    for t in sweep["transports"]:
        cells = []
        for n in sweep["threads"]:
            sm = Summary(select(rows, config=t, threads=n))
            if sm.n:
                err = f" ⚠ {sm.errors:,} errors" if sm.errors else ""
                cells.append(f"{fmt_int(sm.rps)} ({fmt_int(sm.rps_min)}–{fmt_int(sm.rps_max)}) · "
                             f"{fmt_us(sm.cpu)} µs{err}")
            else:
                cells.append(reasons_for(data["events"], "sweep", t, f"threads={n}", None) or "not measured")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return lines + [""]


def events_section(data: dict) -> list[str]:
    groups: dict[tuple, list[int]] = defaultdict(list)
    for e in data["events"]:
        groups[(e["state"], e["phase"], e["config"], e["scenario"], e.get("mode"), e["reason"])].append(e["round"])
    if not groups:
        return ["## Skipped and failed", "", "Nothing was skipped; every server passed verification.", ""]
    order = {"failed": 0, "unavailable": 1, "unsupported": 2, "skipped": 3}
    lines = ["## Skipped and failed", "",
             "*failed*: the server did not start, answered wrongly in verification, or died; it is retried "
             "next round (and fails a --quick run). *unavailable*: a configuration marked @optional in "
             "configs.txt did not start; *unsupported*: this build of the sample rejected the arguments "
             "(usage error, exit code 2) or does not serve the path (404). Both are skipped for the rest of "
             "the run. *skipped*: a tool is missing.", "",
             "| State | Phase | Configuration | Scenario | Rounds | Reason |", "|---|---|---|---|---|---|"]
    for key in sorted(groups, key=lambda k: (order.get(k[0], 9), k[1], k[2], str(k[3]))):
        state, phase, config, scenario, mode, reason = key
        rounds = ", ".join(str(r) for r in groups[key] if r is not None) or "–"
        where = scenario if scenario != "*" else f"all ({mode} mode)" if mode else "all"
        reason = reason.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {state} | {phase} | {config} | {where} | {rounds} | {reason} |")
    return lines + [""]


# The performance targets of the project (issue "Performance"), checked against this run's medians.
# Each: (label, kind, scenarios, config, other config, bound). kind "rps": config/other req/s >= bound;
# "cpu": config/other CPU us per request <= bound; "p99": config's open-loop p99 <= other's.
TARGETS = [
    ("JSON, middleware, 256 connections: server CPU per request", "cpu", ["json-256"], "linux", "sockets", 0.75),
    ("JSON, middleware, 256 connections: requests/s", "rps", ["json-256"], "linux", "sockets", 1.25),
    ("JSON, middleware, 256 connections: requests/s vs sockets-inline", "rps", ["json-256"], "linux",
     "sockets-inline", 1.10),
    ("plaintext-16, middleware and platform, 256 and 1024 connections", "rps",
     ["plaintext16-256", "plaintext16-1024", "plaintext16-256-platform", "plaintext16-1024-platform"],
     "linux", "sockets", 1.15),
    ("connection churn", "rps", ["churn-64"], "linux", "sockets", 1.2),
    ("app scenarios (text, json-object, xml, html, MVC)", "rps",
     ["text-256", "json-object-256", "xml-256", "html-256", "api-test-256"], "linux", "sockets", 1.05),
    ("ThreadPool scheduling never slower: every scenario", "rps", None, "linux", "sockets", 1.0),
    ("latency: p99 at a fixed rate", "p99", None, "linux", "sockets", 1.0),
]


def targets_section(data: dict) -> list[str]:
    """One row per target and scenario: the measured ratio beside its bound, for the default
    configuration (`linux`, ThreadPool scheduling) and, for reference, `linux-inline`."""
    measurements = data["measurements"]
    names = {c["name"] for c in data["configs"]}
    if "linux" not in names or "sockets" not in names:
        return []
    if not any(m["phase"] in ("main", "latency") for m in measurements):
        return []  # e.g. a sweep-only run: no target is measured
    main_names = [s["name"] for s in data["meta"].get("scenarios", [])]
    lines = ["## Targets", "",
             "The project's performance targets against this run's medians. **Met** compares the default "
             "configuration (`linux`: ThreadPool scheduling) with the bound; the `linux-inline` column is for "
             "reference (opt-in scheduling). A ratio inside the min–max spread of its rows is not a result "
             "either way on a shared machine.", "",
             "| Target | Scenario | Bound | linux | Met | linux-inline |", "|---|---|---:|---:|---|---:|"]

    def summary(scenario: str, config: str) -> Summary:
        return Summary(select(measurements, phase="main", scenario=scenario, config=config))

    def value(kind: str, scenario: str, config: str, other: str):
        a, b = summary(scenario, config), summary(scenario, other)
        if not a.n or not b.n:
            return None
        return ratio(a.cpu, b.cpu) if kind == "cpu" else ratio(a.rps, b.rps)

    for label, kind, scenarios, config, other, bound in TARGETS:
        if kind == "p99":
            rows = select(measurements, phase="latency")

            def p99(name):
                return median(r["latency_us"]["p99"] for r in select(rows, config=name))
            mine, ref, inline = p99(config), p99(other), p99("linux-inline")
            if mine is None or ref is None:
                continue
            met = "yes" if mine <= ref else "**no**"
            lines.append(f"| {label} | json-256 open loop | ≤ {other}'s {fmt_latency(ref)} | {fmt_latency(mine)} | "
                         f"{met} | {fmt_latency(inline)} |")
            continue
        for scenario in scenarios or main_names:
            if scenario not in main_names:
                continue
            v = value(kind, scenario, config, other)
            if v is None:
                continue
            inline = value(kind, scenario, "linux-inline", other) if "linux-inline" in names else None
            met = (v <= bound) if kind == "cpu" else (v >= bound)
            sign = "≤" if kind == "cpu" else "≥"
            what = "CPU/req" if kind == "cpu" else "req/s"
            lines.append(f"| {label} | {scenario} | {what} {sign} {bound:.2f}× {other} | {fmt_ratio(v)} | "
                         f"{'yes' if met else '**no**'} | {fmt_ratio(inline)} |")
    lines += ["", "Allocations (bytes per request attributable to the transport) are measured by "
              "benchmarks/Microbenchmarks (BenchmarkDotNet's MemoryDiagnoser), not by this run.", ""]
    return lines


def remeasured_text(meta: dict, results: list[dict]) -> str:
    """The Windows row's note on windows measured again because other processes took the CPUs."""
    if not meta.get("remeasure"):
        return ""
    windows = [m for m in results if "attempts" in m]
    again = [m for m in windows if m["attempts"] > 1]
    share = meta.get("disturbed_other_load", 0.1)
    return (f"; a window in which others took ≥ {share:.0%} of the benchmark's CPUs was measured again, up to "
            f"{meta['remeasure']} more times, keeping the least disturbed ({len(again)} of {len(windows)} windows)")


def write_markdown(out: Path, data: dict, charts: list[tuple[str, str]], chart_note: str) -> None:
    meta = data["meta"]
    machine = meta.get("machine", {})
    quick = meta.get("quick")
    elapsed = meta.get("elapsed_s")
    lines = ["# Transport comparison", ""]
    if meta.get("interrupted"):
        lines += ["**The run was interrupted: the tables hold what was measured before that.**", ""]
    other = median(m.get("other_cpu_util") for m in data["measurements"])
    if other is not None and other > BUSY_MACHINE:
        lines += [f"**⚠ The machine was busy:** other processes used a median {other * 100:.0f}% of the benchmark's "
                  "CPUs during the measured windows (column *Other load*). Treat differences smaller than the "
                  "min–max spread as noise, and prefer CPU µs/request over requests/s.", ""]
    lines += [
        "Produced by `benchmarks/compare.sh`. Every number is a median over interleaved rounds on one shared "
        "machine: compare rows within a table (ratios), not with other machines or other runs."
        + (" This is a **--quick** run (CI smoke test): too short for conclusions about speed." if quick else ""),
        "",
        "| | |", "|---|---|",
        f"| Date | {meta.get('date_utc', '')} |",
        f"| Command | `{meta.get('command', '')}` |",
        f"| Commit | {machine.get('git_commit', '?')}"
        + (" (dirty: uncommitted changes to tracked files)" if machine.get("git_dirty") else "") + " |",
        f"| Rounds | {meta.get('rounds')} per phase, configurations interleaved (order rotated each round); "
        "every server restarted each round"
        + ("; main phase paired: each round's servers run side by side (one loaded at a time) and each "
           "scenario is measured on every configuration back to back" if meta.get("order") == "paired" else "")
        + " |",
        f"| Windows | {meta.get('duration_s'):g} s measured (longer where a scenario says so); every fresh .NET server primed for "
        f"{meta.get('warmup_first_s'):g} s on its scenarios in turn (so the JIT's tiers settle), then "
        f"{meta.get('warmup_s'):g} s of warm-up on each scenario right before its window"
        + remeasured_text(meta, data["measurements"]) + " |",
        f"| Pinning | server (and proxy) on CPU {meta.get('server_cpus')}, load generator on CPU "
        f"{meta.get('client_cpus')} (wrk -t{meta.get('wrk_threads')}, loadgen); the ThreadCount sweep is unpinned |",
        f"| Run time | {elapsed // 60} min {elapsed % 60} s (planned estimate {meta.get('estimated_s', 0) // 60} min) |"
        if elapsed is not None else "| Run time | – |",
        "",
        "## Machine", "",
        "| nproc | CPU | Kernel | .NET SDK | ASP.NET Core runtime | wrk | nginx | Caddy | gcc |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {machine.get('nproc')} | {machine.get('cpu_model')} | {machine.get('kernel_full')} | "
        f"{machine.get('dotnet_sdk')} | {machine.get('aspnetcore_runtime')} | {machine.get('wrk')} | "
        f"{machine.get('nginx')} | {machine.get('caddy')} | {machine.get('gcc')} |", ""]

    configs = {c["name"]: c for c in data["configs"]}
    libuv = configs.get("libuv")
    lines += ["### The libuv comparator", ""]
    libuv_ran = any(m["config"] == "libuv" for m in data["measurements"])
    if libuv and (libuv.get("startup_line") or libuv_ran):
        version = meta.get("libuv") or "not printed by the sample"
        what = ("benchmarks/LibuvComparator, a libuv transport for Kestrel rebuilt on the system's libuv1 "
                "(Microsoft's Kestrel libuv transport ended with ASP.NET Core 6.0)"
                if (REPO / "benchmarks" / "LibuvComparator").is_dir() else "the sample's libuv transport")
        source = (f", with libuv {version} (from its startup line: `{libuv['startup_line']}`)"
                  if libuv.get("startup_line") else "; its startup line is recorded by the main phase only")
        lines += [f"The `libuv` rows ran {what}{source}. System package libuv1: "
                  f"{machine.get('libuv1_package')}.", ""]
    elif libuv:
        why = reasons_for(data["events"], "main", "libuv", None, "middleware") or "it did not run"
        lines += [f"The libuv transport did not run in this run ({why}); system package libuv1: "
                  f"{machine.get('libuv1_package')}.", ""]
    else:
        lines += ["No libuv configuration was selected.", ""]

    lines += targets_section(data)

    lines += ["## Configurations", "",
              "| Configuration | Server command | Environment | Startup line |", "|---|---|---|---|"]
    ran_main = any(m["phase"] == "main" for m in data["measurements"])
    for c in data["configs"]:
        env = " ".join(f"`{k}={v}`" for k, v in c["env"].items()) or "–"
        command = f"`{c['command']}`" if c.get("command") else (
            f"`{c['line']}`" + (" (did not start)" if ran_main else " (no main phase in this run)"))
        startup = f"`{c['startup_line']}`" if c.get("startup_line") else "–"
        lines.append(f"| {c['name']} | {command} | {env} | {startup} |")
    if meta.get("stripped_env"):
        lines += ["", "Removed from the servers' environment (inherited from the caller): "
                  + ", ".join(f"`{k}`" for k in meta["stripped_env"]) + "."]
    lines += ["", "## How to read the tables", "",
              f"- **Median req/s** over the rounds; **min–max** shows the spread. **vs {meta.get('baseline')}** "
              f"divides this row's median by {meta.get('baseline')}'s median (above 1 is faster).",
              "- **CPU µs/req**: the server process's CPU time (user + system, all threads, from /proc/PID/stat) "
              "during the measured window divided by the requests answered in it (lower is better; for its "
              "ratio, below 1 is cheaper). On a pinned single CPU this is the truest efficiency figure: "
              "req/s can be capped by the load generator, CPU per request cannot.",
              "- **Server CPU**: the server's CPU time as a share of its pinned CPUs; **wrk CPU**: the load "
              "generator's share of its CPUs (² marks ≥ 95%: the client may be the bottleneck). **Other load**: "
              "CPU time that other processes took on the benchmark's CPUs during the window (from /proc/stat), as "
              "a share of those CPUs; this machine is shared, and a high value means the row is noisy.",
              "- **Switches/req** and **Syscalls/req** (only with `--perf-stat`): the server's context switches "
              "and system calls in the window (`perf stat -p`), per request answered: what each hand-off between "
              "threads and each wake-up costs, counted rather than inferred.",
              "- **Errors**: wrk's socket errors (connect, read, write, timeout > 2 s) and non-2xx answers "
              "(status), summed over rounds; any error is flagged ⚠.",
              "- **ceiling**: a minimal raw C epoll server (benchmarks/ceiling) serving the same answers; the "
              "distance from it is what the .NET stack and transport cost on this machine.", ""]
    lines += events_section(data)

    lines += ["## Scenarios", ""]
    for s in meta.get("scenarios", []):
        headers = f" -H '{s['headers'][0]}'" if s["headers"] else ""
        pipe = f", {s['depth']} pipelined per write (benchmarks/lib/pipeline.lua)" if s["depth"] > 1 else ""
        window = ""
        if s.get("min_window_s", 0) > (meta.get("duration_s") or 0):
            window += f"; {s['min_window_s']} s measured windows"
        if s.get("timeout_s", 2) != 2:
            window += f"; wrk --timeout {s['timeout_s']}s"
        lines += [f"### {s['name']}: {s['title']}", "",
                  f"`GET {s['path']}`, {s['connections']} connections{pipe}{headers}; sample mode {s['mode']}{window}.", ""]
        lines += scenario_table(data, s)
    lines += latency_section(data)
    lines += fixed_section(data)
    lines += mixed_section(data)
    lines += blocking_section(data)
    lines += protocols_section(data)
    lines += issue32_targets(data)
    lines += hosting_section(data)
    lines += sweep_section(data)
    lines += ["## Charts", ""]
    if chart_note:
        lines += [chart_note, ""]
    for filename, title in charts:
        lines += [f"![{title}]({filename})", ""]
    lines += ["## Files", "",
              "- `results.json`: every round's measurement, every skip and failure, and this page's metadata.",
              "- `results.csv`: one row per measurement (the same data, flat).",
              "- `logs/`: each server's and proxy's output, and the proxy configurations used.", ""]
    (out / "report.md").write_text("\n".join(lines))


def generate(out: Path) -> None:
    data = json.loads((out / "results.json").read_text())
    write_csv(out, data)
    charts, note = make_charts(out, data)
    write_markdown(out, data, charts, note)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    generate(Path(sys.argv[1]))
