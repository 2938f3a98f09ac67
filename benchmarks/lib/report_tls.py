"""report.py's section for the tls phase (tls.py): HTTPS at saturation, with the full handshakes per request the load
generator made and the transport's loop counters per request and per connection, from each server's exit line."""

from __future__ import annotations

from report_common import fmt_count, fmt_small, median, not_measured
from report_openloop import closed_loop_table


ACCEPTED = "connections.accepted"     # the server's own count of connections: one per request under churn


def short(name: str) -> str:
    """kestrel.transport.linux.loop.handoffs -> loop.handoffs"""
    return name.removeprefix("kestrel.transport.linux.")


def counter_cells(rows: list[dict]) -> str:
    """Full handshakes per request (loadgen's count), then every loop. counter per request / per connection over the
    server's life (median over rounds)."""
    full = median((r["handshakes"] - r["resumed"]) / r["requests"] if r.get("handshakes") is not None and r["requests"]
                  else None for r in rows)
    names = sorted({n for r in rows for n in (r.get("counters") or {}) if "loop." in n or n.endswith(ACCEPTED)})
    parts = []
    for name in names:
        per_request = median(r["counters"].get(name, 0) / r["server_requests"] if r.get("counters")
                             and r.get("server_requests") else None for r in rows)
        per_connection = median(r["counters"].get(name, 0) / r["server_connections"] if r.get("counters")
                                and r.get("server_connections") else None for r in rows)
        parts.append(f"{short(name)} {fmt_small(per_request)} / {fmt_small(per_connection)}")
    printed = any(r.get("counters") is not None for r in rows)
    counters = "; ".join(parts) or ("no loop counters" if printed else "no counters line at exit")
    return f" {fmt_count(full) if full is not None else '–'} | {counters} |"


def tls_section(data: dict) -> list[str]:
    tls = data["meta"].get("tls")
    if not tls:
        return []
    meta = data["meta"]
    baseline = tls["baseline"]
    lines = ["## HTTPS (closed loop)", "",
             f"At saturation, as the main phase: server pinned to CPU {meta.get('server_cpus')}, load generator to CPU "
             f"{meta.get('client_cpus')}. Every server listens on `https://` with the sample's self-signed "
             "certificate (ALPN h2 and http/1.1), is verified over TLS first, and serves one scenario: a fresh server "
             "per scenario and round, primed on it, so the counters it prints at exit are that scenario's. "
             + ("Paired order: each round starts every configuration's server for a scenario side by side and "
                "measures them back to back. " if tls.get("order") == "paired" else
                "One server runs at a time, in rotated order. ")
             + 
             "`https-json-256` is wrk over TLS; `https-churn-64` is benchmarks/loadgen with `-S -k -C`: each request "
             "on a new connection, and no session kept, so every connection is a **full handshake** (wrk and h2load "
             "resume a session when they reconnect); `h2-tls-json` and `grpc-tls-unary` are "
             f"{tls.get('h2load') or 'h2load'} with ALPN h2; `h2-tls-download` is benchmarks/nodeload (Node's "
             "`node:http2`, the stack undici's HTTP/2 client uses), every byte checked; `ws-tls-echo` is "
             "benchmarks/wsload with `-S`. **Full handshakes/req**: loadgen's count of handshakes "
             "that resumed no session, per answer (1.00 for churn). **Loop counters**: each `loop.` counter of the "
             "transport's meter from the server's exit line, and the connections it accepted, per request / per "
             "connection the load generators opened, over the server's life (priming and warm-ups included); under "
             "churn, per request is per handshake. "
             f"**vs {baseline}**: the median over rounds of each round's ratio (min–max).", ""]
    names: list[str] = []
    for s in tls["scenarios"]:
        lines += [f"### {s['name']}: {s['title']}", ""]
        lines += closed_loop_table(data, "tls", s, "req/s", baseline, names,
                                   " Full handshakes/req | Loop counters per request / connection |", counter_cells)
    return lines + not_measured(data, "tls", names)
