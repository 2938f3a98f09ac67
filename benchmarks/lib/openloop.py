"""compare.py's open-loop phases: what a server costs and how it answers below saturation (issue 32).

  fixed     benchmarks/loadgen at fixed rates, fractions of the baseline's saturated rate on each scenario:
            server CPU per answered request, CPU share, p50/p99/p99.9 and loadgen's own lag;
  mixed     one event loop (--threads 1): 16 connections download 8 MiB responses (wrk) while 16 others
            send small requests at a fixed rate (loadgen): the small requests' latency, the bulk MiB/s;
  blocking  one event loop on one CPU: a handler blocks its thread for 2 s (the sample's /block) while 8
            keep-alive bystanders send small requests at a fixed rate: the worst wait of a bystander
            request sent while the handler was blocked.

Every phase runs interleaved rounds of fresh servers, as compare.py's others do; report.py turns the
records into tables of medians, min-max and per-round ratios to the baseline. These are functions of the
Runner (runner.py), which they drive through its methods (start, verify, prime, remeasure, record).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import verify
from model import BIN, MainServer, Scenario
from procs import STARTUP_TIMEOUT_S, Proc, free_port
from runner import Runner

FIXED_BASE_WINDOWS = 3          # wrk windows of the baseline, per scenario, whose median is the saturated rate
MIXED_WRK_LEAD_S = 0.5          # the downloads start this long before the small requests' warm-up
MIXED_WRK_NICE = 10             # the downloads' wrk runs at this nice level beside loadgen
BLOCK_LEAD_S = 0.5              # the blocking request goes out this long into loadgen's measured window
BLOCK_TAIL_S = 1.0              # and loadgen keeps measuring this long after the block should have ended
BYSTANDERS = 8                  # keep-alive bystander connections in the blocking phase (issue 32)
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Fixed rates: JSON over 64 keep-alive connections, and one MVC scenario of the same shape: /json-object is /json's
# work (an object serialized to JSON per request) behind routing, action selection and MVC's output formatter, so
# the two tables differ by what MVC costs per request.
# Issue 37 adds /json over HTTPS (keep-alive: loadgen -S, one full handshake per connection) and a handler that
# awaits one downstream HTTP call per request (the sample's /await, to the C ceiling server pinned to the client CPU,
# so that the server's CPU is the server's alone); --fixed-scenarios selects them.
FIXED_SCENARIOS = [
    Scenario("json-64", "JSON, 64 connections", "/json", 64),
    Scenario("json-object-64", "app: GET /json-object (MVC, JSON formatter), 64 connections", "/json-object", 64),
    Scenario("https-json-64", "JSON over HTTPS (HTTP/1.1), 64 keep-alive connections", "/json", 64, tls=True),
    Scenario("await-64", "GET /await: the handler awaits one HTTP call to the C ceiling server's /json and answers "
             "its body, 64 connections", "/await", 64, downstream=True),
]
# Mixed load on one loop: small requests at a fixed rate beside 8 MiB downloads (about 0.1 s each).
MIXED_SMALL = Scenario("json-16", "JSON, 16 connections", "/json", 16)
MIXED_BULK = Scenario("download8m-16", "GET 8 MiB bodies, 16 connections", "/download/8192", 16, timeout_s=10)


def pid_cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads), from /proc; 0 once it has exited."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return 0.0
    fields = data[data.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# ---- one loadgen run, its measured window marked ----------------------------------------------

@dataclass
class Window:
    """CPU and wall time between loadgen's window markers (-m)."""
    wall_s: float
    server_cpu_s: float
    load_cpu_s: float
    busy_s: float


class MarkedLoadgen:
    """benchmarks/loadgen with -m, running: at each edge of its measured window it snapshots the server's
    CPU time, the load generators' and the benchmark CPUs' busy time, so the window's CPU is exactly the
    window's (warm-up and drain left out). Use it in a `with` block: leaving it early (Ctrl-C, an error)
    stops loadgen."""

    def __init__(self, runner: Runner, argv: list[str], server: Proc, other_load_pids: tuple[int, ...] = ()) -> None:
        self.runner = runner
        self.argv = argv
        self.server = server
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.load_pids = (self.popen.pid, *other_load_pids)
        self.edges: dict[str, tuple[float, float, float, float]] = {}
        self.started = threading.Event()
        self.messages: list[str] = []
        self.reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.reader.start()

    def __enter__(self) -> "MarkedLoadgen":
        return self

    def __exit__(self, *_exc) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def _snapshot(self) -> tuple[float, float, float, float]:
        return (time.monotonic(), self.server.cpu_seconds(), sum(pid_cpu_seconds(p) for p in self.load_pids),
                self.runner.busy_seconds())

    def _read_stderr(self) -> None:
        for line in self.popen.stderr:
            if line.startswith("loadgen: window "):
                edge = line.split()[2]
                self.edges[edge] = self._snapshot()
                if edge == "start":
                    self.started.set()
            else:
                self.messages.append(line.strip())
        self.started.set()          # loadgen ended: nobody waits for a start that will not come

    def finish(self, timeout: float) -> tuple[dict | None, Window | None, str]:
        """Waits for loadgen: (its JSON result, the window, an error message or "")."""
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            return None, None, "loadgen timed out"
        output = self.popen.stdout.read()
        self.reader.join(timeout=5)
        if self.popen.returncode != 0 or not output.strip():
            return None, None, f"loadgen failed: {' '.join(self.messages)[-300:]}"
        if "start" not in self.edges or "end" not in self.edges:
            return None, None, "loadgen did not mark its window"
        (t0, server0, load0, busy0), (t1, server1, load1, busy1) = self.edges["start"], self.edges["end"]
        return json.loads(output), Window(t1 - t0, server1 - server0, load1 - load0, busy1 - busy0), ""


def loadgen_argv(runner: Runner, port: int, path: str, connections: int, rate: float, duration: float,
                 warmup: float, drain: float = 2.0, samples: Path | None = None, tls: bool = False) -> list[str]:
    argv = ["taskset", "-c", runner.args.client_cpus, str(runner.loadgen), "-a", "127.0.0.1", "-p", str(port),
            "-P", path, "-c", str(connections), "-r", f"{rate:.0f}", "-d", f"{duration:g}", "-w", f"{warmup:g}",
            "-T", f"{drain:g}", "-m"]
    return argv + (["-s", str(samples)] if samples else []) + (["-S"] if tls else [])


def loadgen_record(runner: Runner, phase: str, scenario: str, config: str, round_no: int, path: str,
                   connections: int, result: dict, window: Window, command: str, extra: dict) -> dict:
    """One measured window, in the fields compare.py's records and report.py's Summary use."""
    errors = result["errors"]
    error_total = sum(errors.values())
    answered = result["window_completed"]
    cpus = len(runner.server_cpu_list)
    record = {
        "phase": phase, "scenario": scenario, "mode": "middleware", "config": config, "round": round_no,
        "connections": connections, "depth": 1, "path": path, "target_rate": result["target_rate"],
        "rps": result["achieved_rate"], "requests": answered, "duration_s": window.wall_s, "bytes": 0,
        "server_cpu_s": window.server_cpu_s, "proxy_cpu_s": 0.0,
        "cpu_us_per_request": window.server_cpu_s / answered * 1e6 if answered else None,
        "server_cpu_util": window.server_cpu_s / window.wall_s / cpus if window.wall_s > 0 else None,
        "load_cpu_util": window.load_cpu_s / window.wall_s if window.wall_s > 0 else None,
        "other_cpu_util": runner.other_load(window.busy_s, window.server_cpu_s + window.load_cpu_s, window.wall_s),
        "errors": errors, "error_total": error_total, "error_rate": error_total / max(1, result["recorded"]),
        "latency_us": result["latency_us"], "send_lag_us": result["send_lag_us"], "command": command,
        "hosting": "direct", "threads": None,
    }
    record.update(extra)
    return record


def log_latency(runner: Runner, config: str, what: str, record: dict, tail: str = "") -> None:
    lat = record["latency_us"]
    tail += f"  lag p99 {record['send_lag_us']['p99']:.0f} us"
    flag = f"  ERRORS {record['errors']}" if record["error_total"] else ""
    other = record.get("other_cpu_util") or 0.0
    runner.log(f"    {config:22} {what:22} p50 {lat['p50']:8.0f} us  p99 {lat['p99']:8.0f} us  "
               f"p99.9 {lat['p99.9']:8.0f} us{tail}{flag}" + (f"  (others {other:.0%})" if other >= 0.1 else ""))


def plans(runner: Runner, phase: str, scenarios: list[Scenario], complete: bool) -> list[tuple[object, list[Scenario]]]:
    """Each selected configuration with the scenarios it can serve. The C ceiling answers /plaintext and /json
    only; with `complete` a configuration runs only if it serves every scenario (they are measured together)."""
    result = []
    for config in runner.configs:
        served = [s for s in scenarios if config.kind != "ceiling" or s.ceiling_serves]
        if len(served) < len(scenarios):
            names = ", ".join(s.name for s in scenarios if s not in served)
            runner.event(phase, config.name, "unsupported", "the ceiling serves plain HTTP /plaintext and /json only", names,
                         None, "middleware")
        if served and (len(served) == len(scenarios) or not complete):
            result.append((config, served))
    return result


def fresh_server(runner: Runner, phase: str, config, scenarios: list[Scenario], round_no: int,
                 **options) -> MainServer | None:
    """A started and verified server (primed too with prime=True) with the scenarios it serves, unless earlier
    rounds found the configuration or all its paths unsupported."""
    scenarios = [s for s in scenarios if (config.name, s.path) not in runner.unsupported]
    if not scenarios or runner.skip(config, phase):
        return None
    runner.check_interrupted()
    return runner.open_server(config, "middleware", scenarios, round_no, phase=phase, **options)


# ---- fixed: fractions of the baseline's saturated rate -----------------------------------------

def flavour(scenario: Scenario) -> str:
    """The kind of server a fixed scenario needs: plain, https or await (with --downstream)."""
    return "https" if scenario.tls else "await" if scenario.downstream else "plain"


def server_options(flavour_name: str, downstream: str) -> dict:
    if flavour_name == "https":
        return {"tls": True}
    if flavour_name == "await":
        return {"extra_args": ("--downstream", downstream)}
    return {}


class Downstream:
    """The C ceiling server as the awaiting handler's downstream, pinned to the client CPUs (beside the load
    generator), so that the server under test's CPU is its own; started once for the phase."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.proc: Proc | None = None
        self.url = ""

    def start(self) -> str:
        runner = self.runner
        target = verify.Target("tcp", host="127.0.0.1", port=free_port(runner.ports))
        runner.server_count += 1
        argv = ["taskset", "-c", runner.args.client_cpus, str(BIN / "ceiling"), "-a", target.host, "-p",
                str(target.port)]
        self.proc = Proc("downstream", argv, runner.base_env,
                         runner.logs / f"{runner.server_count:04d}-fixed-downstream-ceiling.log")
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.alive():
            if verify.answers(target, "/json"):
                self.url = f"http://{target.host}:{target.port}/json"
                runner.meta.setdefault("fixed_downstream", {"command": shlex.join(argv), "url": self.url})
                return ""
            time.sleep(0.05)
        reason = f"the downstream C server did not answer: {self.proc.log_text()[-200:]}"
        self.stop()
        return reason

    @property
    def pids(self) -> tuple[int, ...]:
        return (self.proc.pid,) if self.proc else ()

    def stop(self) -> None:
        if self.proc:
            self.proc.stop()
            self.proc = None


def base_rates(runner: Runner, scenarios: list[Scenario], downstream: str = "") -> dict[str, tuple[float, str]]:
    """Each scenario's saturated rate: given with --fixed-base-rate, or measured now with wrk on the
    baseline configuration (pinned and primed as the main phase is, FIXED_BASE_WINDOWS windows, median)."""
    args = runner.args
    rates = {name: (rate, "--fixed-base-rate") for name, rate in args.fixed_base_rate.items()}
    todo = [s for s in scenarios if s.name not in rates]
    if not todo:
        return rates
    config = runner.baseline_row()
    if config is None or config.kind == "ceiling":
        for s in todo:
            runner.event("fixed", "*", "skipped", f"no base rate: configuration {args.baseline!r} is not in the "
                         "table; give --fixed-base-rate", s.name)
        return rates
    windows = 1 if args.quick else FIXED_BASE_WINDOWS
    runner.log(f"fixed: {args.baseline}'s saturated rate on {', '.join(s.name for s in todo)} (wrk, {windows} windows)")
    for kind in dict.fromkeys(flavour(s) for s in todo):
        measure_base(runner, config, [s for s in todo if flavour(s) == kind], windows, rates,
                     server_options(kind, downstream))
    for s in todo:
        if s.name not in rates:
            runner.event("fixed", "*", "skipped", f"no base rate: {config.name} was not measured on it", s.name)
    return rates


def measure_base(runner: Runner, config, todo: list[Scenario], windows: int, rates: dict, options: dict) -> None:
    args = runner.args
    server = runner.open_server(config, "middleware", todo, 0, phase="fixed-base", **options)
    if server is None:
        return
    try:
        for scenario in server.runnable:
            for i in range(1, windows + 1):
                if not runner.measure("fixed-base", config.name, scenario, i, server.url, {"server": server.proc},
                                      args.warmup, args.client_cpus, args.wrk_threads, len(runner.server_cpu_list),
                                      {"hosting": "direct", "threads": None}):
                    break
            values = [m["rps"] for m in runner.measurements if m["phase"] == "fixed-base"
                      and m["scenario"] == scenario.name and m["error_total"] == 0]
            if values:
                rates[scenario.name] = (statistics.median(values), f"{config.name}'s median wrk throughput in this "
                                        f"run ({len(values)} windows of {args.duration} s)")
    finally:
        server.proc.stop()


def phase_fixed(runner: Runner, scenarios: list[Scenario] = FIXED_SCENARIOS) -> None:
    args = runner.args
    scenarios = [s for s in scenarios if s.name in args.fixed_scenarios]
    downstream = Downstream(runner)
    try:
        if any(s.downstream for s in scenarios):
            reason = downstream.start()
            if reason:
                for s in [s for s in scenarios if s.downstream]:
                    runner.event("fixed", "*", "failed", reason, s.name)
                scenarios = [s for s in scenarios if not s.downstream]
        fixed_rounds(runner, scenarios, downstream)
    finally:
        downstream.stop()


def fixed_rounds(runner: Runner, scenarios: list[Scenario], downstream: Downstream) -> None:
    args = runner.args
    base = base_rates(runner, scenarios, downstream.url)
    scenarios = [s for s in scenarios if s.name in base]
    fractions = sorted(args.fixed_fractions, reverse=True)
    rates = {s.name: {f: max(1.0, round(base[s.name][0] * f)) for f in fractions} for s in scenarios}
    runner.meta["fixed"] = {
        "scenarios": [s.as_dict() for s in scenarios], "fractions": sorted(fractions), "order": args.order,
        "base": {name: {"rate": rate, "source": source} for name, (rate, source) in base.items()},
        "rates": {name: {str(f): r for f, r in by.items()} for name, by in rates.items()},
        "duration_s": args.fixed_duration, "warmup_s": args.fixed_warmup, "prime_s": args.warmup_first,
        "baseline": args.baseline}
    runner.save()
    if not scenarios:
        return
    todo = plans(runner, "fixed", scenarios, complete=False)
    kinds = list(dict.fromkeys(flavour(s) for s in scenarios))
    for round_no in range(1, args.rounds + 1):
        runner.log(f"fixed: round {round_no}/{args.rounds}")
        order = runner.rotated(todo, round_no)
        # paired: the round's servers side by side, each rate measured on every one of them back to back. Each kind
        # of server (plain, https, await) is its own set of servers.
        groups = [order] if args.order == "paired" else [[plan] for plan in order]
        for kind in kinds:
            for group in groups:
                group = [(config, [s for s in served if flavour(s) == kind]) for config, served in group]
                servers = [s for s in (fresh_server(runner, "fixed", config, served, round_no, prime=False,
                                                    **server_options(kind, downstream.url))
                                       for config, served in group if served) if s is not None]
                before = len(runner.measurements)
                try:
                    run_fixed_windows(runner, servers, [s for s in scenarios if flavour(s) == kind], fractions,
                                      rates, round_no, downstream.pids)
                finally:
                    for server in servers:
                        server.proc.stop()
                # The transport's counters at each server's exit (loop hand-offs...), over all its requests.
                for server in servers:
                    counters = server.exit_counters()
                    for record in runner.measurements[before:]:
                        if record["config"] == server.config.name:
                            record.update(counters=counters, server_requests=server.served)
                runner.save()


def run_fixed_windows(runner: Runner, servers: list[MainServer], scenarios: list[Scenario], fractions: list[float],
                      rates: dict, round_no: int, load_pids: tuple[int, ...] = ()) -> None:
    """From the highest rate down, so that the priming (at the highest rate) leads into the first window and
    every window follows its own warm-up at its own rate."""
    args = runner.args
    live = list(servers)
    for scenario in scenarios:
        primed: set[str] = set()
        for fraction in fractions:
            for server in list(live):
                if scenario not in server.runnable:
                    continue
                first = server.config.kind != "ceiling" and server.config.name not in primed
                primed.add(server.config.name)
                attempts = iter([args.fixed_warmup + (args.warmup_first if first else 0)])

                def attempt(server=server, fraction=fraction):
                    warmup = next(attempts, args.fixed_warmup)   # a window measured again is not primed again
                    return fixed_window(runner, server, scenario, fraction, rates[scenario.name][fraction],
                                        warmup, round_no, load_pids)
                if not runner.least_disturbed(attempt):
                    live.remove(server)


def fixed_window(runner: Runner, server: MainServer, scenario: Scenario, fraction: float, rate: float,
                 warmup: float, round_no: int, load_pids: tuple[int, ...] = ()) -> tuple[bool, dict | None]:
    """One window at one rate. load_pids (the downstream server on the client CPU) count as load, not as others."""
    args = runner.args
    runner.check_interrupted()
    name = server.config.name
    argv = loadgen_argv(runner, server.port, scenario.path, scenario.connections, rate, args.fixed_duration, warmup,
                        tls=scenario.tls)
    with MarkedLoadgen(runner, argv, server.proc, load_pids) as loadgen:
        result, window, error = loadgen.finish(warmup + args.fixed_duration + 30)
    if not server.proc.alive():
        runner.event("fixed", name, "failed", f"the server died: {server.proc.log_text()[-300:]}", scenario.name,
                     round_no, "middleware")
        return False, None
    if result is None:
        runner.event("fixed", name, "failed", error, scenario.name, round_no, "middleware")
        return True, None
    server.served += result["completed"]        # warm-up and priming included, for the counters at exit
    record = loadgen_record(runner, "fixed", scenario.name, name, round_no, scenario.path, scenario.connections,
                            result, window, shlex.join(argv), {"fraction": fraction, "warmup_s": warmup})
    cpu = record["cpu_us_per_request"]
    log_latency(runner, name, f"{scenario.name} {fraction:.0%} {rate:.0f}/s", record,
                f"  {cpu:.1f} us/req  CPU {record['server_cpu_util']:.0%}" if cpu is not None else "")
    return True, record


# ---- mixed: bulk downloads and small requests on one loop ---------------------------------------

def phase_mixed(runner: Runner, small: Scenario = MIXED_SMALL, bulk: Scenario = MIXED_BULK) -> None:
    args = runner.args
    runner.meta["mixed"] = {"small": small.as_dict(), "bulk": bulk.as_dict(), "rate": args.mixed_rate,
                            "duration_s": args.mixed_duration, "warmup_s": args.mixed_warmup, "threads": 1,
                            "baseline": args.baseline}
    todo = plans(runner, "mixed", [small, bulk], complete=True)
    for round_no in range(1, args.rounds + 1):
        runner.log(f"mixed: round {round_no}/{args.rounds} ({small.path} at {args.mixed_rate:.0f}/s beside "
                   f"{bulk.connections} × {bulk.path}, --threads 1)")
        for config, _ in runner.rotated(todo, round_no):
            server = fresh_server(runner, "mixed", config, [small, bulk], round_no, threads=1)
            if server is None:
                continue
            try:
                if small in server.runnable and bulk in server.runnable:
                    runner.least_disturbed(lambda: mixed_window(runner, server, small, bulk, round_no))
            finally:
                server.proc.stop()
        runner.save()


def mixed_window(runner: Runner, server: MainServer, small: Scenario, bulk: Scenario,
                 round_no: int) -> tuple[bool, dict | None]:
    args = runner.args
    runner.check_interrupted()
    name = server.config.name
    # wrk shares the client CPU with loadgen and would keep it busy receiving: niced, it yields to loadgen
    # whenever a small request is due, so loadgen's lag stays loadgen's and not the downloads'.
    wrk_argv = ["nice", "-n", str(MIXED_WRK_NICE)] + runner.wrk_argv(
        server.url, bulk, MIXED_WRK_LEAD_S + args.mixed_warmup + args.mixed_duration + 1, args.client_cpus,
        args.wrk_threads)
    wrk = subprocess.Popen(wrk_argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(MIXED_WRK_LEAD_S)
        argv = loadgen_argv(runner, server.port, small.path, small.connections, args.mixed_rate, args.mixed_duration,
                            args.mixed_warmup)
        with MarkedLoadgen(runner, argv, server.proc, (wrk.pid,)) as loadgen:
            result, window, error = loadgen.finish(args.mixed_warmup + args.mixed_duration + 30)
        bulk_output, _ = wrk.communicate(timeout=args.mixed_warmup + args.mixed_duration + 30)
    except subprocess.TimeoutExpired:
        runner.event("mixed", name, "failed", "wrk timed out", "mixed", round_no, "middleware")
        return True, None
    finally:
        if wrk.poll() is None:
            wrk.kill()
            wrk.wait()
    if not server.proc.alive():
        runner.event("mixed", name, "failed", f"the server died: {server.proc.log_text()[-300:]}", "mixed",
                     round_no, "middleware")
        return False, None
    downloads = runner.wrk_result(bulk_output)
    if result is None or downloads is None:
        runner.event("mixed", name, "failed", error or "wrk produced no result", "mixed", round_no, "middleware")
        return True, None
    seconds = downloads["duration_us"] / 1e6
    extra = {"bulk_mib_per_s": downloads["bytes"] / seconds / 2**20 if seconds > 0 else 0.0,
             "bulk_responses": downloads["requests"], "bulk_errors": downloads["errors"],
             "bulk_command": shlex.join(wrk_argv), "threads": 1}
    record = loadgen_record(runner, "mixed", "mixed", name, round_no, small.path, small.connections, result,
                            window, shlex.join(argv), extra)
    # A download cut off by wrk's timeout is an error of the window like a small request's.
    for kind, count in downloads["errors"].items():
        if count:
            record["errors"] = {**record["errors"], f"bulk_{kind}": count}
            record["error_total"] += count
    log_latency(runner, name, f"{small.path} {args.mixed_rate:.0f}/s", record,
                f"  bulk {extra['bulk_mib_per_s']:.0f} MiB/s  CPU {record['server_cpu_util']:.0%}")
    return True, record


# ---- blocking: bystanders of a handler that blocks its thread ------------------------------------

def block_path(ms: int, how: str) -> str:
    return f"/block?ms={ms}&how={how}"


# The bystanders' requests, and the sample's blocking handler as verification probes it.
BLOCK_BYSTANDER = Scenario("json-8", "JSON, 8 bystander connections", "/json", BYSTANDERS)
BLOCK_PROBE = Scenario("block", "GET /block (the sample's blocking handler), 0 ms", block_path(0, "sleep"), 1)


def phase_blocking(runner: Runner, bystander: Scenario = BLOCK_BYSTANDER, probe: Scenario = BLOCK_PROBE) -> None:
    """`probe` is /block with ms=0, verified before the measurement (a build without /block answers 404:
    unsupported). The server is pinned to the first server CPU only, with one event loop."""
    args = runner.args
    cpu = str(runner.server_cpu_list[0])
    runner.meta["blocking"] = {"ms": args.blocking_ms, "hows": args.blocking_how, "rate": args.blocking_rate,
                               "bystanders": BYSTANDERS, "path": bystander.path, "warmup_s": args.blocking_warmup,
                               "prime_s": args.warmup_first,
                               "server_cpu": cpu, "threads": 1, "baseline": args.baseline}
    todo = plans(runner, "blocking", [bystander, probe], complete=True)
    for round_no in range(1, args.rounds + 1):
        runner.log(f"blocking: round {round_no}/{args.rounds} ({args.blocking_ms} ms blocks, {BYSTANDERS} bystanders "
                   f"at {args.blocking_rate:.0f}/s, server on CPU {cpu} with --threads 1)")
        for (config, _), how in runner.rotated([(plan, how) for plan in todo for how in args.blocking_how], round_no):
            # A fresh server for every block: the thread pool keeps the threads it added for the last one.
            server = fresh_server(runner, "blocking", config, [bystander, probe], round_no, cpus=cpu, threads=1,
                                  prime=False)
            if server is None:
                continue
            try:
                if probe in server.runnable:
                    block_window(runner, server, bystander, how, round_no)
            finally:
                server.proc.stop()
        runner.save()


def block_window(runner: Runner, server: MainServer, bystander: Scenario, how: str, round_no: int) -> None:
    args = runner.args
    runner.check_interrupted()
    name = server.config.name
    target = verify.Target("tcp", host="127.0.0.1", port=server.port)
    # The blocking request goes out on a keep-alive connection whose earlier requests were answered, so that
    # it reaches the app where the transport schedules a read's continuation. (The first request of a new
    # connection runs where Kestrel starts the connection: on the thread pool, whatever the transport does.)
    # Those earlier requests also compile the handler's code, as loadgen's warm-up does the bystanders'.
    try:
        client = verify.connect(target, 5.0)
    except OSError as exc:
        runner.event("blocking", name, "failed", f"connecting for /block: {exc}", f"block-{how}", round_no,
                     "middleware")
        return
    samples = runner.tmp / f"blocking-{server.port}.txt"
    block_s = args.blocking_ms / 1000
    # The server was not primed with wrk (saturation would grow the thread pool the block then meets): the bystanders'
    # own warm-up primes it, --warmup-first longer.
    warmup = args.blocking_warmup + args.warmup_first
    argv = loadgen_argv(runner, server.port, bystander.path, BYSTANDERS, args.blocking_rate,
                        BLOCK_LEAD_S + block_s + BLOCK_TAIL_S, warmup, drain=block_s + 3, samples=samples)
    answer, result, window, error = None, None, None, ""
    try:
        for _ in range(3):
            verify.exchange_on(client, verify.request_bytes(target, block_path(0, how)))
        with MarkedLoadgen(runner, argv, server.proc) as loadgen:
            if loadgen.started.wait(timeout=warmup + 10):
                time.sleep(BLOCK_LEAD_S)
                sent = time.monotonic_ns()
                try:
                    response = verify.exchange_on(
                        client, verify.request_bytes(target, block_path(args.blocking_ms, how)), timeout=block_s + 30)
                    answer = json.loads(response.body) if response.status == 200 else None
                    error = "" if answer else f"/block answered {response.status}"
                except (OSError, verify.ProtocolError, ValueError) as exc:
                    error = f"/block: {exc}"
                returned = time.monotonic_ns()
            result, window, loadgen_error = loadgen.finish(warmup + 2 * block_s + 40)
            error = error or loadgen_error
    except (OSError, verify.ProtocolError, ValueError) as exc:
        error = f"/block with ms=0: {exc}"
    finally:
        client.close()
    if result is None or answer is None:
        runner.event("blocking", name, "failed", error or "loadgen did not start", f"block-{how}", round_no,
                     "middleware")
        samples.unlink(missing_ok=True)
        return
    # Bystander requests loadgen meant to send while the handler was blocked, by the handler's clock.
    start, end = answer["start_ns"], answer["end_ns"]
    during = []
    with open(samples) as f:
        for line in f:
            intended, latency, _lag = (int(x) for x in line.split())
            if start <= intended <= end:
                during.append((intended, latency))
    samples.unlink(missing_ok=True)
    expected = round((end - start) / 1e9 * args.blocking_rate)
    worst = max((latency for _, latency in during), default=None)
    extra = {"how": how, "block_ms": args.blocking_ms, "blocked_ms": (end - start) / 1e6,
             "block_client_ms": (returned - sent) / 1e6, "bystanders_during": len(during),
             "bystanders_expected": expected,
             "answered_before_return": sum(1 for i, latency in during if i + latency <= end),
             "worst_wait_us": worst / 1000 if worst is not None else None, "threads": 1}
    # Bystanders still unanswered when loadgen stopped waiting count as its "incomplete" errors.
    record = loadgen_record(runner, "blocking", f"block-{how}", name, round_no, bystander.path, BYSTANDERS, result,
                            window, shlex.join(argv), extra)
    runner.measurements.append(record)
    worst_text = f"{worst / 1e6:.1f} ms" if worst is not None else "none answered"
    runner.log(f"    {name:22} {how:7} worst bystander wait {worst_text:>10}  ({len(during)} sent during the "
               f"{extra['blocked_ms']:.0f} ms block, {extra['answered_before_return']} answered before it returned)"
               + (f"  ERRORS {record['errors']}" if record["error_total"] else ""))
