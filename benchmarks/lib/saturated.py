"""compare.py's closed-loop phases at saturation with wrk: main (every scenario against every configuration, pinned;
--order blocks or paired) and sweep (ThreadCount 1/2/4, unpinned).
"""

from __future__ import annotations

import argparse

import verify
from model import CORE_PATHS, JSON_256, Config, MainServer, Scenario
from procs import cpu_count, free_port
from runner import Runner


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


def few_connection_scenarios() -> list[Scenario]:
    """Closed loop over 1, 4 and 16 connections (2 is in the default set): where each request waits for the server's
    wake-up, the latency a loop adds is the throughput it loses (issue 37). Only by name, with --scenarios."""
    return [Scenario(f"{name}-{n}", f"{name}, {n} connection{'s' if n > 1 else ''}, no pipelining", f"/{name}", n)
            for name in ("json", "plaintext") for n in (1, 4, 16)]


def selected_scenarios(args: argparse.Namespace) -> list[Scenario]:
    """--scenarios picks from every scenario (also with --quick); otherwise the mode's default set."""
    if args.scenarios:
        return [s for s in main_scenarios(quick=False) + few_connection_scenarios() if s.name in args.scenarios]
    return main_scenarios(args.quick)


SWEEP_SCENARIO = JSON_256


def phase_main(runner: Runner) -> None:
    scenarios = selected_scenarios(runner.args)
    runner.meta["scenarios"] = [s.as_dict() for s in scenarios]
    runner.meta["order"] = runner.args.order
    modes = [m for m in ("middleware", "platform") if any(s.mode == m for s in scenarios)]
    rounds = runner.args.rounds
    for round_no in range(1, rounds + 1):
        runner.log(f"main: round {round_no}/{rounds}")
        plans = []          # (config, mode, scenarios), in this round's rotated order
        for config in runner.rotated(runner.configs, round_no):
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
                todo = [s for s in todo if (config.name, s.path) not in runner.unsupported]
                if not todo or (config.name, mode) in runner.unsupported:
                    continue
                plans.append((config, mode, todo))
        if runner.args.order == "paired":
            # The ceiling serves both modes' rows at once, so it is paired with the first mode's servers.
            for mode in modes:
                group = [p for p in plans if p[1] == mode or (p[1] == "any" and mode == modes[0])]
                run_paired(runner, group, round_no)
                runner.save()
        else:
            for config, mode, todo in plans:
                run_server_scenarios(runner, config, mode, todo, round_no)
                runner.save()


def measure_on(runner: Runner, server: MainServer, scenario: Scenario, round_no: int) -> bool:
    return runner.measure("main", server.config.name, scenario, round_no, server.url, {"server": server.proc},
                          runner.args.warmup, runner.args.client_cpus, runner.args.wrk_threads,
                          cpu_count(runner.args.server_cpus), {"hosting": "direct", "threads": None})


def run_server_scenarios(runner: Runner, config: Config, mode: str, todo: list[Scenario], round_no: int) -> None:
    """--order blocks: one server at a time, measured on all its scenarios, then stopped."""
    server = runner.open_server(config, mode, todo, round_no)
    if server is None:
        return
    try:
        for scenario in server.runnable:
            if not measure_on(runner, server, scenario, round_no):
                return
    finally:
        server.proc.stop()


def run_paired(runner: Runner, plans: list[tuple[Config, str, list[Scenario]]], round_no: int) -> None:
    """--order paired: every configuration's server of the round is started and primed first, all pinned
    to the server CPUs, and then each scenario is measured on each server in turn (in the round's
    rotated order), so the windows a ratio compares are seconds apart rather than minutes. The servers
    not under load are idle in epoll_wait; their CPU counts as other load in the measured window."""
    servers: list[MainServer] = []
    try:
        for config, mode, todo in plans:
            server = runner.open_server(config, mode, todo, round_no)
            if server is not None:
                servers.append(server)
        order = list(dict.fromkeys(s.name for _, _, todo in plans for s in todo))
        live = list(servers)
        for name in order:
            for server in list(live):
                scenario = next((s for s in server.runnable if s.name == name), None)
                # A server that died, even while another one was loaded, fails its next window
                # (window() records it) and is measured no more this round.
                if scenario is not None and not measure_on(runner, server, scenario, round_no):
                    live.remove(server)
    finally:
        for server in servers:
            server.proc.stop()


def phase_sweep(runner: Runner) -> None:
    transports = [c.name for c in runner.rows_named(runner.args.sweep_transports)]
    counts = [1] if runner.args.quick else runner.args.sweep_threads
    cpus = ",".join(str(c) for c in runner.bench_cpus)
    runner.meta["sweep"] = {"transports": transports, "threads": counts, "cpus": cpus,
                            "scenario": SWEEP_SCENARIO.as_dict(), "wrk_threads": cpu_count(cpus)}
    combos = [(t, n) for t in transports for n in counts]
    for round_no in range(1, runner.args.rounds + 1):
        runner.log(f"sweep (unpinned, CPUs {cpus}): round {round_no}/{runner.args.rounds}")
        for transport, threads in runner.rotated(combos, round_no):
            config = runner.by_name[transport]
            if runner.skip(config, f"sweep:{threads}"):
                continue
            runner.check_interrupted()
            extra = {"hosting": "direct", "threads": threads}
            port = free_port(runner.ports)
            target = verify.Target("tcp", host="127.0.0.1", port=port)
            started = runner.start_server(config, "middleware", target, cpus, threads,
                                          f"sweep-r{round_no}-{config.name}-t{threads}")
            try:
                if started.state != "ok":
                    runner.start_failed("sweep", config, f"sweep:{threads}", started, f"threads={threads}",
                                        round_no, None, extra)
                    continue
                if runner.verify_server("sweep", config.name, target, CORE_PATHS, round_no, None, extra) is None:
                    continue
                runner.prime(f"http://127.0.0.1:{port}", [SWEEP_SCENARIO], runner.args.warmup_first, cpus,
                             cpu_count(cpus))
                runner.measure("sweep", config.name, SWEEP_SCENARIO, round_no, f"http://127.0.0.1:{port}",
                             {"server": started.proc}, runner.args.warmup, cpus, cpu_count(cpus),
                               cpu_count(cpus), extra)
            finally:
                if started.proc:
                    started.proc.stop()
        runner.save()
