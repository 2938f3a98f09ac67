"""Writes report.md, results.csv and the PNG charts from a compare.sh results.json.

compare.py calls generate() at the end of a run; it can also be re-run on a finished run:
    python3 benchmarks/lib/report.py artifacts/benchmarks/<timestamp>

The charts need matplotlib (Debian's python3-matplotlib, for /usr/bin/python3); without it the
report says so and is otherwise complete.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.dont_write_bytecode = True   # run by hand too: no __pycache__ in the source tree
from report_charts import make_charts  # noqa: E402
from report_common import median, reasons_for, runtime_label  # noqa: E402
from report_openloop import (blocking_section, fixed_section, issue32_targets, latency_section,  # noqa: E402
                             mixed_section, protocols_section)
from report_saturated import hosting_section, scenario_table, sweep_section, targets_section  # noqa: E402
from report_tls import tls_section  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUSY_MACHINE = 0.10         # median "other load" above this earns a warning at the top of the report


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
    # With --runtimes the row is libuv@10, libuv@11...: the first of them.
    libuv = configs.get("libuv") or next((c for c in data["configs"] if c.get("origin") == "libuv"), None)
    lines += ["### The libuv comparator", ""]
    libuv_ran = libuv is not None and any(m["config"] == libuv["name"] for m in data["measurements"])
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
        why = reasons_for(data["events"], "main", libuv["name"], None, "middleware") or "it did not run"
        lines += [f"The libuv transport did not run in this run ({why}); system package libuv1: "
                  f"{machine.get('libuv1_package')}.", ""]
    else:
        lines += ["No libuv configuration was selected.", ""]

    lines += targets_section(data)

    lines += ["## Configurations", "",
              "| Configuration | Runtime | Server command | Environment | Startup line |", "|---|---|---|---|---|"]
    ran_main = any(m["phase"] == "main" for m in data["measurements"])
    for c in data["configs"]:
        env = " ".join(f"`{k}={v}`" for k, v in c["env"].items()) or "–"
        command = f"`{c['command']}`" if c.get("command") else (
            f"`{c['line']}`" + (" (did not start)" if ran_main else " (no main phase in this run)"))
        startup = f"`{c['startup_line']}`" if c.get("startup_line") else "–"
        lines.append(f"| {c['name']} | {runtime_label(c)} | {command} | {env} | {startup} |")
    lines += ["", "*Runtime*: the shared framework the configuration's servers ran on, read from the Kestrel.Core "
              "assembly each one had mapped (`/proc/PID/maps`) once it answered; a server on another runtime than "
              "its configuration asked for (`@runtime=`, `--runtimes`) failed to start."
              + "".join(f" .NET {r} came from `{root}` (`DOTNET_ROLL_FORWARD=LatestMajor`)."
                        for r, root in (meta.get("dotnet_roots") or {}).items())]
    if meta.get("stripped_env"):
        lines += ["", "Removed from the servers' environment (inherited from the caller): "
                  + ", ".join(f"`{k}`" for k in meta["stripped_env"]) + "."]
    lines += ["", "## How to read the tables", "",
              f"- **Median req/s** over the rounds; **min–max** shows the spread. **vs {meta.get('baseline')}** "
              f"divides this row's median by {meta.get('baseline')}'s median (above 1 is faster)"
              + (f"; with `--runtimes`, by {meta.get('baseline')}'s on the same runtime (linux@11 by "
                 f"{meta.get('baseline')}@11)." if meta.get("runtimes") else "."),
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
    lines += tls_section(data)
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
