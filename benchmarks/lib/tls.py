"""compare.py's tls phase: HTTPS at saturation, closed loop (issue 37.4), on servers started with --urls https://...
(the sample's self-signed certificate made at start; ALPN h2 and http/1.1):

  https-json-256  wrk over TLS: GET /json on 256 keep-alive connections (one handshake per connection);
  https-churn-64  benchmarks/loadgen -S -k -C: 64 connections, each request on a new connection with a full
                  handshake (loadgen keeps no session, so none is resumed: wrk and h2load resume theirs on a
                  reconnect, which measured 494 of 498 handshakes abbreviated against nginx);
  h2-tls-json     h2load over TLS, ALPN h2: GET /json, 16 connections x 16 streams;
  grpc-tls-unary  h2load over TLS: the protocols phase's gRPC unary call;
  h2-tls-download benchmarks/nodeload over TLS (node:http2, the stack undici's HTTP/2 client is built on): GET
                  /download/256, 4 connections x 4 streams, every byte checked;
  ws-tls-echo     benchmarks/wsload -S: WebSocket echo over TLS (wss), 16 connections.

Each scenario gets a fresh server per configuration and round, primed on that scenario alone, so the counters the
sample prints at exit (`TechEmpower: counters NAME=VALUE ...`, the transport meter's: loop hand-offs and the rest)
belong to one scenario: report.py gives them per request and per connection over the server's life, priming
included. With --order paired a round starts every configuration's server for a scenario side by side and measures
them back to back; otherwise one server runs at a time, in rotated order. The rest is the main phase's machinery
(runner.py): pinned server and client, CPU from /proc over the window, other load and re-measurement, and every
server verified over TLS before any load (verify.py for HTTP/1.1, curl for HTTP/2 with h2load, the tools' own
checks for nodeload and wsload).
"""

from __future__ import annotations

import json
import shlex
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
    Scenario("grpc-tls-unary", f"gRPC unary call echoing {protocols.GRPC_MESSAGE_BYTES} bytes over TLS, 16 connections "
             "× 16 streams (h2load)", protocols.GRPC_PATH, 16, 16, tls=True),
    Scenario("h2-tls-download", "256 KiB downloads over HTTP/2 over TLS, 4 connections × 4 streams (nodeload, "
             "node:http2)", "/download/256", 4, 4, tls=True),
    Scenario("ws-tls-echo", f"WebSocket echo of {protocols.WS_MESSAGE_BYTES}-byte messages over TLS, 16 connections, "
             "one message in flight each (wsload -S)", protocols.WS_PATH, 16, tls=True),
]
TOOLS = {"https-churn-64": "loadgen", "h2-tls-json": "h2load", "grpc-tls-unary": "h2load",
         "h2-tls-download": "nodeload", "ws-tls-echo": "wsload"}


def tool_of(scenario: Scenario) -> str:
    return TOOLS.get(scenario.name, "wrk")


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


def loader(runner: Runner, tally: dict, frame: Path):
    """run(url, scenario, seconds), the load of any scenario of the phase, for Runner.prime and Runner.measure. Every
    run adds the requests answered and the connections opened to tally (the server's life, for its counters). frame:
    the gRPC request's body, for h2load."""
    def run(url: str, scenario: Scenario, seconds: float) -> tuple[dict | None, str, float]:
        tool = tool_of(scenario)
        if tool == "wrk":
            result, command, cpu = runner.run_wrk(url, scenario, seconds, runner.args.client_cpus, runner.args.wrk_threads)
            connections = scenario.connections
        elif tool == "h2load":
            argv = protocols.h2load_argv(runner, url, scenario, seconds, frame)
            done, cpu = protocols.run_child(argv, seconds + 20)
            # An h2load that fell back to HTTP/1.1 (no h2 by ALPN) measured something else: no result.
            h2 = done is not None and "Application protocol: h2" in done.stdout
            answer = protocols.GRPC_FRAME if scenario.path == protocols.GRPC_PATH else protocols.JSON_HELLO
            result = protocols.h2load_result(done.stdout, len(answer)) if h2 else None
            command, connections = shlex.join(argv), scenario.connections
        elif tool in protocols.JSON_TOOLS:
            argv = protocols.JSON_TOOLS[tool](runner, url, scenario, seconds)
            result, cpu = protocols.run_json_tool(argv, seconds)
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


def checker(runner: Runner, frame: Path):
    """check(server, scenario) for Runner.open_server: curl for h2load's scenarios, the tool's own run for nodeload's
    and wsload's, verify.py's HTTP/1.1 checks (None) for the rest."""
    def check(server: MainServer, scenario: Scenario) -> tuple[str, str]:
        if tool_of(scenario) == "h2load":
            return protocols.check_h2(server.url, scenario, frame)
        return protocols.check_tool(runner, server, scenario, tool_of(scenario))
    return check


class ScenarioServer:
    """One configuration's fresh server for one scenario, with the tally of what its loads did over its life."""

    def __init__(self, runner: Runner, config, scenario: Scenario, round_no: int, frame: Path):
        self.tally = {"requests": 0, "connections": 0}
        self.run = loader(runner, self.tally, frame)
        self.records: list[dict] = []             # the window's records, for the counters at exit
        self.server = None
        if (config.name, scenario.path) in runner.unsupported or runner.skip(config, "middleware https"):
            return
        runner.check_interrupted()
        check = None if tool_of(scenario) in ("wrk", "loadgen") else checker(runner, frame)
        self.server = runner.open_server(config, "middleware", [scenario], round_no, phase="tls", tls=True,
                                         check=check, run_load=self.run)

    def measure(self, runner: Runner, scenario: Scenario, round_no: int) -> None:
        """One window, unless the server did not start or cannot serve the scenario."""
        server = self.server
        if server is None or scenario not in server.runnable:
            return
        before = len(runner.measurements)
        tool = tool_of(scenario)
        threads = {"h2load": protocols.h2load_threads(runner, scenario), "wrk": runner.args.wrk_threads}.get(tool, 1)
        extra = {"hosting": "direct", "threads": None, "tool": tool}
        runner.measure("tls", server.config.name, scenario, round_no, server.url, {"server": server.proc},
                       runner.args.warmup, runner.args.client_cpus, threads, len(runner.server_cpu_list), extra,
                       lambda seconds: self.run(server.url, scenario, seconds))
        self.records = runner.measurements[before:]

    def stop(self) -> None:
        """Stops the server; its exit counters, and what the loads did over its life, go into its window's records."""
        if self.server is None:
            return
        self.server.proc.stop()
        counters = self.server.exit_counters()
        for record in self.records:
            record.update(counters=counters, server_requests=self.tally["requests"],
                          server_connections=self.tally["connections"])


def run_group(runner: Runner, configs: list, scenario: Scenario, round_no: int, frame: Path) -> None:
    """Fresh servers for one scenario, one per configuration, started side by side, then measured back to back."""
    servers = []
    try:
        for config in configs:
            servers.append(ScenarioServer(runner, config, scenario, round_no, frame))
        for server in servers:
            server.measure(runner, scenario, round_no)
    finally:
        for server in servers:
            server.stop()


def phase_tls(runner: Runner, scenarios: list[Scenario] = TLS_SCENARIOS) -> None:
    args = runner.args
    todo = [s for s in scenarios if not args.scenarios or s.name in args.scenarios]
    for s, why in protocols.missing_tools(todo, tool_of, lambda s: tool_of(s) == "h2load"):
        if s in todo:
            runner.event("tls", "*", "skipped", why, s.name)
            todo.remove(s)
    runner.meta["tls"] = {"scenarios": [s.as_dict() for s in todo], "baseline": args.baseline, "order": args.order,
                          "h2load": protocols.h2load_version()}
    runner.save()
    configs = []
    for config in runner.configs:
        if config.kind == "ceiling":
            runner.event("tls", config.name, "unsupported", "the ceiling speaks plain HTTP/1.1 only")
        else:
            configs.append(config)
    frame = runner.tmp / "grpc-request.bin"
    frame.write_bytes(protocols.GRPC_FRAME)
    for round_no in range(1, args.rounds + 1):
        runner.log(f"tls: round {round_no}/{args.rounds}")
        if args.order == "paired":
            for scenario in runner.rotated(todo, round_no):
                run_group(runner, runner.rotated(configs, round_no), scenario, round_no, frame)
                runner.save()
        else:
            for config, scenario in runner.rotated([(c, s) for s in todo for c in configs], round_no):
                run_group(runner, [config], scenario, round_no, frame)
                runner.save()
