"""The benchmark runner behind benchmarks/compare.sh (which builds everything, then runs this).

It measures server configurations side by side on a shared, noisy machine, so:
  - every configuration runs as its own process, alone on the server CPUs, and is restarted for
    every round;
  - configurations are interleaved round by round (the order rotates each round), and the report
    gives medians and min-max over rounds, never a single run;
  - every server's answers are verified before any load is put on it;
  - next to requests/s it records the server's CPU time per request, read from /proc.

Phases (each its own interleaved rounds):
  main     wrk scenarios against every configuration, pinned (server CPUs vs load CPUs) (saturated.py);
  latency  open-loop latency with benchmarks/loadgen at a fixed rate (latency.py);
  hosting  Kestrel direct, behind nginx (TCP and Unix-socket upstream) and behind Caddy (hosting.py);
  sweep    ThreadCount 1/2/4, unpinned (saturated.py);
  fixed, mixed, blocking  below saturation, open loop (openloop.py): CPU and latency at fixed fractions
           of the baseline's rate (also over HTTPS, and for a handler that awaits a downstream call); small
           requests beside bulk downloads on one loop; bystanders of a handler that blocks its thread.
  protocols  HTTP/2 with prior knowledge (h2load: JSON and a gRPC unary call) and WebSocket echo
           (benchmarks/wsload), closed loop at saturation (protocols.py).
  tls      HTTPS at saturation: keep-alive, a full handshake per request, HTTP/2 over TLS (tls.py).

The phases share model.py (configurations, scenarios) and runner.py (the Runner: starting, verifying, priming and
measuring servers); none imports compare.py. Results go to --out: results.json (every measurement), then report.py
writes report.md, results.csv and the charts.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.dont_write_bytecode = True   # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hosting  # noqa: E402
import latency  # noqa: E402
import openloop  # noqa: E402
import protocols  # noqa: E402
import report  # noqa: E402
import saturated  # noqa: E402
import tls  # noqa: E402
from model import (BIN, LIB, ROOT, RUNTIME_LAYOUTS, SAMPLE_DLL, Config, Interrupted, Scenario, load_configs,  # noqa: E402
                   parse_config_line)
from procs import CLK_TCK, Proc, cpu_count, run_capture  # noqa: E402
from runner import DISTURBED_OTHER_LOAD, Runner  # noqa: E402

ERROR_TOLERANCE = 0.001            # --quick fails when errors exceed 0.1% of a measurement's requests


# ---- machine description --------------------------------------------------------------------

def machine_info() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    runtimes = run_capture(["dotnet", "--list-runtimes"])
    aspnet = [l.split()[1] for l in runtimes.splitlines() if l.startswith("Microsoft.AspNetCore.App 10.")]
    nginx = run_capture(["nginx", "-v"]) if shutil.which("nginx") else "not installed"
    caddy = run_capture(["caddy", "version"]) if shutil.which("caddy") else "not installed"
    wrk = run_capture(["wrk", "-v"]).splitlines()
    libuv_pkg = run_capture(["dpkg-query", "-W", "-f=${Version}", "libuv1"])
    git_head = run_capture(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    porcelain = run_capture(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    return {
        "nproc": os.cpu_count(), "cpu_model": model, "kernel": " ".join(platform.uname()[2:5:2]),
        "kernel_full": run_capture(["uname", "-srvm"]),
        "dotnet_sdk": run_capture(["dotnet", "--version"]),
        "aspnetcore_runtime": max(aspnet, key=lambda v: [int(x) if x.isdigit() else 0 for x in re.split(r"[.-]", v)])
        if aspnet else "unknown",
        "wrk": wrk[0].split(" Copyright")[0] if wrk else "unknown", "nginx": nginx.replace("nginx version: ", ""),
        "caddy": caddy.split()[0] if caddy else "unknown",
        "gcc": run_capture(["gcc", "-dumpfullversion"]),
        "libuv1_package": libuv_pkg if libuv_pkg and "no packages" not in libuv_pkg else "not installed",
        "git_commit": git_head, "git_dirty": bool(porcelain.strip()) and not porcelain.startswith("unavailable"),
        "python": sys.version.split()[0],
    }


# ---- entry point ----------------------------------------------------------------------------

# Each phase, in its module, runs its rounds on the Runner.
PHASES = {"main": saturated.phase_main, "latency": latency.phase_latency, "hosting": hosting.phase_hosting,
          "sweep": saturated.phase_sweep, "fixed": openloop.phase_fixed, "mixed": openloop.phase_mixed,
          "blocking": openloop.phase_blocking, "protocols": protocols.phase_protocols, "tls": tls.phase_tls}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/compare.sh",
        description="Compare server configurations side by side: interleaved rounds, medians, CPU per request.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="main scenarios (--scenarios; * = also in --quick):\n" + "\n".join(
            f"  {s.name:27}{'*' if s in saturated.main_scenarios(quick=True) else ' '} {s.title}"
            for s in saturated.main_scenarios(quick=False)))
    p.add_argument("--quick", action="store_true",
                   help="a few minutes: 2 rounds, short windows, a subset of scenarios (for CI: correctness only)")
    p.add_argument("--out", help="output directory (default artifacts/benchmarks/<timestamp>)")
    p.add_argument("--rounds", type=int, help="rounds per phase (default 5, --quick 2)")
    p.add_argument("--duration", type=int, help="measured window in whole seconds, as wrk takes them (default 3, --quick 2)")
    p.add_argument("--warmup", type=int, help="warm-up right before each measured window, on the scenario "
                   "measured (whole seconds; default 2 s, --quick 1)")
    p.add_argument("--warmup-first", type=int, help="priming of a fresh .NET server: every scenario it will be "
                   "measured on, in turn, until the JIT's tiers settle (seconds; default 30 s, --quick 1; "
                   "the native ceiling is not primed)")
    p.add_argument("--latency-duration", type=float, help="open-loop measured window (default 4 s, --quick 2)")
    p.add_argument("--latency-warmup", type=float, help="open-loop warm-up at the same rate before the measured window "
                   "(default 15 s, --quick 1): a pattern the closed-loop priming did not run still has methods to "
                   "tier up, and with 1 s the JIT's background compiles made the p99 "
                   "(docs/benchmarks/traces/latency-json-256.md)")
    p.add_argument("--latency-rate", type=float, help="open-loop rate in req/s (default: a sixth of the baseline's "
                   "median json-256 throughput; --quick 2000)")
    p.add_argument("--fixed-fractions", help="fixed phase: rates as fractions of the baseline's saturated rate on "
                   "each scenario (default 0.05,0.25,0.6; --quick 0.25)")
    p.add_argument("--fixed-base-rate", action="append", default=[], metavar="SCENARIO=N",
                   help="fixed phase: a scenario's saturated rate in req/s, instead of measuring the baseline with wrk "
                   "at the start of the phase (repeatable)")
    p.add_argument("--fixed-scenarios", help="fixed phase: any of json-64, json-object-64, https-json-64 (loadgen over "
                   "TLS) and await-64 (the sample's /await, its downstream the C server on the client CPUs) (default "
                   "json-64,json-object-64; --quick json-64)")
    p.add_argument("--fixed-duration", type=float, help="fixed phase: measured window (default 8 s, --quick 2)")
    p.add_argument("--fixed-warmup", type=float, help="fixed phase: loadgen's warm-up at the window's own rate before "
                   "each window (default 10 s, --quick 1); the first window of a scenario on a fresh server also gets "
                   "--warmup-first")
    p.add_argument("--mixed-rate", type=float, help="mixed phase: the small requests' fixed rate (default 500/s)")
    p.add_argument("--mixed-duration", type=float, help="mixed phase: measured window (default 10 s, --quick 2)")
    p.add_argument("--mixed-warmup", type=float, help="mixed phase: warm-up at the rate, downloads running "
                   "(default 5 s, --quick 1)")
    p.add_argument("--blocking-how", help="blocking phase: how the handler blocks, any of sleep,result,lock "
                   "(default all three; --quick sleep)")
    p.add_argument("--blocking-ms", type=int, help="blocking phase: how long the handler blocks (default 2000)")
    p.add_argument("--blocking-rate", type=float, help="blocking phase: the 8 bystanders' total fixed rate "
                   "(default 1000/s: one request a millisecond, the resolution of the worst wait)")
    p.add_argument("--blocking-warmup", type=float, help="blocking phase: the bystanders' warm-up before the block "
                   "(default 5 s, --quick 1)")
    p.add_argument("--server-cpus", default="1", help="CPUs the server (and a proxy) are pinned to (default 1)")
    p.add_argument("--client-cpus", default="0", help="CPUs wrk and loadgen are pinned to (default 0)")
    p.add_argument("--wrk-threads", type=int, help="wrk threads (default: number of client CPUs)")
    p.add_argument("--configs", help="comma-separated subset of the configurations to run")
    p.add_argument("--config-file", default=str(LIB / "configs.txt"), help="configuration table")
    p.add_argument("--add-config", action="append", default=[], metavar="LINE",
                   help="one more configuration, in configs.txt's line format (repeatable)")
    p.add_argument("--baseline", default="sockets", help="configuration the ratios are relative to")
    p.add_argument("--phases", default="main,latency,hosting,sweep",
                   help=f"phases to run, comma-separated, of {','.join(PHASES)} (default main,latency,hosting,sweep)")
    p.add_argument("--scenarios", help="comma-separated subset of the scenarios of the main, protocols and tls phases: "
                   "each of those phases runs the ones named of its own")
    p.add_argument("--order", choices=("blocks", "paired"), default="blocks",
                   help="main, fixed, protocols and tls phases: blocks (default) runs one server at a time through "
                        "all its scenarios; paired starts every configuration's server of a round (in tls, of a "
                        "scenario) at once (all pinned to the server CPUs, one loaded at a time) and measures each "
                        "scenario on each of them back to back, so a slow period of the machine falls on both sides "
                        "of a ratio")
    p.add_argument("--hosting", help="hosting models (default direct,nginx-tcp,nginx-unix,caddy; "
                   "--quick direct,nginx-tcp); caddy-unix is also available")
    p.add_argument("--hosting-transports", default="linux,sockets")
    p.add_argument("--sweep-transports", default="linux,sockets,libuv")
    p.add_argument("--sweep-threads", default="1,2,4")
    p.add_argument("--remeasure", type=int,
                   help="measure a window again when others took >= 10%% of the benchmark's CPUs during it, up to "
                        "this many more times, keeping the least disturbed (default 2, --quick 0)")
    p.add_argument("--perf-stat", action="store_true",
                   help="also count the server's context switches and system calls in each measured window "
                        "(`perf stat -p`; needs perf and root or kernel.perf_event_paranoid <= 0)")
    p.add_argument("--runtimes", help="run every selected .NET configuration on each of these runtimes, named NAME@R "
                   f"(of {','.join(RUNTIME_LAYOUTS)}; 11 is laid out by tests/dotnet11/layout.sh); ratios are to "
                   "--baseline on the same runtime. A configuration line can also say @runtime=R")
    p.add_argument("--no-build", action="store_true", help="skip `dotnet build` (handled by compare.sh)")
    args = p.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds or (2 if quick else 5)
    # wrk's -d takes whole seconds ("2.5s" is a usage error), so every wrk window is an integer.
    args.duration = args.duration or (2 if quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (1 if quick else 2)
    args.warmup_first = args.warmup_first if args.warmup_first is not None else (1 if quick else 30)
    args.latency_duration = args.latency_duration or (2.0 if quick else 4.0)
    args.latency_warmup = args.latency_warmup if args.latency_warmup is not None else (1.0 if quick else 15.0)
    args.remeasure = args.remeasure if args.remeasure is not None else (0 if quick else 2)
    args.wrk_threads = args.wrk_threads or cpu_count(args.client_cpus)
    args.fixed_fractions = [float(x) for x in (args.fixed_fractions or ("0.25" if quick else "0.05,0.25,0.6")).split(",")]
    args.fixed_scenarios = (args.fixed_scenarios or ("json-64" if quick else "json-64,json-object-64")).split(",")
    args.fixed_duration = args.fixed_duration or (2.0 if quick else 8.0)
    args.fixed_warmup = args.fixed_warmup if args.fixed_warmup is not None else (1.0 if quick else 10.0)
    args.mixed_rate = args.mixed_rate or 500.0
    args.mixed_duration = args.mixed_duration or (2.0 if quick else 10.0)
    args.mixed_warmup = args.mixed_warmup if args.mixed_warmup is not None else (1.0 if quick else 5.0)
    args.blocking_how = (args.blocking_how or ("sleep" if quick else "sleep,result,lock")).split(",")
    args.blocking_ms = args.blocking_ms or 2000
    args.blocking_rate = args.blocking_rate or 1000.0
    args.blocking_warmup = args.blocking_warmup if args.blocking_warmup is not None else (1.0 if quick else 5.0)
    args.phases = [x for x in args.phases.split(",") if x]
    args.runtimes = [x for x in (args.runtimes or "").split(",") if x]
    for runtime in args.runtimes:
        if runtime not in RUNTIME_LAYOUTS:
            p.error(f"--runtimes: unknown runtime {runtime!r}; known: {', '.join(RUNTIME_LAYOUTS)}")
    args.scenarios = set(args.scenarios.split(",")) if args.scenarios else None
    if args.scenarios:
        known = [s.name for s in saturated.main_scenarios(quick=False) + saturated.few_connection_scenarios()
                 + protocols.PROTOCOL_SCENARIOS + tls.TLS_SCENARIOS]
        unknown = args.scenarios - set(known)
        if unknown:
            p.error(f"unknown scenario(s) {sorted(unknown)}; known: " + ", ".join(known))
    args.hosting = (args.hosting or ("direct,nginx-tcp" if quick else "direct,nginx-tcp,nginx-unix,caddy")).split(",")
    args.hosting_transports = args.hosting_transports.split(",")
    args.sweep_transports = args.sweep_transports.split(",")
    args.sweep_threads = [int(x) for x in args.sweep_threads.split(",")]
    caller = Path(os.environ.get("COMPARE_CALLER_DIR", os.getcwd()))
    if not args.out:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        args.out = str(ROOT / "artifacts" / "benchmarks" / stamp)
    args.out = str(caller / args.out)                   # an absolute --out stays as it is
    args.config_file = str(caller / args.config_file)
    if args.latency_warmup < 0 or args.latency_duration <= 0:
        p.error("--latency-warmup must be ≥ 0 and --latency-duration > 0")
    for phase in args.phases:
        if phase not in PHASES:
            p.error(f"unknown phase {phase!r}; known: {', '.join(PHASES)}")
    if any(not 0 < f <= 1 for f in args.fixed_fractions):
        p.error("--fixed-fractions must be in (0, 1]")
    unknown = set(args.fixed_scenarios) - {s.name for s in openloop.FIXED_SCENARIOS}
    if unknown:
        p.error(f"unknown fixed scenario(s) {sorted(unknown)}; known: {', '.join(s.name for s in openloop.FIXED_SCENARIOS)}")
    rates = {}
    for item in args.fixed_base_rate:
        for pair in item.split(","):
            name, _, value = pair.partition("=")
            try:
                rates[name] = float(value)
            except ValueError:
                p.error(f"--fixed-base-rate {pair!r}: expected SCENARIO=REQUESTS_PER_SECOND")
            if name not in {s.name for s in openloop.FIXED_SCENARIOS} or rates[name] <= 0:
                p.error(f"--fixed-base-rate {pair!r}: expected one of {', '.join(s.name for s in openloop.FIXED_SCENARIOS)} "
                        "and a positive rate")
    args.fixed_base_rate = rates
    if set(args.blocking_how) - {"sleep", "result", "lock"}:
        p.error("--blocking-how takes sleep, result and lock")
    if not 1 <= args.blocking_ms <= 60000:
        p.error("--blocking-ms must be 1-60000 (the sample's limit)")
    for model in args.hosting:
        if model not in hosting.HOSTING_MODELS:
            p.error(f"unknown hosting model {model!r}; known: {', '.join(hosting.HOSTING_MODELS)}")
    return args


def estimate_seconds(args: argparse.Namespace, configs: list[Config]) -> float:
    """A plan-based estimate; start/verify/stop is ~0.7 s per server, wrk adds ~0.1 s per run."""
    start, wrk_overhead = 0.7, 0.1
    scenarios = saturated.selected_scenarios(args)

    def windows(todo: list[Scenario]) -> float:
        return sum(args.warmup + s.window_s(args.duration) + wrk_overhead for s in todo)

    per_round = 0.0
    kestrel = [c for c in configs if c.kind == "kestrel"]
    ceilings = [c for c in configs if c.kind == "ceiling"]
    if "main" in args.phases:
        for mode in ("middleware", "platform"):
            todo = [s for s in scenarios if s.mode == mode]
            if todo:
                per_round += len(kestrel) * (start + args.warmup_first + windows(todo))
        names = {s.name for s in scenarios}
        todo = [s for s in scenarios if s.ceiling_serves and (s.mode == "middleware" or s.twin not in names)]
        if todo:
            per_round += len(ceilings) * (start + windows(todo))
    if "latency" in args.phases:
        per_round += len(configs) * (start + args.warmup_first + args.warmup + args.latency_warmup + args.latency_duration + 0.3)
    if "hosting" in args.phases:
        n = 1 if args.quick else len(hosting.HOSTING_SCENARIOS)
        setups = len(args.hosting) * len(args.hosting_transports)
        per_round += setups * (start + 0.4 + args.warmup_first + windows(hosting.HOSTING_SCENARIOS[:n]))
    if "sweep" in args.phases:
        counts = 1 if args.quick else len(args.sweep_threads)
        per_round += len(args.sweep_transports) * counts * (start + args.warmup_first + windows([saturated.SWEEP_SCENARIO]))
    loadgen_overhead = 2.3                  # connecting, the drain and a fresh loadgen per window
    fixed = [s for s in openloop.FIXED_SCENARIOS if s.name in args.fixed_scenarios]
    calibration = 0.0
    if "fixed" in args.phases:
        for c in kestrel + ceilings:
            served = [s for s in fixed if c.kind == "kestrel" or s.ceiling_serves]
            per_round += start + len(served) * (
                (args.warmup_first if c.kind == "kestrel" else 0)
                + len(args.fixed_fractions) * (args.fixed_warmup + args.fixed_duration + loadgen_overhead))
        missing = [s for s in fixed if s.name not in args.fixed_base_rate]
        if missing:
            calibration = start + args.warmup_first + (1 if args.quick else openloop.FIXED_BASE_WINDOWS) * windows(missing)
    if "mixed" in args.phases:
        per_round += len(kestrel) * (start + args.warmup_first + openloop.MIXED_WRK_LEAD_S + args.mixed_warmup
                                     + args.mixed_duration + loadgen_overhead + 1)
    if "blocking" in args.phases:
        per_round += len(kestrel) * len(args.blocking_how) * (
            start + args.warmup_first + args.blocking_warmup + openloop.BLOCK_LEAD_S + args.blocking_ms / 1000 + openloop.BLOCK_TAIL_S
            + loadgen_overhead)
    def picked(scenarios: list[Scenario]) -> list[Scenario]:
        return [s for s in scenarios if not args.scenarios or s.name in args.scenarios]
    if "protocols" in args.phases:
        # A server per protocol and configuration (HTTP/2 only; HTTP/1.1 for the WebSocket upgrade), each primed.
        chosen = picked(protocols.PROTOCOL_SCENARIOS)
        servers = len({protocols.protocol_of(s) for s in chosen})
        per_round += len(kestrel) * (servers * (start + args.warmup_first) + windows(chosen))
    if "tls" in args.phases:
        # A fresh server per scenario, primed on it.
        per_round += len(kestrel) * sum(start + args.warmup_first + windows([s]) for s in picked(tls.TLS_SCENARIOS))
    return per_round * args.rounds + calibration


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    configs = table = load_configs(Path(args.config_file), args.add_config)
    if args.configs:
        # --add-config rows were asked for by name already: --configs selects among the table's rows.
        wanted = args.configs.split(",") + [c.name for c in (parse_config_line(l) for l in args.add_config) if c]
        unknown = [w for w in wanted if w not in {c.name for c in configs}]
        if unknown:
            raise SystemExit(f"compare: unknown configuration(s) {unknown}")
        configs = [c for c in configs if c.name in wanted]
    if args.runtimes:
        configs, table = with_runtimes(configs, args.runtimes), with_runtimes(table, args.runtimes)
    for tool in ("wrk", "taskset", "dotnet") + (("perf",) if args.perf_stat else ()):
        if not shutil.which(tool):
            raise SystemExit(f"compare: {tool} is not installed (see .ci/run for the packages)")
    for binary in (BIN / "ceiling", BIN / "loadgen", BIN / "wsload", SAMPLE_DLL):
        if not binary.exists():
            raise SystemExit(f"compare: {binary} is missing; run benchmarks/compare.sh, which builds it")
    for config in configs:
        if config.sample and not config.sample.is_file():
            raise SystemExit(f"compare: configuration {config.name}: @sample={config.sample} does not exist "
                             "(build that tree's samples/TechEmpower in Release first)")

    roots = lay_out_runtimes(configs)
    runner = Runner(args, configs, table, roots)

    def on_signal(signum, _frame):
        runner.interrupted = True
        raise Interrupted()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    estimate = estimate_seconds(args, configs)
    runner.meta = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": shlex.join([os.environ.get("COMPARE_INVOCATION", "benchmarks/lib/compare.py")] + argv),
        "quick": args.quick, "rounds": args.rounds, "duration_s": args.duration, "warmup_s": args.warmup,
        "remeasure": args.remeasure, "disturbed_other_load": DISTURBED_OTHER_LOAD,
        "warmup_first_s": args.warmup_first, "server_cpus": args.server_cpus, "client_cpus": args.client_cpus,
        "wrk_threads": args.wrk_threads, "baseline": args.baseline, "phases": args.phases,
        "estimated_s": round(estimate), "error_tolerance": ERROR_TOLERANCE,
        "stripped_env": runner.stripped_env, "machine": machine_info(),
        "clk_tck": CLK_TCK, "runtimes": args.runtimes, "dotnet_roots": {k: str(v) for k, v in roots.items()},
    }
    print(f"compare: {len(configs)} configurations, {args.rounds} rounds, phases {','.join(args.phases)}; "
          f"estimated {estimate / 60:.1f} min; output {args.out}", flush=True)
    status = 0
    try:
        for phase in args.phases:
            try:
                PHASES[phase](runner)
            except (Interrupted, KeyboardInterrupt):
                raise
            except Exception as exc:  # a bug in one phase must not lose the others' results
                traceback.print_exc()
                Proc.stop_all()
                runner.event(phase, "*", "failed", f"the {phase} phase crashed: {exc!r}")
    except Interrupted:
        runner.meta["interrupted"] = True
        print("compare: interrupted; writing a partial report", file=sys.stderr)
        status = 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        Proc.stop_all()
        shutil.rmtree(runner.tmp, ignore_errors=True)
        runner.meta["elapsed_s"] = round(time.monotonic() - runner.started)
        libuv = next((c.name for c in configs if c.origin == "libuv"), "libuv")
        runner.meta["libuv"] = libuv_version(runner.startup_lines.get(libuv, ""))
        runner.save()

    report.generate(Path(args.out))
    print(f"compare: report at {Path(args.out) / 'report.md'}", flush=True)

    if args.quick and status == 0:
        problems = quick_problems(runner, Path(args.out))
        for problem in problems:
            print(f"compare: --quick check failed: {problem}", file=sys.stderr)
        if problems:
            status = 1
    return status


def with_runtimes(configs: list[Config], runtimes: list[str]) -> list[Config]:
    """--runtimes: every .NET row without a runtime of its own once per runtime (linux@10, linux@11, ...); the C
    ceiling, which is not .NET, and rows with their own @runtime= stay as they are."""
    result = []
    for config in configs:
        if config.kind == "ceiling" or config.runtime:
            result.append(config)
        else:
            result += [config.on_runtime(r) for r in runtimes]
    return result


def lay_out_runtimes(configs: list[Config]) -> dict[str, Path]:
    """Each runtime the configurations ask for that is not the SDK's own, laid out (tests/dotnet11/layout.sh, which
    reuses a finished layout) as a DOTNET_ROOT."""
    roots = {}
    for runtime in sorted({c.runtime for c in configs if c.kind == "kestrel" and c.runtime}):
        script = RUNTIME_LAYOUTS[runtime]
        if script is None:
            continue
        print(f"compare: laying out .NET {runtime} ({script.relative_to(ROOT)})", flush=True)
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=1800)
        root = Path(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else None
        if root is None or not (root / "dotnet").is_file():
            raise SystemExit(f"compare: {script.relative_to(ROOT)} failed (exit {done.returncode}): "
                             f"{done.stderr.strip()[-500:]}")
        roots[runtime] = root
    return roots


def libuv_version(startup_line: str) -> str:
    match = re.search(r"libuv[-_ ]?(?:version)?[=: ]v?(\d+\.\d+(?:\.\d+)?)", startup_line, re.IGNORECASE)
    return match.group(1) if match else ""


STARVED_OTHER_LOAD = 0.5   # --quick: a window whose CPUs others took this much of proves nothing


def quick_problems(runner: Runner, out: Path) -> list[str]:
    """What CI asserts: servers verified, no errors beyond tolerance, report files written."""
    problems = []
    for e in runner.events:
        if e["state"] == "failed":
            problems.append(f"{e['phase']} {e['config']} {e['scenario']}: {e['reason']}")
    def cell(m: dict) -> tuple:
        return m["phase"], m["config"], m["scenario"], m.get("hosting"), m.get("threads")

    answered = {cell(m) for m in runner.measurements if m["requests"] > 0}
    for m in runner.measurements:
        # A window with no answer at all and no error is a starved one (on a busy shared machine every
        # request of a 2 s window can still be in flight when wrk stops): it fails the check only when
        # no other round of the same cell got an answer either. Errors always count.
        starved = m["requests"] == 0 and m["error_total"] == 0 and cell(m) in answered
        # A window in which other processes or the hypervisor took at least half the benchmark's CPUs
        # cannot judge a server by timeouts or silence either; wrong answers (status, parse, short) still fail.
        wrong = sum(m["errors"].get(k, 0) for k in ("status", "parse", "short"))
        taken = (m.get("other_cpu_util") or 0) >= STARVED_OTHER_LOAD and wrong == 0
        fails = m["error_rate"] > ERROR_TOLERANCE or m["requests"] == 0
        if fails and (starved or taken):
            print(f"compare: note: {m['phase']} {m['config']} {m['scenario']} round {m['round']}: "
                  f"{m['requests']} answers, {m['error_total']} timeouts or resets in its window with "
                  f"{m.get('other_cpu_util') or 0:.0%} of the CPUs taken by others; not counted", file=sys.stderr)
        elif fails:
            problems.append(f"{m['phase']} {m['config']} {m['scenario']} round {m['round']}: "
                            f"{m['error_total']} errors in {m['requests']} requests {m['errors']}")
    if not runner.measurements:
        problems.append("nothing was measured")
    for name in ("report.md", "results.json", "results.csv"):
        if not (out / name).is_file() or (out / name).stat().st_size == 0:
            problems.append(f"{name} was not written")
    return problems


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
