"""compare.py's protocols phase: HTTP/2, gRPC and WebSocket throughput at saturation, closed loop (issue 32 asks
that Adaptive scheduling's be at least ThreadPool's).

  h2-json     h2load (nghttp2) over HTTP/2 with prior knowledge (h2c): GET /json, connections × streams;
  grpc-unary  h2load: POST to the sample's gRPC method (samples/TechEmpower/Protocols/EchoService.cs), each request
              one length-prefixed gRPC message, which the method echoes;
  grpc-bidi   benchmarks/nodeload (Node's node:http2, the stack undici's HTTP/2 client is built on): bidirectional
              streaming calls to the same service, each keeping one message in flight and checking its echo;
  ws-echo     benchmarks/wsload: WebSocket connections, each sending a message and waiting for its echo;
  h1-4000, h1-pipelined-64
              h2load over HTTP/1.1 (--h1): GET /plaintext over 4,000 keep-alive connections, and 64 connections with
              16 requests pipelined on each (a client other than wrk, whose pipelining is a Lua script).

Without TLS Kestrel serves an endpoint's default Http1AndHttp2 as HTTP/1.1 only, so the HTTP/2 scenarios run on a
server started with --protocols http2, and ws-echo (an HTTP/1.1 upgrade) and the h1- ones on one with Kestrel's
default: each round starts two servers per configuration. The rest is the main phase's machinery, through the Runner
(runner.py): pinned server and client, rotated rounds (--order paired: the round's servers side by side, each scenario measured
on every one back to back), priming and warm-up, CPU from /proc over the window, other load and re-measurement,
and every server verified before any load: /json's exact body over HTTP/2, a gRPC call's echo and grpc-status 0
(curl), streamed echoes (nodeload), WebSocket echoes (wsload), and /plaintext over HTTP/1.1 (verify.py). The tls
phase (tls.py) runs the same load generators over TLS.
"""

from __future__ import annotations

import json
import resource
import shlex
import shutil
import subprocess
from pathlib import Path

import verify
from model import Config, MainServer, Scenario
from runner import Runner

GRPC_PATH = "/techempower.Echo/Unary"
GRPC_BIDI_PATH = "/techempower.Echo/Bidi"
GRPC_MESSAGE = b"TechEmpower gRPC unary payload"                 # 30 bytes
GRPC_MESSAGE_BYTES = len(GRPC_MESSAGE)
# A gRPC message on the wire: a compressed flag (0) and a 4-byte big-endian length before the bytes.
GRPC_FRAME = b"\0" + GRPC_MESSAGE_BYTES.to_bytes(4, "big") + GRPC_MESSAGE
JSON_HELLO = verify.JSON_HELLO
WS_PATH = "/ws"
WS_MESSAGE_BYTES = 32
HTTP2, HTTP1 = "http2", "http1"            # which server a scenario runs on: --protocols http2, or Kestrel's default
H2LOAD_HINT = "apt-get install nghttp2-client"
NODE_HINT = "apt-get install nodejs"
NODELOAD = Path(__file__).resolve().parents[1] / "nodeload" / "nodeload.mjs"


# At saturation: depth is the requests in flight per connection (HTTP/2 streams, or the one WebSocket message each
# connection waits for).
PROTOCOL_SCENARIOS = [
    Scenario("h2-json", "JSON over HTTP/2 with prior knowledge (h2c), 16 connections × 16 streams (h2load)",
             "/json", 16, 16),
    Scenario("grpc-unary", f"gRPC unary call echoing {GRPC_MESSAGE_BYTES} bytes, 16 connections × 16 "
             "streams (h2load)", GRPC_PATH, 16, 16),
    Scenario("grpc-bidi", f"gRPC bidirectional streaming, echoes of {WS_MESSAGE_BYTES} bytes, 4 connections × 16 "
             "calls, one message in flight each (nodeload)", GRPC_BIDI_PATH, 4, 16),
    Scenario("ws-echo", f"WebSocket echo of {WS_MESSAGE_BYTES}-byte messages, 16 connections, one message "
             "in flight each (wsload)", WS_PATH, 16),
    Scenario("h1-4000", "plaintext over HTTP/1.1, 4,000 keep-alive connections (h2load --h1)", "/plaintext", 4000),
    Scenario("h1-pipelined-64", "plaintext over HTTP/1.1, 64 connections × 16 requests pipelined (h2load --h1)",
             "/plaintext", 64, 16),
]


def protocol_of(scenario: Scenario) -> str:
    return HTTP1 if scenario.path == WS_PATH or scenario.name.startswith("h1-") else HTTP2


def tool_of(scenario: Scenario) -> str:
    return {WS_PATH: "wsload", GRPC_BIDI_PATH: "nodeload"}.get(scenario.path, "h2load")


def missing_tools(scenarios: list[Scenario], tool_of, needs_curl) -> list[tuple[Scenario, str]]:
    """(scenario, why it cannot run here) for each scenario whose load generator or verifier is not installed."""
    needs = [("h2load", H2LOAD_HINT, lambda s: tool_of(s) == "h2load"),
             ("node", NODE_HINT, lambda s: tool_of(s) == "nodeload"),
             ("curl", "apt-get install curl", needs_curl)]
    return [(s, f"{tool} is not installed ({hint})") for tool, hint, need in needs if not shutil.which(tool)
            for s in scenarios if need(s)]


# ---- the load generators, each run returning (result in WRK_RESULT's shape or None, command, its CPU seconds) ----

def run_child(argv: list[str], timeout: float) -> tuple[subprocess.CompletedProcess | None, float]:
    """Runs a load generator to its end: (the finished process or None on a timeout, its CPU seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, 0.0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def h2load_threads(runner: Runner, scenario: Scenario) -> int:
    return min(runner.args.wrk_threads, scenario.connections)


def h2load_argv(runner: Runner, url: str, scenario: Scenario, seconds: float, frame: Path) -> list[str]:
    argv = ["taskset", "-c", runner.args.client_cpus, "h2load", "-c", str(scenario.connections),
            "-m", str(scenario.depth), "-t", str(h2load_threads(runner, scenario)), "-D", f"{seconds:g}"]
    if protocol_of(scenario) == HTTP1:
        argv.append("--h1")
    if scenario.path == GRPC_PATH:
        argv += ["-d", str(frame), "-H", "content-type: application/grpc", "-H", "te: trailers"]
    return argv + [url + scenario.path]


def h2load_result(output: str, answer_bytes: int) -> dict | None:
    """h2load's summary in WRK_RESULT's shape, or None without one. Requests are the 2xx answers; the errors are its
    failed requests with another status (status), its stream and connection errors (errored), its timeouts, and
    answers whose DATA falls short of answer_bytes each (short: a gRPC call that failed has trailers only)."""
    lines = {line.split(":", 1)[0]: line.replace(",", "").split() for line in output.splitlines() if ":" in line}
    finished = next((line.replace(",", "").split() for line in output.splitlines() if line.startswith("finished in ")),
                    None)
    if finished is None or not {"requests", "status codes", "traffic", "time for request"} <= lines.keys():
        return None
    words = lines["requests"]
    counts = {words[i + 1]: int(words[i]) for i in range(1, len(words) - 1, 2)}
    ok = int(lines["status codes"][2])
    traffic = lines["traffic"]
    data = int(traffic[traffic.index("data") - 1].strip("()"))
    short = max(0, ok * answer_bytes - data) // answer_bytes
    timing = lines["time for request"]     # min, max, mean, sd, +/- sd
    return {"requests": ok - short, "duration_us": duration_us(finished[2]), "bytes": int(traffic[2].strip("()")),
            "errors": {"status": counts["failed"] - counts["errored"], "errored": counts["errored"],
                       "timeout": counts["timeout"], "short": short},
            "latency_us": {"mean": duration_us(timing[5]), "max": duration_us(timing[4])}}


def duration_us(text: str) -> float:
    """h2load's durations: 140us, 14.34ms, 3.00s."""
    for unit, scale in (("us", 1.0), ("ms", 1e3), ("s", 1e6)):
        if text.endswith(unit):
            return float(text[:-len(unit)]) * scale
    raise ValueError(f"not an h2load duration: {text!r}")


def wsload_argv(runner: Runner, url: str, scenario: Scenario, seconds: float) -> list[str]:
    return ["taskset", "-c", runner.args.client_cpus, str(runner.wsload), "-p", url.rsplit(":", 1)[1], "-P",
            scenario.path, "-c", str(scenario.connections), "-d", f"{seconds:g}", "-s", str(WS_MESSAGE_BYTES)] + (
        ["-S"] if url.startswith("https://") else [])


def nodeload_argv(runner: Runner, url: str, scenario: Scenario, seconds: float) -> list[str]:
    """GET requests of scenario.path (a /download/{kib} answer checked byte for byte), or, on the gRPC streaming
    method, one message in flight per call: connections × depth requests or calls."""
    argv = ["taskset", "-c", runner.args.client_cpus, "node", str(NODELOAD), "--url", url, "--path", scenario.path,
            "-c", str(scenario.connections), "-m", str(scenario.depth), "-d", f"{seconds:g}"]
    if scenario.path == GRPC_BIDI_PATH:
        return argv + ["--mode", "grpc-bidi", "--size", str(WS_MESSAGE_BYTES)]
    argv += ["--mode", "get"]
    if scenario.path.startswith("/download/"):
        argv += ["--expect-bytes", str(int(scenario.path.rsplit("/", 1)[1]) * 1024)]
    return argv


# The load generators that print one JSON line in WRK_RESULT's shape: their argv(runner, url, scenario, seconds).
JSON_TOOLS = {"wsload": wsload_argv, "nodeload": nodeload_argv}


def run_json_tool(argv: list[str], seconds: float) -> tuple[dict | None, float]:
    """wsload's or nodeload's run: its one JSON line (WRK_RESULT's shape), or None, and its CPU seconds."""
    done, cpu = run_child(argv, seconds + 20)
    ok = done is not None and done.returncode == 0 and done.stdout.strip()
    return (json.loads(done.stdout) if ok else None), cpu


def loader(runner: Runner, frame: Path):
    """run(url, scenario, seconds), the load of any scenario of the phase, for Runner.prime and Runner.measure."""
    def run(url: str, scenario: Scenario, seconds: float) -> tuple[dict | None, str, float]:
        if tool_of(scenario) in JSON_TOOLS:
            argv = JSON_TOOLS[tool_of(scenario)](runner, url, scenario, seconds)
            result, cpu = run_json_tool(argv, seconds)
        else:
            argv = h2load_argv(runner, url, scenario, seconds, frame)
            done, cpu = run_child(argv, seconds + 20)
            answer = len(GRPC_FRAME) if scenario.path == GRPC_PATH else len(verify.HELLO) if protocol_of(
                scenario) == HTTP1 else len(JSON_HELLO)
            result = h2load_result(done.stdout, answer) if done else None
        return result, shlex.join(argv), cpu
    return run


# ---- verification -------------------------------------------------------------------------------

def curl(url: str, *options: str, timeout: float = 5.0) -> tuple[int, str, str, bytes]:
    """One request with curl over HTTP/2, with prior knowledge (h2c) or, for https://, by ALPN (the certificate not
    verified): (status, HTTP version, headers and trailers, body); status 0 when it failed."""
    argv = ["curl", *(["--http2", "-k"] if url.startswith("https://") else ["--http2-prior-knowledge"]), "-sS", "--max-time", f"{timeout:g}", "-D", "-", "-o", "/dev/stderr",
            "-w", r"\n%{http_code} %{http_version}", *options, url]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout + 5)
    except subprocess.TimeoutExpired:
        return 0, "", "curl timed out", b""
    head, _, tail = done.stdout.decode("latin-1").rpartition("\n")
    status, _, version = tail.partition(" ")
    if done.returncode != 0 or not status.isdigit():
        return 0, "", done.stderr.decode("latin-1").strip()[-200:], b""
    return int(status), version, head, done.stderr


def check_h2(url: str, scenario: Scenario, frame: Path) -> tuple[str, str]:
    """("ok" | "missing" | "bad", reason) for one HTTP/2 scenario, as verify.check_response says it."""
    if scenario.path == GRPC_PATH:
        status, version, head, body = curl(url + GRPC_PATH, "--data-binary", f"@{frame}",
                                           "-H", "content-type: application/grpc", "-H", "te: trailers")
        expected = GRPC_FRAME
    else:
        status, version, head, body = curl(url + scenario.path)
        expected = JSON_HELLO
    what = f"{scenario.path} over {'h2 (TLS, ALPN)' if url.startswith('https://') else 'h2c'}"
    if status == 404:
        return "missing", f"{what} answered 404 (not served by this build)"
    if status != 200 or version != "2":
        return "bad", f"{what}: status {status}, HTTP version {version or '?'} {head.strip()[-200:]}"
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head.splitlines()[1:])}
    problems = []
    if scenario.path == GRPC_PATH:
        if fields.get("content-type") != "application/grpc":
            problems.append(f"content-type {fields.get('content-type')!r}")
        if fields.get("grpc-status") != "0":   # a trailer: curl writes trailers after the headers
            problems.append(f"grpc-status {fields.get('grpc-status')!r} {fields.get('grpc-message', '')}")
    elif (fields.get("content-type") or "").split(";")[0] != "application/json":
        problems.append(f"content-type {fields.get('content-type')!r}")
    if body != expected:
        problems.append(f"body {body[:80]!r}, expected {expected!r}")
    return ("bad", f"{what}: " + "; ".join(problems)) if problems else ("ok", "")


def check_tool(runner: Runner, server: MainServer, scenario: Scenario, tool: str) -> tuple[str, str]:
    """A short wsload or nodeload run on one connection (one stream): every echo or answer verified by the tool, the
    closing handshake answered. A path the build does not serve is "missing": wsload's upgrade answered 404, or
    nodeload's every answer a wrong status (a gRPC method the service lacks answers grpc-status 12). nodeload gets
    a second: its first request is sent on the clock, and a fresh server's first 256 KiB over TLS took over 0.2 s.
    tool: the phase's name for the scenario's load generator, a key of JSON_TOOLS."""
    argv = JSON_TOOLS[tool](runner, server.url, scenario, 0.2 if tool == "wsload" else 1.0)
    argv[argv.index("-c") + 1] = "1"
    if "-m" in argv:
        argv[argv.index("-m") + 1] = "1"
    done, _ = run_child(argv, 15)
    if done is None:
        return "bad", f"{tool} timed out"
    if done.returncode != 0:
        reason = done.stderr.strip()[-200:]
        return ("missing" if "HTTP/1.1 404" in reason else "bad"), f"{scenario.path}: {reason}"
    result = json.loads(done.stdout)
    errors = {k: v for k, v in result["errors"].items() if v}
    if result["requests"] == 0 and set(errors) == {"status"}:
        return "missing", f"{scenario.path}: every answer had the wrong status ({tool}: not served by this build)"
    if errors or result["requests"] == 0:
        return "bad", f"{scenario.path}: {result['requests']} answers, errors {errors}"
    return "ok", ""


# ---- the phase ----------------------------------------------------------------------------------

def open_server(runner: Runner, config: Config, protocol: str, todo: list[Scenario], round_no: int,
                frame: Path) -> MainServer | None:
    """A started, verified and primed server for one protocol's scenarios (those it serves are its runnable ones), or
    None, recorded as an event."""
    extra_args = ("--protocols", "http2") if protocol == HTTP2 else ()
    todo = [s for s in todo if (config.name, s.path) not in runner.unsupported]
    if not todo or runner.skip(config, " ".join(["middleware", *extra_args])):
        return None
    runner.check_interrupted()
    def check(server: MainServer, scenario: Scenario) -> tuple[str, str]:
        if tool_of(scenario) in JSON_TOOLS:
            return check_tool(runner, server, scenario, tool_of(scenario))
        if protocol == HTTP2:
            return check_h2(server.url, scenario, frame)
        result = verify.verify(verify.Target.parse(server.url), [scenario.path])
        state = result.state(scenario.path)
        return ("bad", "; ".join(result.problems)) if state[0] == "ok" and result.problems else state
    return runner.open_server(config, "middleware", todo, round_no, phase="protocols", extra_args=extra_args,
                              check=check, run_load=loader(runner, frame))


def measure(runner: Runner, server: MainServer, scenario: Scenario, round_no: int, frame: Path) -> bool:
    run = loader(runner, frame)
    threads = h2load_threads(runner, scenario) if tool_of(scenario) == "h2load" else 1
    return runner.measure("protocols", server.config.name, scenario, round_no, server.url, {"server": server.proc},
                          runner.args.warmup, runner.args.client_cpus, threads, len(runner.server_cpu_list),
                          {"hosting": "direct", "threads": None, "protocol": protocol_of(scenario)},
                          lambda seconds: run(server.url, scenario, seconds))


def phase_protocols(runner: Runner, scenarios: list[Scenario] = PROTOCOL_SCENARIOS) -> None:
    args = runner.args
    todo = [s for s in scenarios if not args.scenarios or s.name in args.scenarios]
    # h2load runs the HTTP/2 and h1- scenarios, and curl verifies the HTTP/2 ones it runs; node runs nodeload.
    for s, why in missing_tools(todo, tool_of, lambda s: tool_of(s) == "h2load" and protocol_of(s) == HTTP2):
        if s in todo:
            runner.event("protocols", "*", "skipped", why, s.name)
            todo.remove(s)
    if args.quick:
        # h2load -c 4000 sometimes never exits, against Sockets too: the connections past the listen backlog connect
        # after SYN retries, up to 2 s in, and such a run goes on sending past its duration. A full run records the
        # lost window as failed and goes on; --quick, which fails on any, leaves the scenario out rather than fail CI
        # on the load generator.
        for s in [s for s in todo if s.name == "h1-4000"]:
            runner.event("protocols", "*", "skipped", "not in --quick: h2load -c 4000 sometimes never exits", s.name)
        todo = [s for s in todo if s.name != "h1-4000"]
    runner.meta["protocols"] = {"scenarios": [s.as_dict() for s in todo], "order": args.order,
                                "grpc_message_bytes": GRPC_MESSAGE_BYTES, "ws_message_bytes": WS_MESSAGE_BYTES,
                                "h2load": h2load_version(), "baseline": args.baseline}
    runner.save()
    configs = []
    for config in runner.configs:
        if config.kind == "ceiling":
            runner.event("protocols", config.name, "unsupported",
                         "the ceiling serves HTTP/1.1 /plaintext and /json only")
        else:
            configs.append(config)
    frame = runner.tmp / "grpc-request.bin"
    frame.write_bytes(GRPC_FRAME)
    groups = [(p, [s for s in todo if protocol_of(s) == p]) for p in (HTTP2, HTTP1)]
    for round_no in range(1, args.rounds + 1):
        runner.log(f"protocols: round {round_no}/{args.rounds}")
        for protocol, served in [g for g in groups if g[1]]:
            order = runner.rotated(configs, round_no)
            # paired: the round's servers side by side, each scenario measured on every one of them back to back.
            for group in [order] if args.order == "paired" else [[c] for c in order]:
                servers = []
                try:
                    for config in group:
                        server = open_server(runner, config, protocol, served, round_no, frame)
                        if server is not None:
                            servers.append(server)
                    live = list(servers)
                    for scenario in served:
                        for server in list(live):
                            # A server that died fails its next window (recorded) and is measured no more this round.
                            if scenario in server.runnable and not measure(runner, server, scenario, round_no, frame):
                                live.remove(server)
                finally:
                    for server in servers:
                        server.proc.stop()
                runner.save()


def h2load_version() -> str:
    """For the report: "h2load nghttp2/1.52.0", or "" when it is not installed."""
    if not shutil.which("h2load"):
        return ""
    done, _ = run_child(["h2load", "--version"], 10)
    return done.stdout.strip() if done else "h2load"
