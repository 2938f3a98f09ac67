"""compare.py's latency phase: open-loop latency of GET /json over 256 connections with benchmarks/loadgen at one fixed
rate (a sixth of the baseline's json-256 throughput unless --latency-rate), each server primed with wrk first.
"""

from __future__ import annotations

import json
import resource
import shlex
import statistics
import subprocess
import time

import verify
from model import BIN, CORE_PATHS, JSON_256, Scenario
from procs import Proc, cpu_busy_seconds, cpu_count, free_port
from runner import Runner

LATENCY_RATE_DIVISOR = 6           # the open-loop rate: the baseline's closed-loop json-256 rate over this


def phase_latency(runner: Runner) -> None:
    if runner.args.latency_rate:
        runner.latency_rate, runner.latency_rate_source = runner.args.latency_rate, "--latency-rate"
    elif runner.args.quick:
        runner.latency_rate, runner.latency_rate_source = 2000.0, "fixed low rate for --quick"
    else:
        baseline = runner.baseline_row()
        base = baseline.name if baseline else runner.args.baseline
        values = [m["rps"] for m in runner.measurements
                  if m["phase"] == "main" and m["scenario"] == "json-256" and m["config"] == base
                  and m["error_total"] == 0]
        source = base
        if not values:
            # Fall back to the slowest configuration measured, so the rate is sustainable for all.
            medians = {}
            for m in runner.measurements:
                if m["phase"] == "main" and m["scenario"] == "json-256" and m["config"] != "ceiling":
                    medians.setdefault(m["config"], []).append(m["rps"])
            if not medians:
                runner.event("latency", "*", "skipped", "no json-256 measurement to derive the rate from")
                return
            source, values = min(((k, v) for k, v in medians.items()), key=lambda kv: statistics.median(kv[1]))
        # Open loop, requests arrive one at a time and each pays for waking the loop and a pool
        # worker: with the pool's spinning off (spin limit 0) both transports took 54-61 us of CPU
        # per request at 10K req/s, four to five times their closed-loop cost. At half the closed-loop
        # rate every server ran its CPU flat out, so the phase measured queueing; a sixth leaves
        # the baseline about a third of its CPU. (With the spinning on, the CPU share says
        # nothing here: idle workers spin it away at any rate.)
        runner.latency_rate = round(statistics.median(values) / LATENCY_RATE_DIVISOR, -2)
        runner.latency_rate_source = (f"{source}'s median json-256 throughput in this run, "
                                      f"{statistics.median(values):.0f} req/s, divided by {LATENCY_RATE_DIVISOR}")
    runner.meta["latency"] = {"rate": runner.latency_rate, "rate_source": runner.latency_rate_source,
                              "connections": 256, "path": "/json", "duration_s": runner.args.latency_duration,
                              "warmup_s": runner.args.latency_warmup}
    scenario = Scenario("json-256-open-loop", "JSON, 256 connections, open loop at a fixed rate", "/json", 256)
    for round_no in range(1, runner.args.rounds + 1):
        runner.log(f"latency: round {round_no}/{runner.args.rounds} at {runner.latency_rate:.0f} req/s")
        for config in runner.rotated(runner.configs, round_no):
            if runner.skip(config, "latency"):
                continue
            runner.check_interrupted()
            port = free_port(runner.ports)
            target = verify.Target("tcp", host="127.0.0.1", port=port)
            started = runner.start_server(config, "middleware", target, runner.args.server_cpus, None,
                                          f"latency-r{round_no}-{config.name}")
            try:
                if started.state != "ok":
                    runner.start_failed("latency", config, "latency", started, scenario.name, round_no, None)
                    continue
                if runner.verify_server("latency", config.name, target, CORE_PATHS, round_no, None) is None:
                    continue
                if config.kind != "ceiling":
                    runner.prime(f"http://127.0.0.1:{port}", [JSON_256], runner.args.warmup_first,
                                 runner.args.client_cpus, runner.args.wrk_threads)
                runner.run_wrk(f"http://127.0.0.1:{port}", JSON_256, runner.args.warmup,
                               runner.args.client_cpus, runner.args.wrk_threads)
                run_loadgen(runner, config.name, scenario, round_no, port, started.proc)
            finally:
                if started.proc:
                    started.proc.stop()
        runner.save()


def run_loadgen(runner: Runner, config: str, scenario: Scenario, round_no: int, port: int, proc: Proc) -> None:
    argv = ["taskset", "-c", runner.args.client_cpus, str(BIN / "loadgen"), "-a", "127.0.0.1", "-p", str(port),
            "-P", scenario.path, "-c", str(scenario.connections), "-r", f"{runner.latency_rate:.0f}",
            "-d", f"{runner.args.latency_duration:g}", "-w", f"{runner.args.latency_warmup:g}", "-T", "2"]
    cpu_before = proc.cpu_seconds()
    busy_before = cpu_busy_seconds(runner.bench_cpus)
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True,
                              timeout=runner.args.latency_warmup + runner.args.latency_duration + 20)
    except subprocess.TimeoutExpired:
        runner.event("latency", config, "failed", "loadgen timed out", scenario.name, round_no)
        return
    wall = time.monotonic() - t0
    busy = cpu_busy_seconds(runner.bench_cpus) - busy_before
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_cpu = (usage.ru_utime - usage_before.ru_utime) + (usage.ru_stime - usage_before.ru_stime)
    cpu = proc.cpu_seconds() - cpu_before
    if done.returncode != 0 or not done.stdout.strip():
        runner.event("latency", config, "failed", f"loadgen failed: {done.stderr.strip()[-300:]}",
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
              "server_cpu_util": cpu / wall / cpu_count(runner.args.server_cpus),
              "load_cpu_util": load_cpu / wall, "other_cpu_util": runner.other_load(busy, cpu + load_cpu, wall),
              "errors": errors, "error_total": error_total,
              "error_rate": error_total / max(1, result["recorded"]),
              "latency_us": result["latency_us"], "send_lag_us": result["send_lag_us"],
              "command": shlex.join(argv), "hosting": "direct", "threads": None}
    runner.measurements.append(record)
    lat = result["latency_us"]
    flag = f"  ERRORS {errors}" if error_total else ""
    runner.log(f"    {config:16} p50 {lat['p50']:9.0f} us  p99 {lat['p99']:9.0f} us  "
               f"p99.9 {lat['p99.9']:9.0f} us  ({result['achieved_rate']:.0f} req/s){flag}")
