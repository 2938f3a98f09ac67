"""report.py's sections for the phases at saturation with wrk: each main scenario's table, the project's targets, the
hosting models and the ThreadCount sweep.
"""

from __future__ import annotations

from report_common import (BULK_RESPONSE_BYTES, LOAD_BOUND_UTIL, Summary, fmt_count, fmt_int, fmt_pct, fmt_ratio,
                           fmt_us, fmt_latency, median, peer, ratio, reasons_for, rt_cell, rt_head, rt_sep, select)


def scenario_table(data: dict, scenario: dict) -> list[str]:
    measurements = data["measurements"]
    baseline = data["meta"].get("baseline", "sockets")
    counted = any(m.get("switches_per_request") is not None for m in measurements)  # --perf-stat
    # Large responses (the download scenarios) also show what wrk received, in MiB/s.
    bulk = any(m.get("mib_per_s") is not None and m["requests"] and m["bytes"] >= m["requests"] * BULK_RESPONSE_BYTES
               for m in select(measurements, phase="main", scenario=scenario["name"]))
    lines = ["| Configuration |" + rt_head(data) + " Median req/s | Min–max req/s | vs " + baseline + (" | MiB/s" if bulk else "")
             + " | CPU µs/req | vs " + baseline
             + " | Server CPU | wrk CPU | Other load" + (" | Switches/req | Syscalls/req" if counted else "")
             + " | Rounds | Errors |",
             "|---|" + rt_sep(data) + "---:|---:|---:|" + ("---:|" if bulk else "") + "---:|---:|---:|---:|---:|"
             + ("---:|---:|" if counted else "") + "---:|---|"]
    summaries = {}
    for c in data["configs"]:
        name = c["name"]
        source = scenario["name"]
        if c["kind"] == "ceiling" and scenario["twin"] and not select(measurements, phase="main",
                                                                       scenario=source, config=name):
            source = scenario["twin"]
        summaries[name] = (Summary(select(measurements, phase="main", scenario=source, config=name)), source)
    notes = []
    for c in data["configs"]:
        name = c["name"]
        sm, source = summaries[name]
        base = summaries.get(peer(data, name, baseline), (None,))[0]
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
            lines.append(f"| {label} |{rt_cell(data, name)} – | – | – | " + ("– | " if bulk else "") + "– | – | – | – | – | "
                         + ("– | – | " if counted else "") + f"0 | {why} |")
            continue
        load = fmt_pct(sm.load_util) + (" ²" if sm.load_util is not None and sm.load_util >= LOAD_BOUND_UTIL else "")
        rps_ratio = ratio(sm.rps, base.rps if base and base.n else None)
        cpu_ratio = ratio(sm.cpu, base.cpu if base and base.n else None)
        extra = reasons_for(data["events"], "main", name, scenario["name"],
                            scenario["mode"] if c["kind"] != "ceiling" else None)
        errors = sm.errors_text() + (f"; {extra}" if extra else "")
        lines.append(f"| {label} |{rt_cell(data, name)} {fmt_int(sm.rps)} | {fmt_int(sm.rps_min)}–{fmt_int(sm.rps_max)} | "
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
                  "| Hosting | Transport |" + rt_head(data) + " Median req/s | Min–max req/s | vs direct | CPU µs/req (proxy) | "
                  "Other load | Rounds | Errors |", "|---|---|" + rt_sep(data) + "---:|---:|---:|---:|---:|---:|---|"]
        for model in hosting["models"]:
            for t in hosting["transports"]:
                sm = Summary(select(rows, scenario=s["name"], config=t, hosting=model))
                if not sm.n:
                    why = reasons_for(data["events"], "hosting", t, model, None) or "not measured"
                    lines.append(f"| {model} | {t} |{rt_cell(data, t)} – | – | – | – | – | 0 | {why} |")
                    continue
                direct = Summary(select(rows, scenario=s["name"], config=t, hosting="direct"))
                vs = ratio(sm.rps, direct.rps if direct.n else None) if model != "direct" else None
                cpu = fmt_us(sm.cpu) + (f" ({fmt_us(sm.proxy_cpu)})" if model != "direct" else "")
                lines.append(f"| {model} | {t} |{rt_cell(data, t)} {fmt_int(sm.rps)} | {fmt_int(sm.rps_min)}–{fmt_int(sm.rps_max)} | "
                             f"{fmt_ratio(vs) if model != 'direct' else '1.00×'} | {cpu} | "
                             f"{fmt_pct(sm.other_util)} | {sm.n} | "
                             f"{sm.errors_text()} |")
        lines.append("")
    return lines


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
             "| Transport |" + rt_head(data) + " " + " | ".join(f"threads={n}" for n in sweep["threads"]) + " |",
             "|---|" + rt_sep(data) + "---:|" * len(sweep["threads"])]
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
        lines.append(f"| {t} |{rt_cell(data, t)} " + " | ".join(cells) + " |")
    return lines + [""]


# The configuration that runs as the transport's defaults (Adaptive scheduling, epoll): the one the targets hold to.
DEFAULT_CONFIG = "linux-adaptive"

# The performance targets of the project (issue "Performance"), checked against this run's medians.
# Each: (label, kind, scenarios, config, other config, bound). kind "rps": config/other req/s >= bound;
# "cpu": config/other CPU us per request <= bound; "p99": config's open-loop p99 <= other's.
TARGETS = [
    ("JSON, middleware, 256 connections: server CPU per request", "cpu", ["json-256"], DEFAULT_CONFIG, "sockets", 0.75),
    ("JSON, middleware, 256 connections: requests/s", "rps", ["json-256"], DEFAULT_CONFIG, "sockets", 1.25),
    ("JSON, middleware, 256 connections: requests/s vs sockets-inline", "rps", ["json-256"], DEFAULT_CONFIG,
     "sockets-inline", 1.10),
    ("plaintext-16, middleware and platform, 256 and 1024 connections", "rps",
     ["plaintext16-256", "plaintext16-1024", "plaintext16-256-platform", "plaintext16-1024-platform"],
     DEFAULT_CONFIG, "sockets", 1.15),
    ("connection churn", "rps", ["churn-64"], DEFAULT_CONFIG, "sockets", 1.2),
    ("app scenarios (text, json-object, xml, html, MVC)", "rps",
     ["text-256", "json-object-256", "xml-256", "html-256", "api-test-256"], DEFAULT_CONFIG, "sockets", 1.05),
    ("the default never slower: every scenario", "rps", None, DEFAULT_CONFIG, "sockets", 1.0),
    ("latency: p99 at a fixed rate", "p99", None, DEFAULT_CONFIG, "sockets", 1.0),
]


def targets_section(data: dict) -> list[str]:
    """One row per target and scenario: the measured ratio beside its bound, for the default
    configuration (DEFAULT_CONFIG, Adaptive scheduling) and, for reference, `linux-inline`."""
    measurements = data["measurements"]
    names = {c["name"] for c in data["configs"]}
    if DEFAULT_CONFIG not in names or "sockets" not in names:
        return []
    if not any(m["phase"] in ("main", "latency") for m in measurements):
        return []  # e.g. a sweep-only run: no target is measured
    main_names = [s["name"] for s in data["meta"].get("scenarios", [])]
    lines = ["## Targets", "",
             "The project's performance targets against this run's medians. **Met** compares the default "
             f"configuration (`{DEFAULT_CONFIG}`: Adaptive scheduling) with the bound; the `linux-inline` column is for "
             "reference (opt-in scheduling). A ratio inside the min–max spread of its rows is not a result "
             "either way on a shared machine.", "",
             f"| Target | Scenario | Bound | {DEFAULT_CONFIG} | Met | linux-inline |", "|---|---|---:|---:|---|---:|"]

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
