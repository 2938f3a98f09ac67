"""The shared types of compare.py and its phases: configurations (configs.txt's lines), scenarios, the servers a
phase starts, and the paths and files they use. Every phase module and the runner import this one; it imports none
of them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from procs import Proc

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "benchmarks" / "lib"
BIN = ROOT / "artifacts" / "benchmarks" / "bin"
SAMPLE_DLL = ROOT / "samples" / "TechEmpower" / "bin" / "Release" / "net10.0" / "TechEmpower.dll"
PIPELINE_LUA = LIB / "pipeline.lua"
USAGE_EXIT_CODE = 2                 # the sample's exit code for a command line it does not accept
# The runtimes a configuration can run on (@runtime=N, --runtimes): "10" is the SDK's own (`dotnet` on PATH); "11"
# is .NET 11.0.0, which the script named here lays out from NuGet's runtime packs as a DOTNET_ROOT, and which the
# net10.0 sample runs on with DOTNET_ROLL_FORWARD=LatestMajor.
RUNTIME_LAYOUTS = {"10": None, "11": ROOT / "tests" / "dotnet11" / "layout.sh"}
STRIPPED_ENV_PREFIXES = ("Kestrel__", "ASPNETCORE_", "DOTNET_SYSTEM_NET_SOCKETS_", "DOTNET_ThreadPool_")
CORE_PATHS = ["/plaintext", "/json"]
BULK_RESPONSE_BYTES = 64 * 1024     # responses this large per request also get MiB/s (what wrk received)
COUNTERS_PREFIX = "TechEmpower: counters "


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
    runtime: str | None = None                 # @runtime=N or --runtimes: a key of RUNTIME_LAYOUTS; None: `dotnet`
    origin: str = ""                           # the table row it came from (linux for linux@11)

    def __post_init__(self) -> None:
        self.origin = self.origin or self.name

    def on_runtime(self, runtime: str) -> "Config":
        """This row on another runtime, named NAME@RUNTIME (--runtimes)."""
        return dataclasses.replace(self, name=f"{self.origin}@{runtime}", runtime=runtime)

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
    runtime: str | None = None
    while rest and (rest[0] == "@optional" or rest[0].startswith(("@sample=", "@runtime="))
                    or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", rest[0])):
        token = rest.pop(0)
        if token == "@optional":
            optional = True
            continue
        if token.startswith("@sample="):
            sample = Path(os.path.expanduser(token.partition("=")[2])).resolve()
            continue
        if token.startswith("@runtime="):
            runtime = token.partition("=")[2]
            if runtime not in RUNTIME_LAYOUTS:
                raise SystemExit(f"compare: configuration {name}: {token}: known runtimes are "
                                 + ", ".join(RUNTIME_LAYOUTS))
            continue
        key, _, value = token.partition("=")
        env[key] = value
    if rest == ["@ceiling"]:
        # The C server is not .NET: a runtime does not apply to it.
        return Config(name, "ceiling", env, [[]], text, optional, sample)
    alternatives: list[list[str]] = [[]]
    for token in rest:
        if token == "||":
            alternatives.append([])
        else:
            alternatives[-1].append(token)
    return Config(name, "kestrel", env, alternatives, text, optional, sample, runtime)


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
    tls: bool = False                          # served over https:// (the sample's self-signed certificate)
    downstream: bool = False                   # the server needs --downstream (the awaiting handler, /await)

    def window_s(self, duration: int) -> int:
        return max(duration, self.min_window_s)

    @property
    def ceiling_serves(self) -> bool:
        return self.path in CORE_PATHS and self.body_kib == 0 and not self.tls

    def as_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "path": self.path, "connections": self.connections,
                "depth": self.depth, "headers": list(self.headers), "mode": self.mode, "twin": self.twin, "body_kib": self.body_kib,
                "min_window_s": self.min_window_s, "timeout_s": self.timeout_s, "tls": self.tls,
                "downstream": self.downstream}



# JSON over 256 keep-alive connections: the hosting phase's second scenario, the sweep's only one,
# and what primes the latency phase's servers (closed loop, before the open-loop window).
JSON_256 = Scenario("json-256", "JSON, 256 connections", "/json", 256)


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
    served: int = 0                             # requests answered over its life, where a phase counts them

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def exit_counters(self) -> dict[str, float] | None:
        """After it stopped: the counters line the sample prints at exit (`TechEmpower: counters NAME=VALUE ...`,
        the Linux transport's meter), as {name: value}; None when it printed none (another transport)."""
        for line in reversed(self.proc.log_text().splitlines()):
            if line.startswith(COUNTERS_PREFIX):
                pairs = (item.partition("=") for item in line[len(COUNTERS_PREFIX):].split())
                return {name: float(value) for name, _, value in pairs if value.replace(".", "", 1).isdigit()}
        return None
