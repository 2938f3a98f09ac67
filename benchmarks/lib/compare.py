"""The benchmark runner behind benchmarks/compare.sh (which builds everything, then runs this).

It measures server configurations side by side on a shared, noisy machine, so:
  - every configuration runs as its own process, alone on the server CPUs, and is restarted for
    every round;
  - configurations are interleaved round by round (the order rotates each round), and the report
    gives medians and min-max over rounds, never a single run;
  - every server's answers are verified before any load is put on it;
  - next to requests/s it records the server's CPU time per request, read from /proc.

Phases (each its own interleaved rounds):
  main     wrk scenarios against every configuration, pinned (server CPUs vs load CPUs);
  latency  open-loop latency with benchmarks/loadgen at a fixed rate;
  hosting  Kestrel direct, behind nginx (TCP and Unix-socket upstream) and behind Caddy (hosting.py);
  sweep    ThreadCount 1/2/4, unpinned;
  fixed, mixed, blocking  below saturation, open loop (openloop.py): CPU and latency at fixed fractions
           of the baseline's rate; small requests beside bulk downloads on one loop; bystanders of a
           handler that blocks its thread.
  protocols  HTTP/2 with prior knowledge (h2load: JSON and a gRPC unary call) and WebSocket echo
           (benchmarks/wsload), closed loop at saturation (protocols.py).

Results go to --out: results.json (every measurement), then report.py writes report.md,
results.csv and the charts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.dont_write_bytecode = True   # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hosting  # noqa: E402
import openloop  # noqa: E402
import protocols  # noqa: E402
from procs import (CLK_TCK, STARTUP_TIMEOUT_S, PerfStat, Proc, cpu_busy_seconds, cpu_count, cpu_list, free_port,  # noqa: E402
                   run_capture)
import report  # noqa: E402
import verify  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "benchmarks" / "lib"
BIN = ROOT / "artifacts" / "benchmarks" / "bin"
SAMPLE_DLL = ROOT / "samples" / "TechEmpower" / "bin" / "Release" / "net10.0" / "TechEmpower.dll"
PIPELINE_LUA = LIB / "pipeline.lua"
USAGE_EXIT_CODE = 2                 # the sample's exit code for a command line it does not accept
ERROR_TOLERANCE = 0.001            # --quick fails when errors exceed 0.1% of a measurement's requests
LATENCY_RATE_DIVISOR = 6           # the open-loop rate: the baseline's closed-loop json-256 rate over this
STRIPPED_ENV_PREFIXES = ("Kestrel__", "ASPNETCORE_", "DOTNET_SYSTEM_NET_SOCKETS_", "DOTNET_ThreadPool_")
CORE_PATHS = ["/plaintext", "/json"]
APP_PATHS = ["/text", "/json-object", "/xml", "/html", "/api/test"]
BULK_RESPONSE_BYTES = 64 * 1024     # responses this large per request also get MiB/s (what wrk received)


class Interrupted(Exception):
    pass


# ---- configurations and scenarios -----------------------------------------------------------

@dataclass
class Config:
    name: str
    kind: str                                  # "kestrel" or "ceiling"
    env: dict[str, str]
    alternatives: list[list[str]]              # sample argument lists, tried in order
    line: str
    optional: bool = False                     # a start failure means "unavailable", not "failed"
    sample: Path | None = None                 # another build of the sample (@sample=PATH)

    @property
    def sample_dll(self) -> Path:
        return self.sample or SAMPLE_DLL

    def describe(self) -> str:
        if self.kind == "ceiling":
            return "benchmarks/ceiling (raw C epoll server)"
        text = " || ".join(" ".join(a) for a in self.alternatives)
        return f"[{self.sample}] {text}" if self.sample else text


def parse_config_line(line: str) -> Config | None:
    text = line.split("#", 1)[0].strip() if not line.lstrip().startswith("#") else ""
    if not text:
        return None
    tokens = shlex.split(text)
    name, rest = tokens[0], tokens[1:]
    env: dict[str, str] = {}
    optional = False
    sample: Path | None = None
    while rest and (rest[0] == "@optional" or rest[0].startswith("@sample=")
                    or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", rest[0])):
        token = rest.pop(0)
        if token == "@optional":
            optional = True
            continue
        if token.startswith("@sample="):
            sample = Path(os.path.expanduser(token.partition("=")[2])).resolve()
            continue
        key, _, value = token.partition("=")
        env[key] = value
    if rest == ["@ceiling"]:
        return Config(name, "ceiling", env, [[]], text, optional, sample)
    alternatives: list[list[str]] = [[]]
    for token in rest:
        if token == "||":
            alternatives.append([])
        else:
            alternatives[-1].append(token)
    return Config(name, "kestrel", env, alternatives, text, optional, sample)


def load_configs(path: Path, extra: list[str]) -> list[Config]:
    configs = [c for c in (parse_config_line(l) for l in path.read_text().splitlines()) if c]
    for line in extra:
        config = parse_config_line(line)
        if config is None:
            raise SystemExit(f"compare: --add-config {line!r} names no configuration")
        configs = [c for c in configs if c.name != config.name] + [config]
    return configs


@dataclass
class Scenario:
    name: str
    title: str
    path: str
    connections: int
    depth: int = 1
    headers: tuple[str, ...] = ()
    mode: str = "middleware"
    twin: str | None = None                    # the middleware scenario of the same shape
    body_kib: int = 0                          # > 0: POST bodies of this size (pipeline.lua's second argument), drained by the server
    min_window_s: int = 0                      # measured window at least this long, whatever --duration says
    timeout_s: int = 2                         # wrk --timeout: a request slower than this counts as an error

    def window_s(self, duration: int) -> int:
        return max(duration, self.min_window_s)

    @property
    def ceiling_serves(self) -> bool:
        return self.path in CORE_PATHS and self.body_kib == 0

    def as_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "path": self.path, "connections": self.connections,
                "depth": self.depth, "headers": list(self.headers), "mode": self.mode, "twin": self.twin, "body_kib": self.body_kib,
                "min_window_s": self.min_window_s, "timeout_s": self.timeout_s}


def main_scenarios(quick: bool) -> list[Scenario]:
    pt = "plaintext, 16 requests pipelined per write"
    all_scenarios = [
        Scenario("plaintext16-256", f"{pt}, 256 connections", "/plaintext", 256, 16),
        Scenario("plaintext16-1024", f"{pt}, 1024 connections", "/plaintext", 1024, 16),
        Scenario("json-256", "JSON, 256 connections", "/json", 256),
        Scenario("plaintext16-256-platform", f"{pt}, 256 connections, platform mode", "/plaintext", 256, 16,
                 mode="platform", twin="plaintext16-256"),
        Scenario("plaintext16-1024-platform", f"{pt}, 1024 connections, platform mode", "/plaintext", 1024, 16,
                 mode="platform", twin="plaintext16-1024"),
        Scenario("json-256-platform", "JSON, 256 connections, platform mode", "/json", 256,
                 mode="platform", twin="json-256"),
        Scenario("plaintext-2", "plaintext, 2 connections, no pipelining (as the published comparisons)",
                 "/plaintext", 2),
        Scenario("json-2", "JSON, 2 connections, no pipelining (as the published comparisons)", "/json", 2),
        Scenario("text-256", "app: GET /text (MVC ContentResult), 256 connections", "/text", 256),
        Scenario("json-object-256", "app: GET /json-object (MVC, JSON formatter), 256 connections",
                 "/json-object", 256),
        Scenario("xml-256", "app: GET /xml (MVC, XmlSerializer formatter), 256 connections", "/xml", 256),
        Scenario("html-256", "app: GET /html (MVC Razor view), 256 connections", "/html", 256),
        Scenario("api-test-256", "app: GET /api/test (MVC API action), 256 connections", "/api/test", 256),
        Scenario("churn-64", "connection churn: plaintext with Connection: close, 64 connections",
                 "/plaintext", 64, headers=("Connection: close",)),
        Scenario("upload256k-64", "upload: POST 256 KiB bodies to /plaintext (drained by Kestrel), 64 connections",
                 "/plaintext", 64, body_kib=256),
        Scenario("download256k-64", "download: GET 256 KiB bodies (MVC action, 64 KiB writes), 64 connections",
                 "/download/256", 64),
        # 200 × 8 MiB in flight at ~1.5 GB/s is about 1 s per response: a 3 s window would hold two or three
        # answers per connection and count the ramp-up, and wrk's usual 2 s timeout would be too close.
        Scenario("download8m-200", "large download: GET 8 MiB bodies (MVC action, 64 KiB writes), 200 connections",
                 "/download/8192", 200, min_window_s=10, timeout_s=10),
    ]
    if quick:
        keep = {"plaintext16-256", "json-256", "json-2", "text-256", "churn-64"}
        return [s for s in all_scenarios if s.name in keep]
    return all_scenarios


def selected_scenarios(args: argparse.Namespace) -> list[Scenario]:
    """--scenarios picks from every scenario (also with --quick); otherwise the mode's default set."""
    if args.scenarios:
        return [s for s in main_scenarios(quick=False) if s.name in args.scenarios]
    return main_scenarios(args.quick)


# JSON over 256 keep-alive connections: the hosting phase's second scenario, the sweep's only one,
# and what primes the latency phase's servers (closed loop, before the open-loop window).
JSON_256 = Scenario("json-256", "JSON, 256 connections", "/json", 256)
HOSTING_MODELS = ("direct", "nginx-tcp", "nginx-unix", "caddy", "caddy-unix")
HOSTING_SCENARIOS = [
    Scenario("plaintext-256", "plaintext, 256 connections, no pipelining", "/plaintext", 256),
    JSON_256,
]
SWEEP_SCENARIO = JSON_256

# The open-loop phases (openloop.py). Fixed rates: JSON over 64 keep-alive connections, and one MVC scenario
# of the same shape: /json-object is /json's work (an object serialized to JSON per request) behind routing,
# action selection and MVC's output formatter, so the two tables differ by what MVC costs per request.
FIXED_SCENARIOS = [
    Scenario("json-64", "JSON, 64 connections", "/json", 64),
    Scenario("json-object-64", "app: GET /json-object (MVC, JSON formatter), 64 connections", "/json-object", 64),
]
# Mixed load on one loop: small requests at a fixed rate beside 8 MiB downloads (about 0.1 s each).
MIXED_SMALL = Scenario("json-16", "JSON, 16 connections", "/json", 16)
MIXED_BULK = Scenario("download8m-16", "GET 8 MiB bodies, 16 connections", "/download/8192", 16, timeout_s=10)
# Blocking: the bystanders' requests, and the sample's blocking handler as verification probes it.
BLOCK_BYSTANDER = Scenario("json-8", "JSON, 8 bystander connections", "/json", openloop.BYSTANDERS)
BLOCK_PROBE = Scenario("block", "GET /block (the sample's blocking handler), 0 ms", openloop.block_path(0, "sleep"), 1)
# The protocols phase (protocols.py), at saturation: depth is the requests in flight per connection (HTTP/2 streams,
# or the one WebSocket message each connection waits for).
PROTOCOL_SCENARIOS = [
    Scenario("h2-json", "JSON over HTTP/2 with prior knowledge (h2c), 16 connections × 16 streams (h2load)",
             "/json", 16, 16),
    Scenario("grpc-unary", f"gRPC unary call echoing {protocols.GRPC_MESSAGE_BYTES} bytes, 16 connections × 16 "
             "streams (h2load)", protocols.GRPC_PATH, 16, 16),
    Scenario("ws-echo", f"WebSocket echo of {protocols.WS_MESSAGE_BYTES}-byte messages, 16 connections, one message "
             "in flight each (wsload)", protocols.WS_PATH, 16),
]


# ---- servers --------------------------------------------------------------------------------

@dataclass
class StartResult:
    proc: Proc | None
    state: str                  # "ok", "unsupported", "unavailable" (optional config), "failed"
    reason: str = ""
    startup_line: str = ""
    argv: list[str] = field(default_factory=list)


@dataclass
class MainServer:
    """A started, verified and primed server of the main phase, and the scenarios it can be measured on."""
    config: Config
    proc: Proc
    url: str
    runnable: list[Scenario]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


class Runner:
    def __init__(self, args: argparse.Namespace, configs: list[Config], table: list[Config] | None = None) -> None:
        self.args = args
        self.configs = configs
        self.by_name = {c.name: c for c in configs}
        self.out = Path(args.out)
        self.logs = self.out / "logs"
        # A reused --out (CI's fixed folder) must not mix an old run's files into this one's.
        shutil.rmtree(self.logs, ignore_errors=True)
        for old in ("report.md", "results.json", "results.csv", *(p.name for p in self.out.glob("*.png"))):
            (self.out / old).unlink(missing_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="ktl-compare-"))
        self.ports: set[int] = set()
        self.measurements: list[dict] = []
        self.events: list[dict] = []            # skipped and failed servers and scenarios
        self.startup_lines: dict[str, str] = {}
        self.commands: dict[str, str] = {}
        self.unsupported: dict[tuple[str, str], str] = {}   # (config, mode or path) -> reason
        self.chosen_alternative: dict[tuple[str, str], list[str]] = {}
        self.server_count = 0
        self.interrupted = False
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith(STRIPPED_ENV_PREFIXES)}
        self.stripped_env = sorted(k for k in os.environ if k.startswith(STRIPPED_ENV_PREFIXES))
        self.base_env.update(DOTNET_CLI_TELEMETRY_OPTOUT="1", DOTNET_NOLOGO="1")
        self.started = time.monotonic()
        self.meta: dict = {}
        self.bench_cpus = sorted(set(cpu_list(args.server_cpus) + cpu_list(args.client_cpus)))
        self.server_cpu_list = cpu_list(args.server_cpus)
        self.table = {c.name: c for c in table or configs}    # every row, selected or not (fixed's base rate)
        self.loadgen = BIN / "loadgen"
        self.wsload = BIN / "wsload"
        self.latency_rate: float | None = None
        self.latency_rate_source = ""

    # -- bookkeeping --

    def log(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[{int(elapsed) // 60:3d}:{int(elapsed) % 60:02d}] {message}", flush=True)

    def event(self, phase: str, config: str, state: str, reason: str, scenario: str = "*",
              round_no: int | None = None, mode: str | None = None, extra: dict | None = None) -> None:
        record = {"phase": phase, "config": config, "scenario": scenario, "mode": mode, "round": round_no,
                  "state": state, "reason": reason}
        record.update(extra or {})
        self.events.append(record)
        self.log(f"  {state.upper()}: {config} {scenario if scenario != '*' else ''} {reason}")

    def save(self) -> None:
        data = {"meta": self.meta, "configs": [self._config_dict(c) for c in self.configs],
                "events": self.events, "measurements": self.measurements}
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.out / "results.json")

    def _config_dict(self, c: Config) -> dict:
        return {"name": c.name, "kind": c.kind, "env": c.env, "alternatives": c.alternatives,
                "line": c.line, "startup_line": self.startup_lines.get(c.name, ""),
                "command": self.commands.get(c.name, "")}

    def check_interrupted(self) -> None:
        if self.interrupted:
            raise Interrupted()

    # -- starting servers --

    def _wait_ready(self, proc: Proc, target: verify.Target, ready_prefix: str) -> tuple[str, str, str]:
        """Waits until the process printed its startup line and answers. Returns (state, reason, line)."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        line = ""
        while time.monotonic() < deadline:
            self.check_interrupted()
            if not proc.alive():
                code = proc.popen.returncode
                text = proc.log_text().strip()
                first = next((l for l in text.splitlines() if l.strip()), "")
                if code == USAGE_EXIT_CODE:
                    return "unsupported", first or "usage error", ""
                tail = " | ".join(text.splitlines()[-3:])
                return "failed", f"exited with code {code} before answering: {tail}", ""
            if not line:
                for l in proc.log_text().splitlines():
                    if l.startswith(ready_prefix):
                        line = l.strip()
                        break
            if line and verify.answers(target, "/plaintext", timeout=1.0):
                return "ok", "", line
            time.sleep(0.05)
        return "failed", f"did not answer within {STARTUP_TIMEOUT_S:.0f} s", line

    def start_server(self, config: Config, mode: str, target: verify.Target, cpus: str | None,
                     threads: int | None, label: str, extra_args: tuple[str, ...] = ()) -> StartResult:
        """Starts one configuration, with extra_args after its own arguments (a Kestrel server only). A usage
        error (exit 2) on every alternative means unsupported."""
        self.server_count += 1
        log_path = self.logs / f"{self.server_count:04d}-{label}.log"
        taskset = ["taskset", "-c", cpus] if cpus else []
        env = dict(self.base_env)
        env.update(config.env)
        if config.kind == "ceiling":
            argv = taskset + [str(BIN / "ceiling"), "-a", target.host, "-p", str(target.port)]
            if threads:
                argv += ["-t", str(threads)]
            proc = Proc(label, argv, env, log_path)
            state, reason, line = self._wait_ready(proc, target, "ceiling:")
            if state != "ok":
                proc.stop()
                return StartResult(None, state, reason, argv=argv)
            return StartResult(proc, "ok", startup_line=line, argv=argv)

        url = f"http://unix:{target.path}" if target.kind == "unix" else f"http://{target.host}:{target.port}"
        mode_alternatives = [["--mode", mode]] + ([[]] if mode == "middleware" else [])
        key = (config.name, mode)
        if key in self.chosen_alternative:
            candidates = [self.chosen_alternative[key]]
        else:
            candidates = [a + m for a in config.alternatives for m in mode_alternatives]
        rejected = []
        for sample_args in candidates:
            argv = taskset + ["dotnet", str(config.sample_dll), "--urls", url] + sample_args + list(extra_args)
            if threads:
                argv += ["--threads", str(threads)]
            if target.kind == "unix" and os.path.exists(target.path):
                os.unlink(target.path)
            proc = Proc(label, argv, env, log_path)
            state, reason, line = self._wait_ready(proc, target, "TechEmpower:")
            if state == "unsupported":
                proc.stop()
                rejected.append(f"`{' '.join(sample_args)}`: {reason}")
                continue
            if state != "ok":
                proc.stop()
                if config.optional:
                    state = "unavailable"
                return StartResult(None, state, reason, argv=argv)
            self.chosen_alternative[key] = sample_args
            return StartResult(proc, "ok", startup_line=line, argv=argv)
        return StartResult(None, "unsupported", "the sample rejected " + "; ".join(rejected))

    def start_failed(self, phase: str, config: Config, key: str, started: StartResult, scenario: str,
                     round_no: int, mode: str | None, extra: dict | None = None) -> None:
        """Records a server that did not start; unsupported or unavailable ones are not retried."""
        if started.state in ("unsupported", "unavailable"):
            self.unsupported[(config.name, key)] = started.reason
        self.event(phase, config.name, started.state, started.reason, scenario, round_no, mode, extra)

    def busy_seconds(self) -> float:
        return cpu_busy_seconds(self.bench_cpus)

    def other_load(self, busy: float, ours: float, wall: float) -> float | None:
        """Share of the benchmark's CPUs used by other processes during a window: on a shared
        machine this says how much to trust it."""
        if wall <= 0:
            return None
        return max(0.0, busy - ours) / wall / len(self.bench_cpus)

    def skip(self, config: Config, key: str) -> bool:
        """True when this configuration cannot run in this setup (learned earlier in the run)."""
        return any((config.name, k) in self.unsupported for k in (key, "middleware", "any"))

    # -- load --

    @staticmethod
    def wrk_argv(url: str, scenario: Scenario, duration: float, cpus: str | None, threads: int) -> list[str]:
        argv = (["taskset", "-c", cpus] if cpus else []) + [
            "wrk", "-t", str(min(threads, scenario.connections)), "-c", str(scenario.connections),
            "-d", f"{max(1, math.ceil(duration))}s", "--timeout", f"{scenario.timeout_s}s",
            "-s", str(PIPELINE_LUA)]
        for header in scenario.headers:
            argv += ["-H", header]
        return argv + [url + scenario.path, "--", str(scenario.depth), str(scenario.body_kib)]

    @staticmethod
    def wrk_result(output: str) -> dict | None:
        """The WRK_RESULT line pipeline.lua prints, parsed."""
        for line in output.splitlines():
            if line.startswith("WRK_RESULT "):
                return json.loads(line[len("WRK_RESULT "):])
        return None

    def run_wrk(self, url: str, scenario: Scenario, duration: float, cpus: str | None,
                threads: int) -> tuple[dict | None, str, float]:
        """Runs wrk; returns (parsed WRK_RESULT, command line, load-generator CPU seconds)."""
        argv = self.wrk_argv(url, scenario, duration, cpus, threads)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 20)
        except subprocess.TimeoutExpired:
            return None, shlex.join(argv), 0.0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return self.wrk_result(done.stdout), shlex.join(argv), load_cpu

    def prime(self, url: str, scenarios: list[Scenario], total: float, cpus: str | None, threads: int,
              run_load=None) -> None:
        """Warms a fresh server on every scenario it will be measured on, in turn, for `total` seconds.
        .NET compiles a method three times (tier 0, an instrumented tier for dynamic PGO, tier 1) and
        does the later tiers on a background thread that shares the server's pinned CPU: measured in
        1-s windows, plaintext16-1024 fell from 71K to 39K req/s in the first ~10 s and reached its
        205-212K plateau only after ~25 s (JSON-256: 24K, then ~50K from ~25 s). Every scenario
        gets slices until the time is used (1-5 s each, at least twice round when there is time). run_load(url,
        scenario, seconds) puts the load on instead of wrk (the protocols phase)."""
        if total <= 0 or not scenarios:
            return
        run_load = run_load or (lambda url, scenario, seconds: self.run_wrk(url, scenario, seconds, cpus, threads))
        slice_s = max(1, min(5, int(total // (2 * len(scenarios)))))
        deadline = time.monotonic() + total
        while time.monotonic() < deadline:
            for scenario in scenarios:
                left = deadline - time.monotonic()
                if left < 0.5:
                    return
                self.check_interrupted()
                run_load(url, scenario, min(slice_s, max(1, round(left))))

    def measure(self, phase: str, config: str, scenario: Scenario, round_no: int, url: str,
                procs: dict[str, Proc], warmup: float, cpus_load: str | None, wrk_threads: int,
                server_cpu_count: int, extra: dict, run_load=None) -> bool:
        """Warm-up, then one measured window; measured again (warm-up included) while other processes took
        at least DISTURBED_OTHER_LOAD of the benchmark's CPUs, up to --remeasure more times, keeping the
        least disturbed window. Returns False when the server died."""
        return self.least_disturbed(lambda: self.window(phase, config, scenario, round_no, url, procs, warmup,
                                                        cpus_load, wrk_threads, server_cpu_count, extra, run_load))

    def least_disturbed(self, attempt_window) -> bool:
        """Runs attempt_window() -> (server alive, record or None) again while other processes took at least
        DISTURBED_OTHER_LOAD of the benchmark's CPUs, up to --remeasure more times, and keeps the least
        disturbed record. Returns False when the server died."""
        best: dict | None = None
        for attempt in range(1, self.args.remeasure + 2):
            alive, record = attempt_window()
            if record is None:
                return alive                # the attempt failed; the window recorded why, and that is the outcome
            if best is None or (record["other_cpu_util"] or 0.0) < (best["other_cpu_util"] or 0.0):
                best = record
            if (record["other_cpu_util"] or 0.0) < DISTURBED_OTHER_LOAD or attempt > self.args.remeasure:
                break
            self.log(f"    {'':26} {'':26} others took {record['other_cpu_util']:.0%} of the CPUs: measured again")
        best["attempts"] = attempt
        self.measurements.append(best)
        return True

    def window(self, phase: str, config: str, scenario: Scenario, round_no: int, url: str,
               procs: dict[str, Proc], warmup: float, cpus_load: str | None, wrk_threads: int,
               server_cpu_count: int, extra: dict, run_load=None) -> tuple[bool, dict | None]:
        """Warm-up, then one measured window: (server still alive, the window's record or None). The load is wrk's,
        or run_load(seconds) -> (result in WRK_RESULT's shape or None, command line, load generator CPU seconds),
        which wrk_threads then counts the threads of."""
        self.check_interrupted()
        run_load = run_load or (lambda seconds: self.run_wrk(url, scenario, seconds, cpus_load, wrk_threads))
        if warmup > 0:
            run_load(warmup)
        for name, proc in procs.items():
            if not proc.alive():
                self.event(phase, config, "failed", f"{name} died during warm-up: {proc.log_text()[-300:]}",
                           scenario.name, round_no, scenario.mode, extra)
                return False, None
        cpu_before = {name: proc.cpu_seconds() for name, proc in procs.items()}
        busy_before = cpu_busy_seconds(self.bench_cpus)
        counter = PerfStat(procs["server"].pid) if self.args.perf_stat and "server" in procs else None
        t0 = time.monotonic()
        result, command, load_cpu = run_load(scenario.window_s(self.args.duration))
        wall = time.monotonic() - t0
        counts = counter.stop() if counter else {}
        busy = cpu_busy_seconds(self.bench_cpus) - busy_before
        cpu = {name: proc.cpu_seconds() - cpu_before[name] for name, proc in procs.items()}
        died = [name for name, proc in procs.items() if not proc.alive()]
        if result is None or died:
            reason = (f"{', '.join(died)} died during the measurement" if died
                      else "the load generator produced no result")
            self.event(phase, config, "failed", reason, scenario.name, round_no, scenario.mode, extra)
            return not died, None

        requests = result["requests"]
        duration_s = result["duration_us"] / 1e6
        errors = result["errors"]
        error_total = sum(errors.values())
        total_cpu = sum(cpu.values())
        record = {
            "phase": phase, "scenario": scenario.name, "mode": scenario.mode, "config": config,
            "round": round_no, "connections": scenario.connections, "depth": scenario.depth,
            "path": scenario.path, "rps": requests / duration_s if duration_s > 0 else 0.0,
            "requests": requests, "duration_s": duration_s, "bytes": result["bytes"],
            "mib_per_s": result["bytes"] / duration_s / 2**20 if duration_s > 0 else 0.0,
            "server_cpu_s": cpu.get("server", 0.0), "proxy_cpu_s": cpu.get("proxy", 0.0),
            "cpu_us_per_request": total_cpu / requests * 1e6 if requests else None,
            "server_cpu_util": total_cpu / wall / server_cpu_count if wall > 0 else None,
            "load_cpu_util": load_cpu / wall / max(1, wrk_threads) if wall > 0 else None,
            "other_cpu_util": self.other_load(busy, total_cpu + load_cpu, wall),
            "errors": errors, "error_total": error_total,
            "error_rate": error_total / requests if requests else 1.0,
            "wrk_latency_us": result["latency_us"], "command": command,
        }
        if counter:
            for event, key in PerfStat.EVENTS.items():
                record[key] = counts[event] / requests if requests and event in counts else None
        record.update(extra)
        flag = f"  ERRORS {errors}" if error_total else ""
        cpu_text = f"{record['cpu_us_per_request']:.1f} us/req" if requests else "-"
        if record["bytes"] >= requests * BULK_RESPONSE_BYTES:
            cpu_text += f"  {record['mib_per_s']:.0f} MiB/s"
        if counter and requests:
            cpu_text += "".join(f"  {record[key]:.2f} {key.split('_')[0]}/req" for key in PerfStat.EVENTS.values()
                                if record.get(key) is not None)
        label = config + (f" @{extra['hosting']}" if extra.get("hosting", "direct") != "direct" else "") + (
            f" threads={extra['threads']}" if extra.get("threads") else "")
        other = record["other_cpu_util"]
        other_text = f"  (others {other:.0%})" if other and other >= DISTURBED_OTHER_LOAD else ""
        self.log(f"    {label:26} {scenario.name:26} {record['rps']:11.0f} req/s  {cpu_text}{flag}{other_text}")
        return True, record

    # -- phases --

    def rotated(self, items: list, round_no: int) -> list:
        k = (round_no - 1) % len(items) if items else 0
        return items[k:] + items[:k]

    def verify_server(self, phase: str, config: str, target: verify.Target, paths: list[str],
                      round_no: int, mode: str | None, extra: dict | None = None) -> verify.Verification | None:
        result = verify.verify(target, paths)
        core = [p for p in paths if p in CORE_PATHS]
        core_bad = result.problems + [result.state(p)[1] for p in core if result.state(p)[0] != "ok"]
        if core_bad:
            self.event(phase, config, "failed", "verification: " + "; ".join(core_bad), "*", round_no, mode, extra)
            return None
        return result

    def phase_main(self) -> None:
        scenarios = selected_scenarios(self.args)
        self.meta["scenarios"] = [s.as_dict() for s in scenarios]
        self.meta["order"] = self.args.order
        modes = [m for m in ("middleware", "platform") if any(s.mode == m for s in scenarios)]
        rounds = self.args.rounds
        for round_no in range(1, rounds + 1):
            self.log(f"main: round {round_no}/{rounds}")
            plans = []          # (config, mode, scenarios), in this round's rotated order
            for config in self.rotated(self.configs, round_no):
                config_modes = ["any"] if config.kind == "ceiling" else modes
                for mode in config_modes:
                    if config.kind == "ceiling":
                        # The ceiling has no modes: a platform scenario borrows its middleware twin's rows,
                        # unless that twin is not part of this run.
                        names = {s.name for s in scenarios}
                        todo = [s for s in scenarios if s.ceiling_serves and (s.mode == "middleware"
                                                                              or s.twin not in names)]
                    else:
                        todo = [s for s in scenarios if s.mode == mode]
                    todo = [s for s in todo if (config.name, s.path) not in self.unsupported]
                    if not todo or (config.name, mode) in self.unsupported:
                        continue
                    plans.append((config, mode, todo))
            if self.args.order == "paired":
                # The ceiling serves both modes' rows at once, so it is paired with the first mode's servers.
                for mode in modes:
                    group = [p for p in plans if p[1] == mode or (p[1] == "any" and mode == modes[0])]
                    self.run_paired(group, round_no)
                    self.save()
            else:
                for config, mode, todo in plans:
                    self.run_server_scenarios(config, mode, todo, round_no)
                    self.save()

    def open_server(self, config: Config, mode: str, todo: list[Scenario], round_no: int, phase: str = "main",
                    cpus: str | None = None, threads: int | None = None, prime: bool = True,
                    extra_args: tuple[str, ...] = (), check=None, run_load=None) -> MainServer | None:
        """Starts and verifies one configuration's server for a phase (pinned to `cpus`, default the server
        CPUs), and primes it on the scenarios it can serve. None when it did not start or failed verification
        (recorded as an event). The protocols phase's servers take more arguments (extra_args), are verified by
        check(server, scenario) -> (state, reason) instead of verify.py's HTTP/1.1 checks (an HTTP/2-only
        server still answers an HTTP/1.1 request, with 400, which is all the start-up waits for), and are
        primed with run_load (see prime)."""
        port = free_port(self.ports)
        target = verify.Target("tcp", host="127.0.0.1", port=port)
        server_mode = "middleware" if mode == "any" else mode
        # A build that rejects the extra arguments is unsupported with them, not in its mode.
        key = " ".join([mode, *extra_args])
        started = self.start_server(config, server_mode, target, cpus or self.args.server_cpus, threads,
                                    f"{phase}-r{round_no}-{config.name}-{key.replace(' --', '-').replace(' ', '-')}",
                                    extra_args)
        if started.state != "ok":
            self.start_failed(phase, config, key, started, "*", round_no, mode)
            return None
        server = MainServer(config, started.proc, f"http://127.0.0.1:{port}", [])
        try:
            self.startup_lines.setdefault(config.name, started.startup_line)
            self.commands.setdefault(config.name, shlex.join(started.argv))
            if check is None:
                paths = list(dict.fromkeys(CORE_PATHS + [s.path for s in todo]))
                if config.kind == "ceiling" or mode == "platform":
                    paths = [p for p in paths if p in CORE_PATHS]
                result = self.verify_server(phase, config.name, target, paths, round_no, mode)
                if result is None:
                    server.proc.stop()
                    return None
                states = [result.state(scenario.path) for scenario in todo]
            else:
                states = [check(server, scenario) for scenario in todo]
            for scenario, (state, reason) in zip(todo, states):
                if state == "missing":
                    self.unsupported[(config.name, scenario.path)] = reason
                    self.event(phase, config.name, "unsupported", reason, scenario.name, round_no, mode)
                    continue
                if state == "bad":
                    self.event(phase, config.name, "failed", "verification: " + reason, scenario.name,
                               round_no, mode)
                    continue
                server.runnable.append(scenario)
            if prime and config.kind != "ceiling":
                self.prime(server.url, server.runnable, self.args.warmup_first, self.args.client_cpus,
                           self.args.wrk_threads, run_load)
            return server
        except BaseException:
            server.proc.stop()
            raise

    def measure_on(self, server: MainServer, scenario: Scenario, round_no: int) -> bool:
        return self.measure("main", server.config.name, scenario, round_no, server.url, {"server": server.proc},
                            self.args.warmup, self.args.client_cpus, self.args.wrk_threads,
                            cpu_count(self.args.server_cpus), {"hosting": "direct", "threads": None})

    def run_server_scenarios(self, config: Config, mode: str, todo: list[Scenario], round_no: int) -> None:
        """--order blocks: one server at a time, measured on all its scenarios, then stopped."""
        server = self.open_server(config, mode, todo, round_no)
        if server is None:
            return
        try:
            for scenario in server.runnable:
                if not self.measure_on(server, scenario, round_no):
                    return
        finally:
            server.proc.stop()

    def run_paired(self, plans: list[tuple[Config, str, list[Scenario]]], round_no: int) -> None:
        """--order paired: every configuration's server of the round is started and primed first, all pinned
        to the server CPUs, and then each scenario is measured on each server in turn (in the round's
        rotated order), so the windows a ratio compares are seconds apart rather than minutes. The servers
        not under load are idle in epoll_wait; their CPU counts as other load in the measured window."""
        servers: list[MainServer] = []
        try:
            for config, mode, todo in plans:
                server = self.open_server(config, mode, todo, round_no)
                if server is not None:
                    servers.append(server)
            order = list(dict.fromkeys(s.name for _, _, todo in plans for s in todo))
            live = list(servers)
            for name in order:
                for server in list(live):
                    scenario = next((s for s in server.runnable if s.name == name), None)
                    # A server that died, even while another one was loaded, fails its next window
                    # (window() records it) and is measured no more this round.
                    if scenario is not None and not self.measure_on(server, scenario, round_no):
                        live.remove(server)
        finally:
            for server in servers:
                server.proc.stop()

    def phase_latency(self) -> None:
        if self.args.latency_rate:
            self.latency_rate, self.latency_rate_source = self.args.latency_rate, "--latency-rate"
        elif self.args.quick:
            self.latency_rate, self.latency_rate_source = 2000.0, "fixed low rate for --quick"
        else:
            base = self.args.baseline
            values = [m["rps"] for m in self.measurements
                      if m["phase"] == "main" and m["scenario"] == "json-256" and m["config"] == base
                      and m["error_total"] == 0]
            source = base
            if not values:
                # Fall back to the slowest configuration measured, so the rate is sustainable for all.
                medians = {}
                for m in self.measurements:
                    if m["phase"] == "main" and m["scenario"] == "json-256" and m["config"] != "ceiling":
                        medians.setdefault(m["config"], []).append(m["rps"])
                if not medians:
                    self.event("latency", "*", "skipped", "no json-256 measurement to derive the rate from")
                    return
                source, values = min(((k, v) for k, v in medians.items()), key=lambda kv: statistics.median(kv[1]))
            # Open loop, requests arrive one at a time and each pays for waking the loop and a pool
            # worker: with the pool's spinning off (spin limit 0) both transports took 54-61 us of CPU
            # per request at 10K req/s, four to five times their closed-loop cost. At half the closed-loop
            # rate every server ran its CPU flat out, so the phase measured queueing; a sixth leaves
            # the baseline about a third of its CPU. (With the spinning on, the CPU share says
            # nothing here: idle workers spin it away at any rate.)
            self.latency_rate = round(statistics.median(values) / LATENCY_RATE_DIVISOR, -2)
            self.latency_rate_source = (f"{source}'s median json-256 throughput in this run, "
                                        f"{statistics.median(values):.0f} req/s, divided by {LATENCY_RATE_DIVISOR}")
        self.meta["latency"] = {"rate": self.latency_rate, "rate_source": self.latency_rate_source,
                                "connections": 256, "path": "/json", "duration_s": self.args.latency_duration,
                                "warmup_s": self.args.latency_warmup}
        scenario = Scenario("json-256-open-loop", "JSON, 256 connections, open loop at a fixed rate", "/json", 256)
        for round_no in range(1, self.args.rounds + 1):
            self.log(f"latency: round {round_no}/{self.args.rounds} at {self.latency_rate:.0f} req/s")
            for config in self.rotated(self.configs, round_no):
                if self.skip(config, "latency"):
                    continue
                self.check_interrupted()
                port = free_port(self.ports)
                target = verify.Target("tcp", host="127.0.0.1", port=port)
                started = self.start_server(config, "middleware", target, self.args.server_cpus, None,
                                            f"latency-r{round_no}-{config.name}")
                try:
                    if started.state != "ok":
                        self.start_failed("latency", config, "latency", started, scenario.name, round_no, None)
                        continue
                    if self.verify_server("latency", config.name, target, CORE_PATHS, round_no, None) is None:
                        continue
                    if config.kind != "ceiling":
                        self.prime(f"http://127.0.0.1:{port}", [JSON_256], self.args.warmup_first,
                                   self.args.client_cpus, self.args.wrk_threads)
                    self.run_wrk(f"http://127.0.0.1:{port}", JSON_256, self.args.warmup,
                                 self.args.client_cpus, self.args.wrk_threads)
                    self.run_loadgen(config.name, scenario, round_no, port, started.proc)
                finally:
                    if started.proc:
                        started.proc.stop()
            self.save()

    def run_loadgen(self, config: str, scenario: Scenario, round_no: int, port: int, proc: Proc) -> None:
        argv = ["taskset", "-c", self.args.client_cpus, str(BIN / "loadgen"), "-a", "127.0.0.1", "-p", str(port),
                "-P", scenario.path, "-c", str(scenario.connections), "-r", f"{self.latency_rate:.0f}",
                "-d", f"{self.args.latency_duration:g}", "-w", f"{self.args.latency_warmup:g}", "-T", "2"]
        cpu_before = proc.cpu_seconds()
        busy_before = cpu_busy_seconds(self.bench_cpus)
        usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True,
                                  timeout=self.args.latency_warmup + self.args.latency_duration + 20)
        except subprocess.TimeoutExpired:
            self.event("latency", config, "failed", "loadgen timed out", scenario.name, round_no)
            return
        wall = time.monotonic() - t0
        busy = cpu_busy_seconds(self.bench_cpus) - busy_before
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_cpu = (usage.ru_utime - usage_before.ru_utime) + (usage.ru_stime - usage_before.ru_stime)
        cpu = proc.cpu_seconds() - cpu_before
        if done.returncode != 0 or not done.stdout.strip():
            self.event("latency", config, "failed", f"loadgen failed: {done.stderr.strip()[-300:]}",
                       scenario.name, round_no)
            return
        result = json.loads(done.stdout)
        errors = result["errors"]
        error_total = sum(errors.values())
        record = {"phase": "latency", "scenario": scenario.name, "mode": "middleware", "config": config,
                  "round": round_no, "connections": scenario.connections, "depth": 1, "path": scenario.path,
                  "rps": result["achieved_rate"], "target_rate": result["target_rate"],
                  "requests": result["recorded"], "duration_s": result["duration_s"],
                  "server_cpu_s": cpu, "proxy_cpu_s": 0.0,
                  # the window includes loadgen's warm-up and drain, so divide by everything it completed
                  "cpu_us_per_request": cpu / result["completed"] * 1e6 if result["completed"] else None,
                  "server_cpu_util": cpu / wall / cpu_count(self.args.server_cpus),
                  "load_cpu_util": load_cpu / wall, "other_cpu_util": self.other_load(busy, cpu + load_cpu, wall),
                  "errors": errors, "error_total": error_total,
                  "error_rate": error_total / max(1, result["recorded"]),
                  "latency_us": result["latency_us"], "send_lag_us": result["send_lag_us"],
                  "command": shlex.join(argv), "hosting": "direct", "threads": None}
        self.measurements.append(record)
        lat = result["latency_us"]
        flag = f"  ERRORS {errors}" if error_total else ""
        self.log(f"    {config:16} p50 {lat['p50']:9.0f} us  p99 {lat['p99']:9.0f} us  "
                 f"p99.9 {lat['p99.9']:9.0f} us  ({result['achieved_rate']:.0f} req/s){flag}")

    def phase_hosting(self) -> None:
        hosting.phase_hosting(self, HOSTING_SCENARIOS, CORE_PATHS)

    def phase_sweep(self) -> None:
        transports = [t for t in self.args.sweep_transports if t in self.by_name]
        counts = [1] if self.args.quick else self.args.sweep_threads
        cpus = ",".join(str(c) for c in self.bench_cpus)
        self.meta["sweep"] = {"transports": transports, "threads": counts, "cpus": cpus,
                              "scenario": SWEEP_SCENARIO.as_dict(), "wrk_threads": cpu_count(cpus)}
        combos = [(t, n) for t in transports for n in counts]
        for round_no in range(1, self.args.rounds + 1):
            self.log(f"sweep (unpinned, CPUs {cpus}): round {round_no}/{self.args.rounds}")
            for transport, threads in self.rotated(combos, round_no):
                config = self.by_name[transport]
                if self.skip(config, f"sweep:{threads}"):
                    continue
                self.check_interrupted()
                extra = {"hosting": "direct", "threads": threads}
                port = free_port(self.ports)
                target = verify.Target("tcp", host="127.0.0.1", port=port)
                started = self.start_server(config, "middleware", target, cpus, threads,
                                            f"sweep-r{round_no}-{config.name}-t{threads}")
                try:
                    if started.state != "ok":
                        self.start_failed("sweep", config, f"sweep:{threads}", started, f"threads={threads}",
                                          round_no, None, extra)
                        continue
                    if self.verify_server("sweep", config.name, target, CORE_PATHS, round_no, None, extra) is None:
                        continue
                    self.prime(f"http://127.0.0.1:{port}", [SWEEP_SCENARIO], self.args.warmup_first, cpus,
                               cpu_count(cpus))
                    self.measure("sweep", config.name, SWEEP_SCENARIO, round_no, f"http://127.0.0.1:{port}",
                                 {"server": started.proc}, self.args.warmup, cpus, cpu_count(cpus),
                                 cpu_count(cpus), extra)
                finally:
                    if started.proc:
                        started.proc.stop()
            self.save()


    def phase_fixed(self) -> None:
        openloop.phase_fixed(self, FIXED_SCENARIOS)

    def phase_mixed(self) -> None:
        openloop.phase_mixed(self, MIXED_SMALL, MIXED_BULK)

    def phase_blocking(self) -> None:
        openloop.phase_blocking(self, BLOCK_BYSTANDER, BLOCK_PROBE)

    def phase_protocols(self) -> None:
        protocols.phase_protocols(self, PROTOCOL_SCENARIOS)


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

PHASES = ("main", "latency", "hosting", "sweep", "fixed", "mixed", "blocking", "protocols")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/compare.sh",
        description="Compare server configurations side by side: interleaved rounds, medians, CPU per request.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="main scenarios (--scenarios; * = also in --quick):\n" + "\n".join(
            f"  {s.name:27}{'*' if s in main_scenarios(quick=True) else ' '} {s.title}"
            for s in main_scenarios(quick=False)))
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
    p.add_argument("--fixed-scenarios", help="fixed phase: json-64 and/or json-object-64 (default both; --quick json-64)")
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
    p.add_argument("--scenarios", help="comma-separated subset of the main scenarios")
    p.add_argument("--order", choices=("blocks", "paired"), default="blocks",
                   help="main, fixed and protocols phases: blocks (default) runs one server at a time through all "
                        "its scenarios; paired starts every configuration's server of a round at once (all pinned "
                        "to the server CPUs, one loaded at a time) and measures each scenario on each of them back "
                        "to back, so a slow period of the machine falls on both sides of a ratio")
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
    args.scenarios = set(args.scenarios.split(",")) if args.scenarios else None
    if args.scenarios:
        unknown = args.scenarios - {s.name for s in main_scenarios(quick=False)}
        if unknown:
            p.error(f"unknown scenario(s) {sorted(unknown)}; known: "
                    + ", ".join(s.name for s in main_scenarios(quick=False)))
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
    unknown = set(args.fixed_scenarios) - {s.name for s in FIXED_SCENARIOS}
    if unknown:
        p.error(f"unknown fixed scenario(s) {sorted(unknown)}; known: {', '.join(s.name for s in FIXED_SCENARIOS)}")
    rates = {}
    for item in args.fixed_base_rate:
        for pair in item.split(","):
            name, _, value = pair.partition("=")
            try:
                rates[name] = float(value)
            except ValueError:
                p.error(f"--fixed-base-rate {pair!r}: expected SCENARIO=REQUESTS_PER_SECOND")
            if name not in {s.name for s in FIXED_SCENARIOS} or rates[name] <= 0:
                p.error(f"--fixed-base-rate {pair!r}: expected one of {', '.join(s.name for s in FIXED_SCENARIOS)} "
                        "and a positive rate")
    args.fixed_base_rate = rates
    if set(args.blocking_how) - {"sleep", "result", "lock"}:
        p.error("--blocking-how takes sleep, result and lock")
    if not 1 <= args.blocking_ms <= 60000:
        p.error("--blocking-ms must be 1-60000 (the sample's limit)")
    for model in args.hosting:
        if model not in HOSTING_MODELS:
            p.error(f"unknown hosting model {model!r}; known: {', '.join(HOSTING_MODELS)}")
    return args


def estimate_seconds(args: argparse.Namespace, configs: list[Config]) -> float:
    """A plan-based estimate; start/verify/stop is ~0.7 s per server, wrk adds ~0.1 s per run."""
    start, wrk_overhead = 0.7, 0.1
    scenarios = selected_scenarios(args)

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
        n = 1 if args.quick else len(HOSTING_SCENARIOS)
        setups = len(args.hosting) * len(args.hosting_transports)
        per_round += setups * (start + 0.4 + args.warmup_first + windows(HOSTING_SCENARIOS[:n]))
    if "sweep" in args.phases:
        counts = 1 if args.quick else len(args.sweep_threads)
        per_round += len(args.sweep_transports) * counts * (start + args.warmup_first + windows([SWEEP_SCENARIO]))
    loadgen_overhead = 2.3                  # connecting, the drain and a fresh loadgen per window
    fixed = [s for s in FIXED_SCENARIOS if s.name in args.fixed_scenarios]
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
            start + args.blocking_warmup + openloop.BLOCK_LEAD_S + args.blocking_ms / 1000 + openloop.BLOCK_TAIL_S
            + loadgen_overhead)
    if "protocols" in args.phases:
        # Two servers per configuration (HTTP/2 only, then HTTP/1.1 for the WebSocket upgrade), each primed.
        per_round += len(kestrel) * (2 * (start + args.warmup_first) + windows(PROTOCOL_SCENARIOS))
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

    runner = Runner(args, configs, table)

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
        "clk_tck": CLK_TCK,
    }
    print(f"compare: {len(configs)} configurations, {args.rounds} rounds, phases {','.join(args.phases)}; "
          f"estimated {estimate / 60:.1f} min; output {args.out}", flush=True)
    status = 0
    try:
        for phase in args.phases:
            try:
                getattr(runner, f"phase_{phase}")()
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
        runner.meta["libuv"] = libuv_version(runner.startup_lines.get("libuv", ""))
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


def libuv_version(startup_line: str) -> str:
    match = re.search(r"libuv[-_ ]?(?:version)?[=: ]v?(\d+\.\d+(?:\.\d+)?)", startup_line, re.IGNORECASE)
    return match.group(1) if match else ""


# A window in which other processes took this share of the benchmark's CPUs (hypervisor steal shows up here
# too) is measured again, up to --remeasure times. On this shared machine such windows came in runs: in one
# 5-round run Sockets' plaintext16-256 windows had 28-38% taken in rounds 3-5 and 0% in rounds 1-2, which
# moved its median by 2.4x and turned a 0.83x for linux into a 1.82x.
DISTURBED_OTHER_LOAD = 0.10
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
