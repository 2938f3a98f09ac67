"""report.py's sections for the open-loop phases (latency.py, openloop.py) and the protocols phase (protocols.py): the
latency table, fixed rates, mixed load, blocking bystanders, HTTP/2, gRPC and WebSocket, and issue 32's targets.
"""

from __future__ import annotations

from report_common import (LOAD_BOUND_UTIL, Summary, counter_per_request, fmt_int, fmt_latency, fmt_pct, fmt_ratio,
                           fmt_small, fmt_us, lag_p99,
                           latency_cells, median, not_measured, paired, paired_ratios, peer, percentile, reasons_for,
                           rt_cell, rt_head, rt_sep, select, spread)


def latency_section(data: dict) -> list[str]:
    lat = data["meta"].get("latency")
    rows = select(data["measurements"], phase="latency")
    if not lat:
        return []
    lines = ["## Latency (open loop)", "",
             f"benchmarks/loadgen sends GET /json over {lat['connections']} connections at a fixed total rate of "
             f"**{lat['rate']:,.0f} req/s** ({lat['rate_source']}), on a schedule that does not wait for answers, "
             "and times each answer from the request's *intended* send time, so a server stall counts against "
             "every request it delayed (no coordinated omission). Histogram precision ≤ 0.78%. "
             f"{lat['duration_s']:g} s measured after {lat.get('warmup_s', 1.0):g} s at the same rate. Values are medians over rounds of "
             "each round's percentile; \"loadgen lag\" is how late the generator itself was (p99): when it is "
             "large the machine, not the server, delayed the requests. CPU µs/request at a fixed, modest rate "
             "includes the server's idle-time costs (timers, polling), which a saturated run hides.", "",
             "| Configuration |" + rt_head(data) + " Achieved req/s | p50 | p90 | p99 | p99.9 | max (worst round) | "
             "CPU µs/req at this rate | loadgen lag p99 | Other load | Rounds | Errors |",
             "|---|" + rt_sep(data) + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in data["configs"]:
        name = c["name"]
        rs = select(rows, config=name)
        if not rs:
            why = reasons_for(data["events"], "latency", name, "json-256-open-loop", None) or "not measured"
            lines.append(f"| {name} |{rt_cell(data, name)} – | – | – | – | – | – | – | – | – | 0 | {why} |")
            continue
        sm = Summary(rs)

        def p(key):
            return fmt_latency(median(r["latency_us"][key] for r in rs))

        worst = max(r["latency_us"]["max"] for r in rs)
        lag = median(r["send_lag_us"]["p99"] for r in rs)
        lines.append(f"| {name} |{rt_cell(data, name)} {fmt_int(sm.rps)} | {p('p50')} | {p('p90')} | {p('p99')} | {p('p99.9')} | "
                     f"{fmt_latency(worst)} | {fmt_us(sm.cpu)} | {fmt_latency(lag)} | {fmt_pct(sm.other_util)} | "
                     f"{sm.n} | {sm.errors_text()} |")
    return lines + [""]


def fixed_section(data: dict) -> list[str]:
    fixed = data["meta"].get("fixed")
    if not fixed:
        return []
    rows = select(data["measurements"], phase="fixed")
    baseline = fixed["baseline"]
    lines = ["## Fixed rates (open loop)", "",
             f"benchmarks/loadgen sends requests on a fixed schedule (no coordinated omission) at fractions of "
             f"{baseline}'s saturated rate on each scenario. The server is pinned to CPU {data['meta'].get('server_cpus')} "
             f"and loadgen to CPU {data['meta'].get('client_cpus')}. Each fresh server gets "
             f"{fixed['prime_s']:g} s at the highest rate before its first window of a scenario, then every window "
             f"{fixed['warmup_s']:g} s of warm-up at its own rate, highest rate first; {fixed['duration_s']:g} s "
             "measured. **CPU µs/req** is the server's CPU time between loadgen's window markers over the answers "
             "that arrived in between; **Server CPU** is that time as a share of the pinned CPUs. Latencies are "
             "medians over rounds of each round's percentile; **lag** is how late loadgen itself sent (p99): when "
             f"it is large, the client, not the server, delayed the requests. **vs {baseline}**: the median over "
             "rounds of each round's ratio (min–max), both windows of a round minutes or, with `--order paired`, "
             "seconds apart.", ""]
    names = []
    # With the sample's counters line (the Linux transport), the loop hand-offs per request over each server's life.
    counted = any(r.get("counters") for r in rows)
    if counted:
        lines += ["**Hand-offs/req**: the transport's `loop.handoffs` at the server's exit over the requests loadgen "
                  "got answered in its life (every rate, warm-ups included); – for a transport without the counters.",
                  ""]
    for s in fixed["scenarios"]:
        base = fixed["base"].get(s["name"], {})
        lines += [f"### {s['name']}: {s['title']}", "",
                  f"`GET {s['path']}`" + (" over HTTPS (loadgen -S: one full handshake per connection)"
                                           if s.get("tls") else "")
                  + (f" (the handler awaits `GET {data['meta'].get('fixed_downstream', {}).get('url', '?')}`, the C "
                     "server pinned to the client CPU, whose CPU counts as load)" if s.get("downstream") else "")
                  + f", {s['connections']} keep-alive connections; 100% = {fmt_int(base.get('rate'))} "
                  f"req/s ({base.get('source', '?')}).", "",
                  f"| Rate | Configuration |{rt_head(data)} Achieved req/s | CPU µs/req | vs {baseline} | Server CPU | p50 | p99 | p99.9 "
                  f"| p99 vs {baseline} | lag p99 |" + (" Hand-offs/req |" if counted else "")
                  + " Other load | Rounds | Errors |",
                  "|---|---|" + rt_sep(data) + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + (
                      "---:|" if counted else "") + "---:|---|"]
        for fraction in fixed["fractions"]:
            target = fixed["rates"].get(s["name"], {}).get(str(fraction))
            for c in data["configs"]:
                rs = select(rows, scenario=s["name"], fraction=fraction, config=c["name"])
                if not rs:
                    continue
                base_rows = select(rows, scenario=s["name"], fraction=fraction, config=peer(data, c["name"], baseline))
                names.append(c["name"])
                sm = Summary(rs)
                lines.append(
                    f"| {fraction:.0%} ({fmt_int(target)}/s) | {c['name']} |{rt_cell(data, c['name'])} {fmt_int(sm.rps)} | "
                    f"{spread(rs, lambda r: r.get('cpu_us_per_request'), fmt_us)} | "
                    f"{paired(rs, base_rows, lambda r: r.get('cpu_us_per_request'))} | {fmt_pct(sm.server_util)} | "
                    f"{latency_cells(rs, base_rows)} | {fmt_latency(median(lag_p99(r) for r in rs))} | "
                    + (f"{fmt_small(median(counter_per_request(r, 'loop.handoffs') for r in rs))} | " if counted
                       else "")
                    + f"{fmt_pct(sm.other_util)} | {sm.n} | {sm.errors_text()} |")
        lines.append("")
    return lines + not_measured(data, "fixed", names)


def mixed_section(data: dict) -> list[str]:
    mixed = data["meta"].get("mixed")
    if not mixed:
        return []
    rows = select(data["measurements"], phase="mixed")
    baseline = mixed["baseline"]
    small, bulk = mixed["small"], mixed["bulk"]
    lines = ["## Mixed load on one loop", "",
             f"One event loop (`--threads {mixed['threads']}`, IOQueueCount for Sockets) on the pinned server CPU. "
             f"wrk keeps {bulk['connections']} connections fetching `{bulk['path']}` (closed loop, niced so that "
             f"loadgen goes first on the shared client CPU) while loadgen sends `GET {small['path']}` over "
             f"{small['connections']} other connections at a fixed **{mixed['rate']:,.0f} req/s** (open loop: a "
             "request delayed behind the downloads counts from when it was due). "
             f"{mixed['warmup_s']:g} s warm-up with both running, {mixed['duration_s']:g} s measured. **Bulk MiB/s** "
             "is what wrk received over its whole run, which spans the small requests' warm-up and window. "
             f"Ratios: median of per-round ratios to {baseline} (min–max).", "",
             f"| Configuration |{rt_head(data)} Small req/s | p50 | p99 | p99.9 | p99 vs {baseline} | Bulk MiB/s | vs {baseline} | "
             "Server CPU | lag p99 | Other load | Rounds | Errors |",
             "|---|" + rt_sep(data) + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    names = []
    for c in data["configs"]:
        rs = select(rows, config=c["name"])
        if not rs:
            continue
        base_rows = select(rows, config=peer(data, c["name"], baseline))
        names.append(c["name"])
        sm = Summary(rs)
        lines.append(
            f"| {c['name']} |{rt_cell(data, c['name'])} {fmt_int(sm.rps)} | {latency_cells(rs, base_rows)} | "
            f"{spread(rs, lambda r: r['bulk_mib_per_s'], fmt_int)} | "
            f"{paired(rs, base_rows, lambda r: r['bulk_mib_per_s'])} | {fmt_pct(sm.server_util)} | "
            f"{fmt_latency(median(lag_p99(r) for r in rs))} | {fmt_pct(sm.other_util)} | {sm.n} | {sm.errors_text()} |")
    return lines + [""] + not_measured(data, "mixed", names)


def blocking_section(data: dict) -> list[str]:
    blocking = data["meta"].get("blocking")
    if not blocking:
        return []
    rows = select(data["measurements"], phase="blocking")
    baseline = blocking["baseline"]
    lines = ["## Blocking bystanders", "",
             f"A fresh server per block, pinned to CPU {blocking['server_cpu']} alone with one event loop "
             f"(`--threads {blocking['threads']}`). {blocking['bystanders']} keep-alive bystanders send `GET "
             f"{blocking['path']}` at a fixed total {blocking['rate']:,.0f} req/s (loadgen, open loop; "
             + (f"{blocking['prime_s']:g} s of priming and " if "prime_s" in blocking else "")
             + f"{blocking['warmup_s']:g} s warm-up). Then a request on an established keep-alive connection makes the "
             f"sample's handler block its thread for {blocking['ms']:,} ms (`/block?how=…`): `sleep` is "
             "`Thread.Sleep`, `result` is `.Result` on a task a `Task.Delay` completes, `lock` waits for a lock "
             "another thread holds. **Worst wait**: the longest latency of a bystander request due while the "
             "handler was blocked (by the handler's own start and end on CLOCK_MONOTONIC), counted from when it "
             "was due: median over rounds (min–max). **Answered before the handler returned**: of the bystander "
             "requests due during the block, how many were answered before it ended (issue 32 asks for all).", ""]
    names = []
    for how in blocking["hows"]:
        lines += [f"### how={how}", "",
                  f"| Configuration |{rt_head(data)} Worst wait | vs {baseline} | Handler blocked | Due during the block | "
                  "Answered before the handler returned | lag p99 | Other load | Rounds | Errors |",
                  "|---|" + rt_sep(data) + "---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for c in data["configs"]:
            rs = select(rows, how=how, config=c["name"])
            if not rs:
                continue
            base_rows = select(rows, how=how, config=peer(data, c["name"], baseline))
            names.append(c["name"])
            sm = Summary(rs)
            due = sum(r["bystanders_during"] for r in rs)
            answered = sum(r["answered_before_return"] for r in rs)
            answered_text = f"{answered:,} ({answered / due:.0%})" if due else "–"
            lines.append(
                f"| {c['name']} |{rt_cell(data, c['name'])} {spread(rs, lambda r: r['worst_wait_us'], fmt_latency)} | "
                f"{paired(rs, base_rows, lambda r: r['worst_wait_us'])} | "
                f"{fmt_latency(median(r['blocked_ms'] * 1000 for r in rs))} | {due:,} | {answered_text} | "
                f"{fmt_latency(median(lag_p99(r) for r in rs))} | {fmt_pct(sm.other_util)} | {sm.n} | "
                f"{sm.errors_text()} |")
        lines.append("")
    return lines + not_measured(data, "blocking", names)


def protocols_section(data: dict) -> list[str]:
    protocols = data["meta"].get("protocols")
    if not protocols:
        return []
    baseline = protocols["baseline"]
    meta = data["meta"]
    paired_order = ", both windows seconds apart (`--order paired`)" if protocols.get("order") == "paired" else ""
    lines = ["## HTTP/2, gRPC, WebSocket and h2load's HTTP/1.1 (closed loop)", "",
             f"At saturation, as the main phase: the server pinned to CPU {meta.get('server_cpus')}, the load generator "
             f"to CPU {meta.get('client_cpus')}, each fresh server primed on its scenarios and each window warmed up "
             f"first. {protocols.get('h2load') or 'h2load (not installed: its scenarios were skipped)'} speaks HTTP/2 "
             "with prior knowledge (h2c) to a server started "
             "with `--protocols http2` (without TLS, Kestrel serves its default Http1AndHttp2 as HTTP/1.1 only); "
             f"`grpc-unary` posts one gRPC message of {protocols['grpc_message_bytes']} bytes (its length prefix "
             "before it) per call to the sample's echo method, verified once with curl (grpc-status 0, the message "
             "echoed) and in every window by the bytes that came back (*short*: answers without the message). "
             "`grpc-bidi` is benchmarks/nodeload (Node's `node:http2`): bidirectional streaming calls to the same "
             "service, each keeping one message in flight and checking its echo byte for byte: **msgs/s**. "
             "benchmarks/wsload upgrades to WebSocket on a server with Kestrel's default and keeps one "
             f"{protocols['ws_message_bytes']}-byte message in flight per connection, each echo checked byte for "
             "byte: **msgs/s**. The `h1-` scenarios are h2load with `--h1` on that server: GET /plaintext, its "
             "body counted in every window. **CPU µs/req** is the server's CPU time over the window per answer (per echo); "
             "**Client CPU**, the load generator's share of its CPUs (² at ≥ 95%: it may be the limit). "
             f"**vs {baseline}**: the median over rounds of each round's ratio (min–max){paired_order}.", ""]
    names = []
    for s in protocols["scenarios"]:
        unit = "msgs/s" if s["path"] in ("/ws", "/techempower.Echo/Bidi") else "req/s"
        lines += [f"### {s['name']}: {s['title']}", ""] + closed_loop_table(data, "protocols", s, unit, baseline, names)
    return lines + not_measured(data, "protocols", names)


def closed_loop_table(data: dict, phase: str, s: dict, unit: str, baseline: str, names: list[str],
                      extra_head: str = "", extra_cells=None) -> list[str]:
    """One scenario of a closed-loop phase (protocols, tls): throughput and CPU per answer with their paired ratios,
    a row per configuration; extra_cells(rows) adds the columns named by extra_head (" A | B |")."""
    rows = select(data["measurements"], phase=phase)
    width = extra_head.count("|")
    lines = [f"| Configuration |{rt_head(data)} Median {unit} | Min–max | vs {baseline} | CPU µs/req | vs {baseline} | "
             f"Server CPU |{extra_head} Client CPU | Other load | Rounds | Errors |",
             "|---|" + rt_sep(data) + "---:|---:|---:|---:|---:|---:|" + "---:|" * width + "---:|---:|---:|---|"]
    for c in data["configs"]:
        rs = select(rows, scenario=s["name"], config=c["name"])
        if not rs:
            why = reasons_for(data["events"], phase, c["name"], s["name"], "middleware")
            if why:
                lines.append(f"| {c['name']} |{rt_cell(data, c['name'])} – | – | – | – | – | – |" + " – |" * width
                             + f" – | – | 0 | {why} |")
            continue
        base_rows = select(rows, scenario=s["name"], config=peer(data, c["name"], baseline))
        names.append(c["name"])
        sm = Summary(rs)
        load = fmt_pct(sm.load_util) + (" ²" if sm.load_util is not None and sm.load_util >= LOAD_BOUND_UTIL else "")
        lines.append(
            f"| {c['name']} |{rt_cell(data, c['name'])} {fmt_int(sm.rps)} | {fmt_int(sm.rps_min)}–{fmt_int(sm.rps_max)} | "
            f"{paired(rs, base_rows, lambda r: r['rps'])} | {fmt_us(sm.cpu)} | "
            f"{paired(rs, base_rows, lambda r: r.get('cpu_us_per_request'))} | {fmt_pct(sm.server_util)} |"
            + (extra_cells(rs) if extra_cells else "") + f" {load} | "
            f"{fmt_pct(sm.other_util)} | {sm.n} | {sm.errors_text()} |")
    return lines + [""]


def adaptive_twin(name: str) -> str:
    """The ThreadPool row an Adaptive row is judged against: its name without "-adaptive" (linux-uring-adaptive:
    linux-uring)."""
    return name.replace("-adaptive", "")


# Issue 32's targets for the new scheduling mode, checked for every configuration whose name says
# "adaptive" against the reference rows of the same run (ratios of medians).
ISSUE32_INLINE, ISSUE32_CEILING, ISSUE32_SOCKETS = "linux-inline", "ceiling", "sockets"
ISSUE32_WORST_WAIT_US = 50_000
ISSUE32_LOW_FRACTION = 0.05         # at this load and below the bound against the C server is 2x, else 1.5x


def issue32_targets(data: dict) -> list[str]:
    measurements = data["measurements"]
    candidates = [c["name"] for c in data["configs"] if "adaptive" in c["name"]
                  and select(measurements, config=c["name"])
                  and any(m["phase"] in ("fixed", "mixed", "blocking", "protocols")
                          for m in select(measurements, config=c["name"]))]
    if not candidates:
        return []
    lines = ["## Issue 32's targets", "",
             f"Each configuration named *adaptive* against `{ISSUE32_INLINE}`, `{ISSUE32_CEILING}` and "
             f"`{ISSUE32_SOCKETS}` in this run: ratios of medians, **no** where missed; in the protocols phase, "
             "against its ThreadPool twin (the same name without *-adaptive*), the median of per-round ratios "
             "(min–max). A ratio inside the rows' min–max spread is not a result either way on a shared machine.", "",
             "| Configuration |" + rt_head(data) + " Target | Where | Bound | Measured | Met |",
             "|---|" + rt_sep(data) + "---|---|---:|---:|---|"]

    def med(phase, config, value, **where):
        return median(value(r) for r in select(measurements, phase=phase, config=config, **where))

    def row(name, target, where, bound_text, measured, met):
        if measured is None:
            return
        lines.append(f"| {name} |{rt_cell(data, name)} {target} | {where} | {bound_text} | {measured} | "
                     f"{'yes' if met else '**no**'} |")

    fixed = data["meta"].get("fixed") or {}
    for name in candidates:
        for s in fixed.get("scenarios", []):
            for f in fixed.get("fractions", []):
                where = f"{s['name']} at {f:.0%}"
                cpu = med("fixed", name, lambda r: r.get("cpu_us_per_request"), scenario=s["name"], fraction=f)
                if cpu is None:
                    continue
                inline = med("fixed", peer(data, name, ISSUE32_INLINE), lambda r: r.get("cpu_us_per_request"), scenario=s["name"], fraction=f)
                if inline:
                    row(name, f"CPU/req vs {ISSUE32_INLINE}", where, "≤ 1.10×", fmt_ratio(cpu / inline), cpu / inline <= 1.10)
                ceiling = med("fixed", ISSUE32_CEILING, lambda r: r.get("cpu_us_per_request"), scenario=s["name"], fraction=f)
                if ceiling:
                    bound = 2.0 if f <= ISSUE32_LOW_FRACTION else 1.5
                    row(name, "CPU/req vs the C server", where, f"≤ {bound:.2f}×", fmt_ratio(cpu / ceiling),
                        cpu / ceiling <= bound)
                for key in ("p99", "p99.9"):
                    mine = med("fixed", name, percentile(key), scenario=s["name"], fraction=f)
                    ref = med("fixed", peer(data, name, ISSUE32_SOCKETS), percentile(key), scenario=s["name"], fraction=f)
                    if ref:
                        row(name, f"{key} vs {ISSUE32_SOCKETS}", where, f"≤ {fmt_latency(ref)}", fmt_latency(mine),
                            mine <= ref)
        mine = med("mixed", name, percentile("p99"))
        ref = med("mixed", peer(data, name, ISSUE32_SOCKETS), percentile("p99"))
        if mine is not None and ref:
            row(name, f"small-request p99 vs {ISSUE32_SOCKETS}", "mixed", f"≤ {fmt_latency(ref)}", fmt_latency(mine),
                mine <= ref)
        mine = med("mixed", name, lambda r: r["bulk_mib_per_s"])
        ref = med("mixed", peer(data, name, ISSUE32_SOCKETS), lambda r: r["bulk_mib_per_s"])
        if mine is not None and ref:
            row(name, f"bulk MiB/s vs {ISSUE32_SOCKETS}", "mixed", "≥ 0.90×", fmt_ratio(mine / ref), mine / ref >= 0.90)
        for how in (data["meta"].get("blocking") or {}).get("hows", []):
            worst = med("blocking", name, lambda r: r["worst_wait_us"], how=how)
            if worst is not None:
                row(name, "worst bystander wait", f"blocking, how={how}", f"< {fmt_latency(ISSUE32_WORST_WAIT_US)}",
                    fmt_latency(worst), worst < ISSUE32_WORST_WAIT_US)
        twin = adaptive_twin(name)
        for s in (data["meta"].get("protocols") or {}).get("scenarios", []) if twin != name else []:
            rows = select(measurements, phase="protocols", scenario=s["name"])
            ratios = paired_ratios(select(rows, config=name), select(rows, config=twin), lambda m: m["rps"])
            if ratios:
                # Three decimals: at 0.998× a "1.00×" beside "no" would read as a contradiction.
                spread_text = f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(ratios) > 1 else ""
                row(name, f"throughput vs {twin}", f"protocols, {s['name']}", "≥ 1.00×",
                    f"{median(ratios):.3f}×{spread_text}", median(ratios) >= 1.0)
    return lines + [""]
