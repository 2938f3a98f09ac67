"""compare.py's hosting phase: the sample served directly, and behind nginx (TCP or Unix-socket upstream) or Caddy,
each proxy pinned to the server's CPUs with as many workers, every setup verified through the proxy before any load.
The measuring is the main phase's machinery, through the Runner (runner.py).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import time
import verify
from model import CORE_PATHS, JSON_256, LIB, Config, Scenario
from procs import STARTUP_TIMEOUT_S, Proc, cpu_count, free_port
from runner import Runner

PROXY_TOOLS = {"nginx-tcp": "nginx", "nginx-unix": "nginx", "caddy": "caddy", "caddy-unix": "caddy"}
HOSTING_MODELS = ("direct", "nginx-tcp", "nginx-unix", "caddy", "caddy-unix")
HOSTING_SCENARIOS = [
    Scenario("plaintext-256", "plaintext, 256 connections, no pipelining", "/plaintext", 256),
    JSON_256,
]


def phase_hosting(runner: Runner, all_scenarios: list[Scenario] = HOSTING_SCENARIOS,
                  core_paths: list[str] = CORE_PATHS) -> None:
    """Every hosting model × transport, rotated each round: a fresh server, and its proxy, per setup."""
    models = runner.args.hosting
    transports = [c.name for c in runner.rows_named(runner.args.hosting_transports)]
    scenarios = all_scenarios if not runner.args.quick else [all_scenarios[1]]
    runner.meta["hosting"] = {"models": models, "transports": transports,
                              "scenarios": [s.as_dict() for s in scenarios]}
    setups = [(m, t) for m in models for t in transports]
    for model in models:
        tool = PROXY_TOOLS.get(model)
        if tool and not shutil.which(tool):
            for t in transports:
                runner.event("hosting", t, "skipped", f"{tool} is not installed", model)
            setups = [(m, t) for m, t in setups if m != model]
    for round_no in range(1, runner.args.rounds + 1):
        runner.log(f"hosting: round {round_no}/{runner.args.rounds}")
        for model, transport in runner.rotated(setups, round_no):
            config = runner.by_name[transport]
            if runner.skip(config, f"hosting:{model}"):
                continue
            runner.check_interrupted()
            run_hosting(runner, model, config, scenarios, round_no, core_paths)
        runner.save()


def run_hosting(runner: Runner, model: str, config: Config, scenarios: list[Scenario], round_no: int,
                core_paths: list[str]) -> None:
    extra = {"hosting": model, "threads": None}
    unix = model.endswith("-unix")
    if unix:
        backend = verify.Target("unix", path=str(runner.tmp / f"kestrel-{runner.server_count + 1}.sock"))
    else:
        backend = verify.Target("tcp", host="127.0.0.1", port=free_port(runner.ports))
    label = f"hosting-r{round_no}-{model}-{config.name}"
    started = runner.start_server(config, "middleware", backend, runner.args.server_cpus, None, label)
    proxy: Proc | None = None
    try:
        if started.state != "ok":
            runner.start_failed("hosting", config, f"hosting:{model}", started, model, round_no, None, extra)
            return
        if runner.verify_server("hosting", config.name, backend, core_paths, round_no, None, extra) is None:
            return
        front = backend
        if model != "direct":
            front = verify.Target("tcp", host="127.0.0.1", port=free_port(runner.ports))
            proxy, reason = start_proxy(runner, model, backend, front, label)
            if proxy is None:
                runner.event("hosting", config.name, "failed", reason, model, round_no, None, extra)
                return
            if runner.verify_server("hosting", config.name, front, core_paths, round_no, None, extra) is None:
                return
        procs = {"server": started.proc}
        if proxy:
            procs["proxy"] = proxy
        runner.prime(f"http://127.0.0.1:{front.port}", scenarios, runner.args.warmup_first, runner.args.client_cpus,
                     runner.args.wrk_threads)
        for scenario in scenarios:
            if not runner.measure("hosting", config.name, scenario, round_no, f"http://127.0.0.1:{front.port}",
                                  procs, runner.args.warmup, runner.args.client_cpus, runner.args.wrk_threads,
                                  cpu_count(runner.args.server_cpus), extra):
                return
    finally:
        if proxy:
            proxy.stop()
        if started.proc:
            started.proc.stop()
        if unix and os.path.exists(backend.path):
            os.unlink(backend.path)


def start_proxy(runner: Runner, model: str, backend: verify.Target, front: verify.Target,
                label: str) -> tuple[Proc | None, str]:
    """nginx or Caddy in front of the backend, pinned with the server, started and answering; or None and why."""
    workdir = runner.tmp / f"{label}-proxy"
    workdir.mkdir(parents=True, exist_ok=True)
    upstream_unix = backend.kind == "unix"
    workers = cpu_count(runner.args.server_cpus)
    if model.startswith("nginx"):
        for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (workdir / d).mkdir(exist_ok=True)
        template = (LIB / "nginx.conf.in").read_text()
        conf = fill(template, {
            "USER_LINE": "user root;" if os.geteuid() == 0 else "",
            "WORKERS": str(workers), "DIR": str(workdir),
            "UPSTREAM": f"unix:{backend.path}" if upstream_unix else f"127.0.0.1:{backend.port}",
            "LISTEN": f"127.0.0.1:{front.port}"})
        path = workdir / "nginx.conf"
        path.write_text(conf)
        shutil.copy(path, runner.logs / f"{model}.nginx.conf")
        argv = ["taskset", "-c", runner.args.server_cpus, "nginx", "-p", str(workdir), "-c", str(path),
                "-e", str(workdir / "error.log")]
    else:
        template = (LIB / "Caddyfile.in").read_text()
        conf = fill(template, {
            "DIR": str(workdir), "PORT": str(front.port),
            "UPSTREAM": f"unix/{backend.path}" if upstream_unix else f"127.0.0.1:{backend.port}"})
        path = workdir / "Caddyfile"
        path.write_text(conf)
        shutil.copy(path, runner.logs / f"{model}.Caddyfile")
        argv = ["taskset", "-c", runner.args.server_cpus, "caddy", "run", "--config", str(path),
                "--adapter", "caddyfile"]
    env = dict(runner.base_env)
    env.update(HOME=str(workdir), XDG_DATA_HOME=str(workdir / "data"), XDG_CONFIG_HOME=str(workdir / "config"))
    runner.server_count += 1
    proc = Proc(f"{model} proxy", argv, env, runner.logs / f"{runner.server_count:04d}-{label}-proxy.log")
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        runner.check_interrupted()
        if not proc.alive():
            text = proc.log_text().strip()
            error_log = workdir / "error.log"
            if error_log.exists():
                text += " " + error_log.read_text(errors="replace").strip()
            proc.stop()
            return None, f"{model} exited with code {proc.popen.returncode}: {text[-400:]}"
        if verify.answers(front, "/plaintext", timeout=1.0):
            runner.meta.setdefault("proxy_commands", {})[model] = shlex.join(argv)
            return proc, ""
        time.sleep(0.05)
    proc.stop()
    return None, f"{model} did not answer within {STARTUP_TIMEOUT_S:.0f} s"


def fill(template: str, values: dict[str, str]) -> str:
    """A proxy's configuration from its template: every @NAME@ replaced, and none left over."""
    for key, value in values.items():
        template = template.replace("@" + key + "@", value)
    leftover = re.findall(r"@[A-Z_]+@", template)
    if leftover:
        raise RuntimeError(f"unfilled template placeholders {leftover}")
    return template
