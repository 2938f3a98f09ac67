"""The runner of compare.py's phases: it starts, verifies and primes servers, puts wrk's load on them, measures each
window (CPU from /proc, other load, re-measurement) and keeps the records and events that report.py reads. The
phases (saturated.py, latency.py, hosting.py, openloop.py, protocols.py) drive it through its methods.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import verify
from model import (BIN, BULK_RESPONSE_BYTES, CORE_PATHS, PIPELINE_LUA, STRIPPED_ENV_PREFIXES, USAGE_EXIT_CODE, Config,
                   Interrupted, MainServer, Scenario, StartResult)
from procs import (STARTUP_TIMEOUT_S, PerfStat, Proc, cpu_busy_seconds, cpu_list, framework_version, free_port,
                   loaded_kestrel)

# A window in which other processes took this share of the benchmark's CPUs (hypervisor steal shows up here
# too) is measured again, up to --remeasure times. On this shared machine such windows came in runs: in one
# 5-round run Sockets' plaintext16-256 windows had 28-38% taken in rounds 3-5 and 0% in rounds 1-2, which
# moved its median by 2.4x and turned a 0.83x for linux into a 1.82x.
DISTURBED_OTHER_LOAD = 0.10


class Runner:
    def __init__(self, args: argparse.Namespace, configs: list[Config], table: list[Config] | None = None,
                 dotnet_roots: dict[str, Path] | None = None) -> None:
        self.args = args
        self.dotnet_roots = dotnet_roots or {}     # runtime -> its DOTNET_ROOT, for configurations with one
        self.runtimes_seen: dict[str, dict] = {}   # config -> the frameworks its servers really ran on
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
        self.latency_rate: float | None = None      # the latency phase's rate, and where it came from
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
        seen = self.runtimes_seen.get(c.name, {})
        return {"name": c.name, "kind": c.kind, "env": c.env, "alternatives": c.alternatives,
                "line": c.line, "startup_line": self.startup_lines.get(c.name, ""),
                "command": self.commands.get(c.name, ""), "origin": c.origin, "runtime": c.runtime,
                "runtime_seen": ", ".join(seen.get("versions", [])), "kestrel_core": seen.get("kestrel", "")}

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
        log_path = self.logs / f"{self.server_count:04d}-{re.sub(r'[^A-Za-z0-9@._-]+', '-', label)}.log"
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

        scheme = "https" if target.tls else "http"
        url = f"http://unix:{target.path}" if target.kind == "unix" else f"{scheme}://{target.host}:{target.port}"
        mode_alternatives = [["--mode", mode]] + ([[]] if mode == "middleware" else [])
        key = (config.name, mode)
        if key in self.chosen_alternative:
            candidates = [self.chosen_alternative[key]]
        else:
            candidates = [a + m for a in config.alternatives for m in mode_alternatives]
        dotnet = ["dotnet"]
        if config.runtime and self.dotnet_roots.get(config.runtime):
            root = self.dotnet_roots[config.runtime]
            env.update(DOTNET_ROOT=str(root), DOTNET_ROLL_FORWARD="LatestMajor")
            dotnet = [str(root / "dotnet")]
        rejected = []
        for sample_args in candidates:
            argv = taskset + dotnet + [str(config.sample_dll), "--urls", url] + sample_args + list(extra_args)
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
            wrong = self.check_runtime(config, proc)
            if wrong:
                proc.stop()
                return StartResult(None, "failed", wrong, argv=argv)
            return StartResult(proc, "ok", startup_line=line, argv=argv)
        return StartResult(None, "unsupported", "the sample rejected " + "; ".join(rejected))

    def check_runtime(self, config: Config, proc: Proc) -> str:
        """Records the shared framework a started server really runs on, from the Kestrel.Core it mapped; a reason
        when that is not the configuration's runtime (so a table never labels a .NET 10 run as .NET 11)."""
        path = loaded_kestrel(proc.pid)
        version = framework_version(path)
        seen = self.runtimes_seen.setdefault(config.name, {"versions": [], "kestrel": path})
        if version and version not in seen["versions"]:
            seen["versions"].append(version)
        if config.runtime and version.split(".")[0] != config.runtime:
            return (f"asked for .NET {config.runtime}, but the server mapped "
                    f"{path or 'no Kestrel.Core (not in /proc/PID/maps)'}")
        return ""

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

    def rows_named(self, names: list[str]) -> list[Config]:
        """The selected configurations named in `names`, or made from them by --runtimes (linux: linux@10, linux@11)."""
        return [c for n in names for c in self.configs if c.name == n or (c.origin == n and c.name != c.origin)]

    def baseline_row(self) -> Config | None:
        """--baseline's row of the table, on the first of --runtimes when it was made per runtime."""
        base = self.args.baseline
        return self.table.get(base) or next((c for c in self.table.values() if c.origin == base), None)

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
        for key in ("handshakes", "resumed", "connections"):     # loadgen's, over TLS (tls.py)
            if key in result:
                record[key] = result[key]
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

    # -- what every phase does --

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

    def open_server(self, config: Config, mode: str, todo: list[Scenario], round_no: int, phase: str = "main",
                    cpus: str | None = None, threads: int | None = None, prime: bool = True,
                    extra_args: tuple[str, ...] = (), check=None, run_load=None, tls: bool = False) -> MainServer | None:
        """Starts and verifies one configuration's server for a phase (pinned to `cpus`, default the server
        CPUs), and primes it on the scenarios it can serve. None when it did not start or failed verification
        (recorded as an event). The protocols phase's servers take more arguments (extra_args), are verified by
        check(server, scenario) -> (state, reason) instead of verify.py's HTTP/1.1 checks (an HTTP/2-only
        server still answers an HTTP/1.1 request, with 400, which is all the start-up waits for), and are
        primed with run_load (see prime). With tls the server listens on https:// and is verified over TLS."""
        port = free_port(self.ports)
        target = verify.Target("tcp", host="127.0.0.1", port=port, tls=tls)
        server_mode = "middleware" if mode == "any" else mode
        # A build that rejects the extra arguments is unsupported with them, not in its mode.
        key = " ".join([mode, *extra_args] + (["https"] if tls else []))
        if (config.name, key) in self.unsupported:
            return None                         # found unsupported with these arguments earlier in the run
        started = self.start_server(config, server_mode, target, cpus or self.args.server_cpus, threads,
                                    f"{phase}-r{round_no}-{config.name}-{key.replace(' --', '-').replace(' ', '-')}",
                                    extra_args)
        if started.state != "ok":
            self.start_failed(phase, config, key, started, "*", round_no, mode)
            return None
        server = MainServer(config, started.proc, f"{'https' if tls else 'http'}://127.0.0.1:{port}", [])
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

