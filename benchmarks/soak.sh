#!/usr/bin/env bash
# Soak: mixed load on one server for N minutes per transport, sampling the server process every
# 10 s, then failing on any error or on growth. See benchmarks/README.md, section "Soak".
#
#   ./benchmarks/soak.sh [--minutes N] [--transport linux|linux-uring|sockets|both|all] [--out DIR] [--no-build]
#
# Defaults: 10 minutes, all three servers (linux: the Linux transport's defaults; linux-uring: its
# io_uring engine; sockets), artifacts/soak; both: linux and sockets. For each transport it starts
# benchmarks/Soak (Soak.dll server, Kestrel on 127.0.0.1, pinned to CPU 1) and runs its load client
# (Soak.dll client, pinned to CPU 0): 32 keep-alive connections (GET /plaintext, small POST /echo),
# 4 connection-churn workers (a new connection per request), 2 large-body workers (uploads,
# downloads and full-duplex echoes of 1-8 MiB, each SHA-256 checked by the client), aborts (RST
# mid-request and mid-response, one worker, 10 ms apart) and bad input (garbage, TLS ClientHello,
# malformed requests, one worker, 10 ms apart). Every 10 s the client samples RSS and threads (/proc/PID/status), open fds (/proc/PID/fd),
# GC counts and heap sizes (the server's /_soak/stats, which first runs a full blocking GC, so
# live_mb is what is still reachable) and its own counters, into DIR/<transport>.csv.
# benchmarks/Soak/report.py then writes DIR/soak.png and DIR/summary.md and applies the bounds.
#
# Warm-up: before the N measured minutes, the same load runs unmeasured until the client has done
# 20,000 requests and verified 2 GiB of bodies, and at least 20 s have passed (60 s at most). RSS climbs until then while pools,
# pipe buffers and GC budgets fill up: about 10 s on an idle 2-vCPU machine, but once, on a starved
# CI machine, Sockets had done only 1.6 GiB after 50 s and its RSS rose 71 -> 130 MiB in a 1-minute
# run measured from 10 s, with the live heap flat at 5.8 MiB. With Adaptive scheduling, the transport's
# default, the 2 GiB took 8 s and RSS rose on to Sockets' level for 30 s more (111 -> 164 MiB; Sockets
# 148 -> 164), the live heap flat at 4-5.5 MiB: hence the 20 s minimum.
#
# Bounds (per transport; "warm" is the sample at the end of the warm-up; "last" is the last sample
# under load, at the end of the run; "quiet" is taken after the load stopped and every client
# connection closed, waiting up to 10 s for the server to close its side):
#   errors        0 client errors (unexpected status, checksum mismatch, timeout, connection failure
#                 on a valid request, failed sample), 0 server 5xx / unhandled app exceptions, and
#                 0 error-level (fail:/crit:) entries in the server log. Aborts, and bad input
#                 answered with a 4xx or a close, are "expected", not errors.
#   fds           last <= warm + 32 (both under load: up to ~40 client connections are open at any
#                 time and how many are open at the instant of sampling varies by a few), and
#                 quiet <= warm - (Kestrel's active connections at warm) + 16 (lazily opened
#                 assemblies and the like, not connections).
#   connections   quiet: Kestrel's kestrel.active_connections back to 0.
#   threads       last <= warm + 8 (the server runs with thread-pool hill climbing off, see
#                 Soak.csproj: the pool then grows only when work items block).
#   RSS           last <= warm + max(48 MiB, 25% of warm).
#   live heap     last <= warm + 16 MiB (managed memory reachable after a full GC).
# These can fail on a real leak: with the server temporarily keeping 1 KiB per request in a static
# list, a 1-minute run (~8000 requests/s) grew the live heap from 64 to 500 MiB and RSS from 155 to
# 664 MiB, failing both memory bounds.
set -euo pipefail
caller_dir="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1 DOTNET_SKIP_FIRST_TIME_EXPERIENCE=1
export PYTHONDONTWRITEBYTECODE=1

usage() { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; }

minutes=10
transport=all
out=artifacts/soak
build=1
server_cpus=1
client_cpus=0
while (( $# > 0 )); do
    case "$1" in
        --minutes) minutes="${2:-}"; shift 2 ;;
        --transport) transport="${2:-}"; shift 2 ;;
        --out) out="${2:-}"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "soak: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
[[ "$minutes" =~ ^[1-9][0-9]*$ ]] || { echo "soak: --minutes needs a positive whole number, not '$minutes'" >&2; exit 2; }
case "$transport" in
    all) transports=(linux linux-uring sockets) ;;
    both) transports=(linux sockets) ;;
    linux|linux-uring|sockets) transports=("$transport") ;;
    *) echo "soak: --transport must be linux, linux-uring, sockets, both (linux and sockets) or all, not '$transport'" >&2; exit 2 ;;
esac
[[ "$out" = /* ]] || out="$caller_dir/$out"

for tool in dotnet taskset python3; do
    command -v "$tool" > /dev/null 2>&1 || { echo "soak: $tool is not installed" >&2; exit 1; }
done
# Debian's /usr/bin/python3 has matplotlib (python3-matplotlib) for the chart; a python3 earlier on
# PATH may not. The rest of the report needs only the standard library.
python=python3
if [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import matplotlib' > /dev/null 2>&1; then
    python=/usr/bin/python3
fi

dll=benchmarks/Soak/bin/Release/net10.0/Soak.dll
if (( build )); then
    echo "soak: building benchmarks/Soak (Release)"
    # No MSBuild or compiler server may outlive this script.
    dotnet build -c Release benchmarks/Soak -nologo -v quiet -clp:ErrorsOnly --disable-build-servers
fi
[[ -f "$dll" ]] || { echo "soak: $dll is missing (run without --no-build)" >&2; exit 1; }

mkdir -p "$out"
rm -f "$out"/*.csv "$out"/*-client.json "$out"/*.log "$out"/summary.md "$out"/soak.png

server_pid=""
stop_server() {
    [[ -n "$server_pid" ]] || return 0
    kill -TERM "$server_pid" 2> /dev/null || true
    for _ in $(seq 1 70); do
        kill -0 "$server_pid" 2> /dev/null || break
        sleep 0.1
    done
    kill -KILL "$server_pid" 2> /dev/null || true
    wait "$server_pid" 2> /dev/null || true
    server_pid=""
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

free_port() {
    "$python" - << 'PY'
import random, socket
for _ in range(1000):
    port = random.randrange(20000, 32000)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    break
PY
}

seconds=$(( minutes * 60 ))
started=$SECONDS
echo "soak: ${minutes} min per transport (${transports[*]}), server on CPU $server_cpus, client on CPU $client_cpus, output in $out"
for t in "${transports[@]}"; do
    port="$(free_port)"
    log="$out/$t-server.log"
    # taskset execs dotnet, so $! is the server process itself. Inherited Kestrel/ASP.NET settings
    # are removed so both transports run with their defaults.
    env -u ASPNETCORE_URLS -u DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS \
        taskset -c "$server_cpus" dotnet "$dll" server --transport "$t" --port "$port" > "$log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 300); do
        grep -q '^Soak: listening' "$log" 2> /dev/null && break
        kill -0 "$server_pid" 2> /dev/null || break
        sleep 0.1
    done
    if ! grep -q '^Soak: listening' "$log" 2> /dev/null; then
        echo "soak: the $t server did not start; its output:" >&2
        cat "$log" >&2
        exit 1
    fi
    echo "soak: $t: $(grep '^Soak: listening' "$log")"
    status=0
    timeout $(( seconds + 180 )) taskset -c "$client_cpus" dotnet "$dll" client --url "http://127.0.0.1:$port" \
        --server-pid "$server_pid" --seconds "$seconds" --csv "$out/$t.csv" --json "$out/$t-client.json" \
        > >(tee "$out/$t-client.log") 2>&1 || status=$?
    stop_server
    if (( status != 0 )); then
        echo "soak: the $t client exited with status $status (see $out/$t-client.log)" >&2
    fi
done
echo "soak: load done in $(( SECONDS - started )) s; writing the report"

exec "$python" benchmarks/Soak/report.py --out "$out" --minutes "$minutes" --transports "${transports[@]}"
