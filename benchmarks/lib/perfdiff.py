#!/usr/bin/env python3
"""Side-by-side CPU profiles from trace.sh --perf: perf samples on the server's CPU per 1,000
requests, by function, for each configuration, so two engines' CPU per request can be compared
function by function (the sampling rate is the same for all: compare rows, not absolute values).

    python3 benchmarks/lib/perfdiff.py NAME=REQUESTS=REPORT [NAME=REQUESTS=REPORT ...] [--top 40]

REPORT is `perf report --no-children --sort dso,sym --stdio -q -n -g none` output. Prints Markdown:
totals by kind of code (kernel, the runtime and JIT-compiled code, the native engine, idle), by
thread when REPORT's NAME.threads.txt (the same with --sort comm) is beside it, then the functions
with the largest spread between configurations.
"""
import os
import re
import sys

# "    12.34%          1234  [kernel.kallsyms]   [k] tcp_sendmsg"
LINE = re.compile(r"^\s*[\d.]+%\s+(\d+)\s+(.+?)\s+\[(.)\]\s+(.*?)\s*$")
# "    45.00%          4321  .NET TP Worker"
THREAD = re.compile(r"^\s*[\d.]+%\s+(\d+)\s+(.*?)\s*$")


def kind(dso: str, mode: str, symbol: str) -> str:
    if symbol.startswith(("do_idle", "cpuidle", "intel_idle", "acpi_idle", "default_idle", "poll_idle")) \
            or symbol in ("cpu_startup_entry", "pv_native_safe_halt", "native_safe_halt"):
        return "idle"
    if mode == "k":
        return "kernel"
    if "ktl_native" in dso:
        return "native engine (libktl_native)"
    if dso.startswith("[JIT]"):
        return "JIT-compiled code"
    if any(part in dso for part in ("libcoreclr", "libclrjit", "System.Private.CoreLib", "libSystem")):
        return "runtime"
    if dso.startswith("libc") or dso.startswith("ld-"):
        return "libc"
    return "other (" + dso + ")"


def threads(path: str) -> dict[str, int]:
    """Samples by thread name, with the numbers of numbered threads dropped (a pool's workers are one row)."""
    path = path.replace(".perf.txt", ".threads.txt")
    result: dict[str, int] = {}
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            for line in f:
                m = THREAD.match(line)
                if m:
                    name = re.sub(r"[\s#-]*\d+$", "", m.group(2)) or m.group(2)
                    result[name] = result.get(name, 0) + int(m.group(1))
    return result


def load(spec: str) -> tuple[str, float, dict[tuple[str, str], int]]:
    name, requests, path = spec.split("=", 2)
    samples: dict[tuple[str, str], int] = {}
    for thread, count in threads(path).items():
        samples[("thread", thread)] = count
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            count, dso, mode, symbol = int(m.group(1)), m.group(2), m.group(3), m.group(4)
            # JIT code names carry their signature; keep the method's name and its arity-free form.
            symbol = re.sub(r"\[Optimized[^\]]*\]|\[Tier[^\]]*\]|\[PreJIT\]|\[QuickJitted\]", "", symbol).strip()
            # "instance void [Assembly] Namespace.Type::Method(args)" -> "Namespace.Type::Method(args)"
            symbol = re.sub(r"^(?:instance\s+)?\S+\s+\[[^\]]+\]\s+", "", symbol)
            if dso.startswith("[JIT]"):
                dso = "[JIT]"  # one row per method, whichever thread ran it
            if re.fullmatch(r"0x[0-9a-f]+", symbol):
                symbol = f"({dso}, no symbols)"  # a stripped library: one row for all of it
            key = (kind(dso, mode, symbol), symbol)
            samples[key] = samples.get(key, 0) + count
    return name, float(requests), samples


def main(argv: list[str]) -> int:
    top = 40
    specs = []
    i = 1
    while i < len(argv):
        if argv[i] == "--top":
            top = int(argv[i + 1])
            i += 2
        else:
            specs.append(argv[i])
            i += 1
    if not specs:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    profiles = [load(s) for s in specs]
    names = [p[0] for p in profiles]

    def per_k(samples: int, requests: float) -> float:
        return 1000.0 * samples / requests if requests > 0 else float("nan")

    print("\n## perf samples per 1,000 requests (server CPU)\n")
    print("| kind | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    kinds = sorted({k for _, _, s in profiles for k, _ in s} - {"thread"})
    for k in kinds + ["all but idle"]:
        cells = []
        for _, requests, samples in profiles:
            total = sum(v for (kk, _), v in samples.items()
                        if kk == k or (k == "all but idle" and kk not in ("idle", "thread")))
            cells.append(f"{per_k(total, requests):.2f}")
        print(f"| {k} | " + " | ".join(cells) + " |")

    names_of_threads = sorted({t for _, _, s in profiles for k, t in s if k == "thread"})
    if names_of_threads:
        print("\nBy thread (samples per 1,000 requests):\n")
        print("| thread | " + " | ".join(names) + " |")
        print("|---|" + "---:|" * len(names))
        for t in names_of_threads:
            print(f"| {t} | " + " | ".join(f"{per_k(s.get(('thread', t), 0), r):.2f}" for _, r, s in profiles) + " |")

    keys = {key for _, _, s in profiles for key in s if key[0] != "thread"}
    rows = []
    for key in keys:
        values = [per_k(s.get(key, 0), r) for _, r, s in profiles]
        rows.append((max(values) - min(values), key, values))
    rows.sort(key=lambda row: -row[0])
    print(f"\nThe {top} functions whose samples per 1,000 requests differ most between configurations:\n")
    print("| function | kind | " + " | ".join(names) + " |")
    print("|---|---|" + "---:|" * len(names))
    for _, (k, symbol), values in rows[:top]:
        shown = symbol if len(symbol) <= 90 else symbol[:87] + "..."
        shown = shown.replace("|", "\\|")
        print(f"| `{shown}` | {k} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
