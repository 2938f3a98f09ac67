#!/usr/bin/env python3
"""Soak report: reads DIR/<transport>.csv and DIR/<transport>-client.json written by the soak client,
applies the bounds, writes DIR/summary.md and DIR/soak.png, and exits 1 when a bound is broken.

    python3 benchmarks/Soak/report.py --out DIR --minutes N --transports linux sockets

The bounds are stated in benchmarks/soak.sh's header and in benchmarks/README.md ("Soak").
"""
import argparse
import csv
import json
import re
import sys
from pathlib import Path

FDS_UNDER_LOAD = 32          # last <= warm + 32
FDS_QUIET = 16               # quiet <= warm - warm connections + 16
THREADS = 8                  # last <= warm + 8
RSS_MB = 48.0                # last <= warm + max(48 MiB, 25% of warm)
RSS_FRACTION = 0.25
LIVE_HEAP_MB = 16.0          # last <= warm + 16 MiB


def load_rows(path: Path) -> list[dict]:
    rows = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            parsed = {}
            for key, value in row.items():
                if key == "phase":
                    parsed[key] = value
                else:
                    parsed[key] = float(value) if "." in value else int(value)
            rows.append(parsed)
    return rows


def server_log_failures(path: Path) -> dict[str, int]:
    """Counts the server's error-level log entries ("fail: Category[id]" or "crit: ...") by category,
    event id and message (the entry's next line)."""
    counts: dict[str, int] = {}
    if not path.exists():
        return counts
    lines = path.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(fail|crit): (\S+)", line)
        if m:
            message = lines[i + 1].strip() if i + 1 < len(lines) else ""
            message = re.sub(r'"[^"]*"', '"…"', message)[:100]
            key = f"{m.group(2)} '{message}'"
            counts[key] = counts.get(key, 0) + 1
    return counts


def check(transport: str, rows: list[dict], client: dict | None, minutes: int,
          log_failures: dict[str, int]) -> tuple[list[str], dict]:
    problems: list[str] = []
    if log_failures:
        problems.append("the server logged %d error-level entr%s (%s): a client going away is not a server error; "
                        "see the server log" % (sum(log_failures.values()), "y" if sum(log_failures.values()) == 1 else "ies",
                                                ", ".join(f"{k} {v}" for k, v in sorted(log_failures.items()))))
    figures: dict = {}
    load = [r for r in rows if r["phase"] == "load"]
    quiet = next((r for r in rows if r["phase"] == "quiet"), None)
    if client is None:
        problems.append("the client wrote no summary (it crashed or timed out)")
    if not load:
        problems.append("no sample under load after the warm-up")
        return problems, figures
    warm = next((r for r in rows if r["phase"] == "warm"), None)
    last = load[-1]
    figures.update(warm=warm, last=last, quiet=quiet)
    if warm is None:
        problems.append("no sample at the end of the warm-up: the run ended early")
        return problems, figures
    expected_last = warm["time_s"] + minutes * 60
    if last["time_s"] < expected_last:
        problems.append(f"the last sample under load is at {last['time_s']} s, not {expected_last} s")

    errors = client["errors"] if client else last["errors"]
    if errors:
        kinds = ", ".join(f"{k} {v}" for k, v in (client or {}).get("error_kinds", {}).items())
        problems.append(f"{errors} client error(s) ({kinds})")
    if client and client.get("server_gone"):
        problems.append("the server stopped answering the sampler")
    final = quiet or last
    if final["server_5xx"] or final["server_app_exceptions"]:
        problems.append(f"the server produced {final['server_5xx']} 5xx response(s) "
                        f"and {final['server_app_exceptions']} unhandled app exception(s)")

    if last["fds"] > warm["fds"] + FDS_UNDER_LOAD:
        problems.append(f"open fds grew from {warm['fds']} to {last['fds']} under load (bound +{FDS_UNDER_LOAD})")
    if last["threads"] > warm["threads"] + THREADS:
        problems.append(f"threads grew from {warm['threads']} to {last['threads']} (bound +{THREADS})")
    rss_bound = max(RSS_MB, RSS_FRACTION * warm["rss_mb"])
    if last["rss_mb"] > warm["rss_mb"] + rss_bound:
        problems.append(f"RSS grew from {warm['rss_mb']:.1f} to {last['rss_mb']:.1f} MiB (bound +{rss_bound:.1f} MiB)")
    if last["live_mb"] > warm["live_mb"] + LIVE_HEAP_MB:
        problems.append(f"the live managed heap grew from {warm['live_mb']:.1f} to {last['live_mb']:.1f} MiB "
                        f"(bound +{LIVE_HEAP_MB:.0f} MiB)")
    if quiet is None:
        problems.append("no quiet sample after the load")
    else:
        if quiet["connections"] != 0:
            problems.append(f"{quiet['connections']} connection(s) still active in Kestrel 10 s after every client "
                            "connection closed")
        quiet_bound = warm["fds"] - warm["connections"] + FDS_QUIET
        if quiet["fds"] > quiet_bound:
            problems.append(f"{quiet['fds']} fds open after the load ended (warm: {warm['fds']} fds with "
                            f"{warm['connections']} connections; bound {quiet_bound})")
    return problems, figures


def rate_series(rows: list[dict]) -> tuple[list[float], list[float]]:
    load = [r for r in rows if r["phase"] in ("idle", "warm", "load")]
    xs, ys = [], []
    for a, b in zip(load, load[1:]):
        dt = b["time_s"] - a["time_s"]
        if dt > 0:
            xs.append(b["time_s"])
            ys.append((b["requests"] - a["requests"]) / dt)
    return xs, ys


def chart(out: Path, data: dict[str, list[dict]], minutes: int) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (apt-get install python3-matplotlib): no chart"
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    panels = [
        ("RSS (MiB)", lambda r: r["rss_mb"]),
        ("live managed heap after full GC (MiB)", lambda r: r["live_mb"]),
        ("open fds", lambda r: r["fds"]),
        ("threads", lambda r: r["threads"]),
        None,
        ("errors (cumulative)", lambda r: r["errors"]),
    ]
    colors = {"linux": "tab:blue", "linux-uring": "tab:green", "sockets": "tab:orange"}
    for ax, panel in zip(axes.flat, panels):
        for transport, rows in data.items():
            color = colors.get(transport)
            if panel is None:
                xs, ys = rate_series(rows)
                ax.plot(xs, ys, marker=".", label=transport, color=color)
                ax.set_title("requests/s (completed, verified)")
                continue
            title, value = panel
            series = [r for r in rows if r["phase"] in ("idle", "warm", "load")]
            ax.plot([r["time_s"] for r in series], [value(r) for r in series], marker=".", label=transport, color=color)
            quiet = [r for r in rows if r["phase"] == "quiet"]
            if quiet:
                ax.plot([quiet[0]["time_s"]], [value(quiet[0])], marker="x", linestyle="none", color=color)
            ax.set_title(title)
            warm = [r for r in rows if r["phase"] == "warm"]
            if warm:
                ax.axvline(warm[0]["time_s"], color=color, linestyle=":", linewidth=1)
        ax.set_xlabel("time (s)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"Soak, {minutes} min per transport (dotted: end of the warm-up; x: quiet sample after the load)")
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=90)
    plt.close(fig)
    return None


def fmt(r: dict | None, key: str, spec: str = "") -> str:
    return "–" if r is None else format(r[key], spec)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--minutes", required=True, type=int)
    parser.add_argument("--transports", nargs="+", required=True)
    args = parser.parse_args()
    out: Path = args.out

    data: dict[str, list[dict]] = {}
    results = []
    failed = False
    for transport in args.transports:
        csv_path = out / f"{transport}.csv"
        rows = load_rows(csv_path) if csv_path.exists() else []
        client_path = out / f"{transport}-client.json"
        client = json.loads(client_path.read_text()) if client_path.exists() else None
        data[transport] = rows
        log_failures = server_log_failures(out / f"{transport}-server.log")
        problems, figures = check(transport, rows, client, args.minutes, log_failures)
        failed |= bool(problems)
        results.append((transport, problems, figures, client, log_failures))

    note = chart(out, {t: r for t, r in data.items() if r}, args.minutes)

    lines = [f"# Soak: {args.minutes} min per transport, after a warm-up", ""]
    lines.append("**" + ("FAILED" if failed else "PASSED") + "**" + " — " + ", ".join(
        f"{t}: {'failed' if p else 'passed'}" for t, p, *_ in results))
    lines += ["", "Load: 32 keep-alive connections (GET /plaintext; 15% small POST /echo), 4 churn workers (a "
              "connection per request), 2 large-body workers (upload, download, full-duplex echo of 1-8 MiB, "
              "SHA-256 checked), RST aborts and bad input (one worker each, 10 ms apart). Server pinned to CPU 1, client to CPU 0. "
              "Samples every 10 s.", ""]
    lines += ["Warm-up, not measured: the same load until 20,000 requests and 2 GiB of bodies are done (60 s at most); "
              "RSS climbs until then while pools, pipe buffers and GC budgets fill up.", "",
              "Bounds (warm = the sample at the end of the warm-up, last = last sample under load, quiet = after "
              "the load stopped):", "",
              "- errors: 0 client errors (unexpected status, checksum mismatch, timeout, connection failure, failed "
              "sample); 0 server 5xx and unhandled app exceptions; 0 error-level (fail/crit) entries in the server log",
              f"- fds: last <= warm + {FDS_UNDER_LOAD}; quiet <= warm - warm connections + {FDS_QUIET}; "
              "Kestrel's active connections 0 when quiet",
              f"- threads: last <= warm + {THREADS}",
              f"- RSS: last <= warm + max({RSS_MB:.0f} MiB, {RSS_FRACTION:.0%} of warm)",
              f"- live managed heap (after a full GC): last <= warm + {LIVE_HEAP_MB:.0f} MiB", ""]
    header = ("| transport | sample | time s | RSS MiB | live heap MiB | fds | connections | threads | gc0 / gc1 / gc2 "
              "(induced) | requests | expected | errors | bodies MiB | server 5xx |")
    lines += [header, "|" + "|".join(["---"] * (header.count("|") - 1)) + "|"]
    for transport, problems, figures, client, _ in results:
        for name in ("warm", "last", "quiet"):
            r = figures.get(name)
            if r is None:
                continue
            lines.append(f"| {transport} | {name} | {r['time_s']} | {r['rss_mb']:.1f} | {r['live_mb']:.1f} | {r['fds']} | "
                         f"{r['connections']} | {r['threads']} | {r['gc0']} / {r['gc1']} / {r['gc2']} ({r['induced_gc']}) | "
                         f"{r['requests']} | {r['expected']} | {r['errors']} | {r['body_mb']:.0f} | {r['server_5xx']} |")
    lines.append("")
    for transport, problems, figures, client, log_failures in results:
        lines.append(f"## {transport}: {'FAILED' if problems else 'passed'}")
        lines.append("")
        for p in problems:
            lines.append(f"- **{p}**")
        if client and "warmup_s" in client:
            lines.append(f"- warm-up: {client['warmup_s']} s" + ("" if client.get("warmup_reached") else
                         ", stopped at its 60 s limit before 20,000 requests and 2 GiB of bodies were done (a slow machine)"))
        if client:
            lines.append(f"- client: {client['requests']} requests, {client['errors']} errors, "
                         f"{client['expected']} expected aborts/closes, {client['body_mb']} MiB of bodies verified")
            lines.append("- completed: " + ", ".join(f"{k} {v}" for k, v in client.get("ok_kinds", {}).items()))
            lines.append("- expected: " + ", ".join(f"{k} {v}" for k, v in client.get("expected_kinds", {}).items()))
            latency = client.get("latency_us")
            if latency:
                # Not a bound: a closed-loop client sharing one CPU measures its own queueing as much as the server.
                lines.append("- latency in µs over the measured window, p50 / p99 / p99.9 / max (requests): " + ", ".join(
                    f"{k} {v['p50']} / {v['p99']} / {v['p99_9']} / {v['max']} ({v['count']})" for k, v in latency.items()))
            for e in client.get("first_errors", [])[:10]:
                lines.append(f"- error: `{e}`")
        last = figures.get("last") or figures.get("quiet")
        if last:
            lines.append(f"- server: {last['server_requests']} requests seen by the app, {last['server_aborted']} "
                         "aborted by the client (reset mid-request/response)")
        if log_failures:
            lines.append(f"- server error-level log entries (see `{transport}-server.log`): " + ", ".join(
                f"`{k}` {v}" for k, v in sorted(log_failures.items())))
        else:
            lines.append("- server error-level log entries: none")
        lines.append("")
    lines.append("Files: " + ", ".join(f"`{t}.csv`, `{t}-client.json`, `{t}-server.log`" for t in args.transports)
                 + (", `soak.png`" if note is None else f". {note}"))
    (out / "summary.md").write_text("\n".join(lines) + "\n")

    for transport, problems, *_ in results:
        for p in problems:
            print(f"soak: FAIL: {transport}: {p}", file=sys.stderr)
    if note:
        print(f"soak: warning: {note}", file=sys.stderr)
    print(f"soak: report in {out / 'summary.md'}")
    if failed:
        print("soak: FAILED (bounds in benchmarks/soak.sh and " + str(out / "summary.md") + ")", file=sys.stderr)
        return 1
    print("soak: passed: no errors, no growth beyond the bounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
