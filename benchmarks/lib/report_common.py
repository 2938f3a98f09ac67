"""What report.py and its sections share: medians and formatting, one table cell's Summary over its rounds, selecting
records, the reasons a cell is empty, and ratios paired by round.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

LOAD_BOUND_UTIL = 0.95      # wrk at or above this share of its CPUs may itself be the limit
BULK_RESPONSE_BYTES = 64 * 1024   # responses this large per request earn a MiB/s column (compare.py's)


# ---- numbers --------------------------------------------------------------------------------


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt_int(v) -> str:
    return "–" if v is None else f"{v:,.0f}"


def fmt_us(v) -> str:
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def fmt_count(v) -> str:
    return "–" if v is None else f"{v:.2f}"


def fmt_small(v) -> str:
    """A count per request that is often far below 1 (loop hand-offs): two significant digits there."""
    if v is None:
        return "–"
    return "0" if v == 0 else f"{v:.2g}" if abs(v) < 0.1 else f"{v:.2f}"


def counter_per_request(r: dict, suffix: str):
    """A counter from the server's exit line (the one whose name ends with suffix) over the requests it answered in
    its life; None without the line (another transport) or the count."""
    counters = r.get("counters")
    if not counters or not r.get("server_requests"):
        return None
    return sum(v for k, v in counters.items() if k.endswith(suffix)) / r["server_requests"]


def fmt_ratio(v) -> str:
    return "–" if v is None else f"{v:.2f}×"


def fmt_pct(v) -> str:
    return "–" if v is None else f"{v * 100:.0f}%"


def fmt_latency(us) -> str:
    if us is None:
        return "–"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.0f} µs"


def ratio(a, b):
    return a / b if a is not None and b else None


class Summary:
    """The rounds of one (phase, scenario, config, ...) cell."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows
        self.n = len(rows)
        self.rps = median(r["rps"] for r in rows)
        self.rps_min = min((r["rps"] for r in rows), default=None)
        self.rps_max = max((r["rps"] for r in rows), default=None)
        self.cpu = median(r.get("cpu_us_per_request") for r in rows)
        self.mib = median(r.get("mib_per_s") for r in rows)
        self.proxy_cpu = median(r["proxy_cpu_s"] / r["requests"] * 1e6 if r["requests"] else None for r in rows)
        self.server_util = median(r.get("server_cpu_util") for r in rows)
        self.load_util = median(r.get("load_cpu_util") for r in rows)
        self.other_util = median(r.get("other_cpu_util") for r in rows)
        self.switches = median(r.get("switches_per_request") for r in rows)
        self.syscalls = median(r.get("syscalls_per_request") for r in rows)
        self.errors = sum(r["error_total"] for r in rows)
        self.error_rounds = sum(1 for r in rows if r["error_total"])
        kinds: dict[str, int] = defaultdict(int)
        for r in rows:
            for k, v in r["errors"].items():
                kinds[k] += v
        self.error_kinds = {k: v for k, v in kinds.items() if v}

    def errors_text(self) -> str:
        if not self.errors:
            return "0"
        detail = ", ".join(f"{k} {v:,}" for k, v in sorted(self.error_kinds.items()))
        return f"⚠ {self.errors:,} in {self.error_rounds}/{self.n} rounds ({detail})"


def select(measurements: list[dict], **where) -> list[dict]:
    return [m for m in measurements if all(m.get(k) == v for k, v in where.items())]


def reasons_for(events: list[dict], phase: str, config: str, scenario: str | None, mode: str | None) -> str:
    """Why a cell has no (or fewer) measurements: the events that name it."""
    hits = []
    for e in events:
        if e["phase"] != phase or e["config"] != config:
            continue
        if e["scenario"] not in ("*", scenario):
            continue
        if e["scenario"] == "*" and mode and e.get("mode") not in (None, mode, "any"):
            continue
        hits.append(e)
    if not hits:
        return ""
    states = sorted({e["state"] for e in hits})
    reason = hits[0]["reason"]
    if len(reason) > 160:
        reason = reason[:157] + "…"
    return f"{'/'.join(states)}: {reason}"


def paired_ratios(rows: list[dict], base_rows: list[dict], value) -> list[float]:
    """Each round's value / the baseline's value in the same round."""
    base = {r["round"]: value(r) for r in base_rows}
    return [value(r) / base[r["round"]] for r in rows if base.get(r["round"]) and value(r) is not None]


def paired(rows: list[dict], base_rows: list[dict], value) -> str:
    """The median over rounds of each round's value / the baseline's value in the same round, with the
    min-max: the ratio to quote, since both windows of a round share the machine's state."""
    ratios = paired_ratios(rows, base_rows, value)
    if not ratios:
        return "–"
    if len(ratios) == 1:
        return fmt_ratio(ratios[0])
    return f"{fmt_ratio(median(ratios))} ({min(ratios):.2f}–{max(ratios):.2f})"


def spread(rows: list[dict], value, fmt) -> str:
    """Median (min–max) over rounds."""
    values = [value(r) for r in rows if value(r) is not None]
    if not values:
        return "–"
    text = fmt(median(values))
    return text if len(values) == 1 else f"{text} ({fmt(min(values))}–{fmt(max(values))})"


def percentile(key: str):
    return lambda r: r["latency_us"][key]


def lag_p99(r: dict):
    return r["send_lag_us"]["p99"]


def latency_cells(rows: list[dict], base_rows: list[dict]) -> str:
    """p50 | p99 (min–max) | p99.9 | p99 against the baseline, paired by round."""
    return (f"{fmt_latency(median(percentile('p50')(r) for r in rows))} | {spread(rows, percentile('p99'), fmt_latency)} | "
            f"{fmt_latency(median(percentile('p99.9')(r) for r in rows))} | {paired(rows, base_rows, percentile('p99'))}")


def not_measured(data: dict, phase: str, names: list[str]) -> list[str]:
    """One line for the selected configurations with no row in a phase, with the reason."""
    rows = select(data["measurements"], phase=phase)
    missing = [c["name"] for c in data["configs"] if c["name"] not in names and not select(rows, config=c["name"])]
    if not missing:
        return []
    reasons = []
    for name in missing:
        event = next((e for e in data["events"] if e["phase"] == phase and e["config"] == name), None)
        reason = f"{event['state']}: {event['reason']}" if event else "not measured"
        reasons.append(f"{name} ({reason[:157] + '…' if len(reason) > 160 else reason})")
    return ["Not measured: " + "; ".join(reasons) + ".", ""]


# ---- runtimes (--runtimes, @runtime=) ---------------------------------------------------------------

def peer(data: dict, name: str, origin: str) -> str:
    """The row made from table row `origin` on the runtime of row `name` (sockets@11 for linux@11), else `origin`:
    ratios compare configurations on the same runtime."""
    runtime = next((c.get("runtime") for c in data["configs"] if c["name"] == name), None)
    if not runtime:
        return origin
    return next((c["name"] for c in data["configs"] if c.get("origin") == origin and c.get("runtime") == runtime),
                origin)


def runtime_label(c: dict) -> str:
    """The runtime a configuration really ran on (from the Kestrel.Core its servers mapped), or what it asked for."""
    if c["kind"] == "ceiling":
        return "none (C)"
    if c.get("runtime_seen"):
        return f".NET {c['runtime_seen']}"
    return f".NET {c['runtime']} (asked; never started)" if c.get("runtime") else "–"


def runtimes_differ(data: dict) -> bool:
    return len({runtime_label(c) for c in data["configs"] if c["kind"] != "ceiling"}) > 1


def rt_head(data: dict) -> str:
    """A Runtime column after a table's configuration column, where the configurations ran on different runtimes."""
    return " Runtime |" if runtimes_differ(data) else ""


def rt_sep(data: dict) -> str:
    return "---|" if runtimes_differ(data) else ""


def rt_cell(data: dict, name: str) -> str:
    if not runtimes_differ(data):
        return ""
    c = next((c for c in data["configs"] if c["name"] == name), None)
    return f" {runtime_label(c) if c else '–'} |"
