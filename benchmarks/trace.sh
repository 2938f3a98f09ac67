#!/usr/bin/env bash
# Records an EventPipe CPU-sample trace of the TechEmpower sample under wrk, for each configuration
# given, in the same scenario, and summarizes where the samples fall (benchmarks/TraceAnalyzer).
#
#   ./benchmarks/trace.sh [--scenario plaintext16|json|plaintext|churn|PATH:DEPTH[:close]] [--connections 256]
#                         [--seconds 10] [--warmup 30] [--out DIR] [--no-build]
#                         NAME='sample args' [NAME='sample args' ...]
#
#   ./benchmarks/trace.sh --scenario plaintext16 linux='--transport linux' sockets='--transport sockets'
#
# The trace is the runtime's own EventPipe, enabled by environment variables (no dotnet-trace needed):
# the SampleProfiler provider (a stack of every managed thread about every millisecond) plus the runtime
# provider's rundown for method names, and its GCAllocationTick events (one per ~100 KiB allocated,
# with type and stack) for an allocation table of the same window. The server runs pinned to --server-cpus (default 1), wrk to
# --client-cpus (default 0). The summary covers only the measured window (after the warm-up). Sampling
# adds overhead of its own, the same for every configuration: compare shares, not absolute rates.
# Output: DIR/NAME.nettrace, DIR/NAME.wrk.txt and DIR/summary.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1

scenario=plaintext16 connections=256 seconds=10 warmup=30 out=artifacts/trace build=1
server_cpus=1 client_cpus=0 port=5077
configs=()
while (( $# > 0 )); do
    case "$1" in
        --scenario) scenario=$2; shift 2 ;;
        --connections) connections=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --server-cpus) server_cpus=$2; shift 2 ;;
        --client-cpus) client_cpus=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *=*) configs+=("$1"); shift ;;
        *) echo "trace: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
(( ${#configs[@]} > 0 )) || configs=("linux=--transport linux" "sockets=--transport sockets")

case "$scenario" in
    plaintext16) path=/plaintext depth=16 close=0 ;;
    plaintext) path=/plaintext depth=1 close=0 ;;
    json) path=/json depth=1 close=0 ;;
    churn) path=/plaintext depth=1 close=1 ;;
    /*) IFS=: read -r path depth close <<< "$scenario"; depth=${depth:-1}; close=${close:-0}; [[ $close == close ]] && close=1 ;;
    *) echo "trace: unknown scenario '$scenario'" >&2; exit 2 ;;
esac

if (( build )); then
    dotnet build -c Release samples/TechEmpower -nologo -v quiet -clp:ErrorsOnly --disable-build-servers
    dotnet build -c Release benchmarks/TraceAnalyzer -nologo -v quiet -clp:ErrorsOnly --disable-build-servers
fi
sample=samples/TechEmpower/bin/Release/net10.0/TechEmpower.dll
analyzer=benchmarks/TraceAnalyzer/bin/Release/net10.0/TraceAnalyzer.dll
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary=$out/summary.md
{
    echo "# EventPipe samples: $scenario ($path, depth $depth, $connections connections$( (( close )) && echo ', Connection: close'))"
    echo
    echo "Command: \`./benchmarks/trace.sh --scenario $scenario --connections $connections --seconds $seconds --warmup $warmup ${configs[*]}\`"
    echo "Server on CPU $server_cpus, wrk on CPU $client_cpus; $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown)."
    echo
} > "$summary"

wrk_args=(-t 1 -c "$connections" --timeout 2s -s benchmarks/lib/pipeline.lua)
(( close )) && wrk_args+=(-H "Connection: close")

for entry in "${configs[@]}"; do
    name=${entry%%=*}
    read -r -a sample_args <<< "${entry#*=}"
    trace=$out/$name.nettrace
    rm -f "$trace"
    start=$(date +%s.%N)
    DOTNET_EnableEventPipe=1 \
    DOTNET_EventPipeOutputPath="$trace" \
    DOTNET_EventPipeConfig='Microsoft-DotNETCore-SampleProfiler:0:5,Microsoft-Windows-DotNETRuntime:0x4c14fccbd:5' \
        taskset -c "$server_cpus" dotnet "$sample" --urls "http://127.0.0.1:$port" "${sample_args[@]}" > "$out/$name.server.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        curl -fs "http://127.0.0.1:$port/plaintext" > /dev/null 2>&1 && break
        sleep 0.1
    done
    taskset -c "$client_cpus" wrk "${wrk_args[@]}" -d "${warmup}s" "http://127.0.0.1:$port$path" -- "$depth" > /dev/null
    from=$(echo "$(date +%s.%N) - $start" | bc)
    taskset -c "$client_cpus" wrk "${wrk_args[@]}" -d "${seconds}s" --latency "http://127.0.0.1:$port$path" -- "$depth" > "$out/$name.wrk.txt"
    to=$(echo "$(date +%s.%N) - $start" | bc)
    # SIGTERM: the host shuts down gracefully and the runtime writes the end of the trace (a
    # background job of a non-interactive shell ignores SIGINT).
    kill -TERM "$pid"
    wait "$pid" || true
    rps=$(awk '/^Requests\/sec/ {print $2}' "$out/$name.wrk.txt")
    requests=$(awk '/requests in/ {print $1; exit}' "$out/$name.wrk.txt")
    echo "trace: $name: $rps req/s under tracing; samples from ${from%.*} s to ${to%.*} s"
    dotnet "$analyzer" "$trace" --from "$from" --to "$to" --title "$name: \`${entry#*=}\` ($rps req/s while traced)" \
        --requests "${requests:-0}" --out "$summary" > /dev/null
done
echo "trace: wrote $summary"
