"""compare.py's tls phase: HTTPS at saturation, closed loop (issue 37.4), on servers started with --urls https://...
(the sample's self-signed certificate made at start; ALPN h2 and http/1.1):

  https-json-256  wrk over TLS: GET /json on 256 keep-alive connections (one handshake per connection);
  https-churn-64  benchmarks/loadgen -S -k -C: 64 connections, each request on a new connection with a full
                  handshake (loadgen keeps no session, so none is resumed: wrk and h2load resume theirs on a
                  reconnect, which measured 494 of 498 handshakes abbreviated against nginx);
  h2-tls-json     h2load over TLS, ALPN h2: GET /json, 16 connections x 16 streams.

Each scenario gets a fresh server per configuration and round, primed on that scenario alone, so the counters the
sample prints at exit (`TechEmpower: counters NAME=VALUE ...`, the transport meter's: loop hand-offs and the rest)
belong to one scenario: report.py gives them per request and per connection over the server's life, priming
included. The rest is the main phase's machinery (runner.py): pinned server and client, rotated rounds, CPU from
/proc over the window, other load and re-measurement, and every server verified over TLS before any load (verify.py
for HTTP/1.1, curl for HTTP/2).
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import protocols
from model import BIN, MainServer, Scenario
from runner import Runner

TLS_SCENARIOS = [
    Scenario("https-json-256", "JSON over HTTPS (HTTP/1.1), 256 keep-alive connections (wrk)", "/json", 256, tls=True),
    Scenario("https-churn-64", "handshake churn: GET /json, each request on a new TLS connection with a full "
             "handshake, 64 connections (loadgen -S -k -C)", "/json", 64, headers=("Connection: close",), tls=True),
    Scenario("h2-tls-json", "JSON over HTTP/2 over TLS (ALPN h2), 16 connections × 16 streams (h2load)", "/json", 16,
             16, tls=True),
]


def tool_of(scenario: Scenario) -> str:
    return {"https-churn-64": "loadgen", "h2-tls-json": "h2load"}.get(scenario.name, "wrk")


def loadgen_result(output: str) -> dict | None:
    """loadgen's JSON (closed loop, no warm-up) in WRK_RESULT's shape, with its handshake counts."""
    try:
        result = json.loads(output)
    except ValueError:
        return None
    return {"requests": result["recorded"], "duration_us": result["duration_s"] * 1e6, "bytes": 0,
            "errors": result["errors"], "latency_us": result["latency_us"], "completed": result["completed"],
            "connections": result["connections_opened"], "handshakes": result["handshakes"],
            "resumed": result["resumed"]}


def loader(runner: Runner, tally: dict):
    """run(url, scenario, seconds), the load of any scenario of the phase, for Runner.prime and Runner.measure. Every
    run adds the requests answered and the connections opened to tally (the server's life, for its counters)."""
    def run(url: str, scenario: Scenario, seconds: float) -> tuple[dict | None, str, float]:
        tool = tool_of(scenario)
        if tool == "wrk":
            result, command, cpu = runner.run_wrk(url, scenario, seconds, runner.args.client_cpus, runner.args.wrk_threads)
            connections = scenario.connections
        elif tool == "h2load":
            argv = protocols.h2load_argv(runner, url, scenario, seconds, Path("/dev/null"))
            done, cpu = protocols.run_child(argv, seconds + 20)
            # An h2load that fell back to HTTP/1.1 (no h2 by ALPN) measured something else: no result.
            h2 = done is not None and "Application protocol: h2" in done.stdout
            result = protocols.h2load_result(done.stdout, len(protocols.JSON_HELLO)) if h2 else None
            command, connections = shlex.join(argv), scenario.connections
        else:
            argv = ["taskset", "-c", runner.args.client_cpus, str(BIN / "loadgen"), "-S", "-k", "-C", "-a", "127.0.0.1",
                    "-p", url.rsplit(":", 1)[1], "-P", scenario.path, "-c", str(scenario.connections),
                    "-d", f"{max(1, round(seconds)):g}", "-w", "0", "-T", "2"]
            done, cpu = protocols.run_child(argv, seconds + 30)
            result = loadgen_result(done.stdout) if done and done.returncode == 0 else None
            command, connections = shlex.join(argv), result["connections"] if result else 0
        if result:
            tally["requests"] += result.get("completed", result["requests"])
            tally["connections"] += connections
        return result, command, cpu
    return run


def check_h2(server: MainServer, scenario: Scenario) -> tuple[str, str]:
    return protocols.check_h2(server.url, scenario, Path("/dev/null"))


def run_scenario(runner: Runner, config, scenario: Scenario, round_no: int) -> None:
    """A fresh server for one scenario: started on https, verified, primed, measured, stopped; its exit counters
    then go into the window's record."""
    if (config.name, scenario.path) in runner.unsupported or runner.skip(config, "middleware https"):
        return
    runner.check_interrupted()
    tally = {"requests": 0, "connections": 0}
    run = loader(runner, tally)
    server = runner.open_server(config, "middleware", [scenario], round_no, phase="tls", tls=True,
                                check=check_h2 if tool_of(scenario) == "h2load" else None, run_load=run)
    if server is None:
        return
    before = len(runner.measurements)
    try:
        if scenario in server.runnable:
            threads = protocols.h2load_threads(runner, scenario) if tool_of(scenario) == "h2load" else (
                1 if tool_of(scenario) == "loadgen" else runner.args.wrk_threads)
            extra = {"hosting": "direct", "threads": None, "tool": tool_of(scenario)}
            runner.measure("tls", config.name, scenario, round_no, server.url, {"server": server.proc},
                           runner.args.warmup, runner.args.client_cpus, threads, len(runner.server_cpu_list), extra,
                           lambda seconds: run(server.url, scenario, seconds))
    finally:
        server.proc.stop()
    counters = server.exit_counters()
    for record in runner.measurements[before:]:
        record.update(counters=counters, server_requests=tally["requests"], server_connections=tally["connections"])


def phase_tls(runner: Runner, scenarios: list[Scenario] = TLS_SCENARIOS) -> None:
    args = runner.args
    todo = list(scenarios)
    for tool, hint in (("h2load", protocols.H2LOAD_HINT), ("curl", "apt-get install curl")):
        if not shutil.which(tool):
            for s in [s for s in todo if tool_of(s) == "h2load"]:
                runner.event("tls", "*", "skipped", f"{tool} is not installed ({hint})", s.name)
            todo = [s for s in todo if tool_of(s) != "h2load"]
    runner.meta["tls"] = {"scenarios": [s.as_dict() for s in todo], "baseline": args.baseline,
                          "h2load": protocols.h2load_version()}
    runner.save()
    configs = []
    for config in runner.configs:
        if config.kind == "ceiling":
            runner.event("tls", config.name, "unsupported", "the ceiling speaks plain HTTP/1.1 only")
        else:
            configs.append(config)
    for round_no in range(1, args.rounds + 1):
        runner.log(f"tls: round {round_no}/{args.rounds}")
        for config, scenario in runner.rotated([(c, s) for s in todo for c in configs], round_no):
            run_scenario(runner, config, scenario, round_no)
            runner.save()
