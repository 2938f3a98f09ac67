#!/usr/bin/env bash
# Records an EventPipe CPU-sample trace of the TechEmpower sample under wrk, for each configuration
# given, in the same scenario, and summarizes where the samples fall (benchmarks/TraceAnalyzer).
#
#   ./benchmarks/trace.sh [--scenario plaintext16|json|plaintext|churn|PATH:DEPTH[:close]] [--connections 256]
#                         [--seconds 10] [--warmup 30] [--out DIR] [--no-build]
#                         [--rate REQ/S [--rate-warmup 1] [--sched]] [--profile samples|events|none] [--perf]
#                         NAME='[VAR=value ...] sample args' [NAME='...' ...]
#
#   ./benchmarks/trace.sh --scenario plaintext16 linux='--transport linux' sockets='--transport sockets'
#   ./benchmarks/trace.sh --scenario json linux='--transport linux' zc='Kestrel__LinuxTransport__ZeroCopySendThreshold=16384 --transport linux'
#
# --rate: the measured window is open loop instead (benchmarks/loadgen at that fixed rate, depth 1,
# after the closed-loop warm-up and --rate-warmup seconds at the rate), and the summary lines the
# requests at or above p99 up with the runtime's pauses, thread-pool changes, contention and
# compilation at the same moments (loadgen -s; both sides are on CLOCK_MONOTONIC). --profile events
# leaves the SampleProfiler out (it suspends the runtime about every millisecond to take stacks,
# which itself makes tail latency) and keeps the runtime's GC, JIT, contention and thread-pool
# events. Give a configuration twice (linux1=... sockets1=... sockets2=... linux2=...) for
# interleaved repeats. --sched also records the kernel's scheduler tracepoints on the server's CPU
# during that window (perf, CLOCK_MONOTONIC), and the summary shows which threads had the CPU inside
# the slow episodes and how long woken threads waited for it. --profile none runs the server without
# EventPipe (with --sched, the least disturbed view). NAME=@ceiling runs the raw C epoll server
# (benchmarks/ceiling) instead of the sample: the floor that this machine and the load generator put
# under every latency. --perf samples the server's CPU with perf over the closed-loop window (kernel,
# native and JIT-compiled code alike; the runtime writes a perf map) and summary.md gets one table,
# samples per 1,000 requests by function, every configuration side by side (benchmarks/lib/perfdiff.py):
# where two engines differ in CPU per request, function by function. Use it with --profile none.
#
# The trace is the runtime's own EventPipe, enabled by environment variables (no dotnet-trace needed):
# the SampleProfiler provider (a stack of every managed thread about every millisecond) plus the runtime
# provider's rundown for method names, and its GCAllocationTick events (one per ~100 KiB allocated,
# with type and stack) for an allocation table of the same window. The server runs pinned to --server-cpus (default 1), wrk to
# --client-cpus (default 0). The summary covers only the measured window (after the warm-up). Sampling
# adds overhead of its own, the same for every configuration: compare shares, not absolute rates.
# Output: DIR/NAME.nettrace, DIR/NAME.wrk.txt (or with --rate DIR/NAME.loadgen.json and the per-request
# DIR/NAME.latency.txt) and DIR/summary.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1

scenario=plaintext16 connections=256 seconds=10 warmup=30 out=artifacts/trace build=1
server_cpus=1 client_cpus=0 port=5077 rate='' rate_warmup=1 profile=samples sched=0 perf=0
configs=() perf_reports=()
while (( $# > 0 )); do
    case "$1" in
        --scenario) scenario=$2; shift 2 ;;
        --connections) connections=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --server-cpus) server_cpus=$2; shift 2 ;;
        --client-cpus) client_cpus=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --profile) profile=$2; shift 2 ;;
        --sched) sched=1; shift ;;
        --perf) perf=1; shift ;;
        --rate-warmup) rate_warmup=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
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

case "$profile" in
    samples) providers='Microsoft-DotNETCore-SampleProfiler:0:5,Microsoft-Windows-DotNETRuntime:0x4c14fccbd:5' ;;
    # GC, loader, JIT, contention, exceptions, threading: every keyword the tail analysis reads.
    events) providers='Microsoft-Windows-DotNETRuntime:0x1c019:5' ;;
    none) providers='' ;;
    *) echo "trace: --profile is samples, events or none, not '$profile'" >&2; exit 2 ;;
esac
if [[ -n $rate ]]; then
    [[ $rate =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "trace: --rate needs requests per second, not '$rate'" >&2; exit 2; }
    (( depth == 1 && ! close )) || { echo "trace: --rate runs depth 1 on kept-alive connections; '$scenario' is not" >&2; exit 2; }
fi
[[ -n $rate || $profile != none || $perf == 1 ]] || { echo "trace: --profile none goes with --rate or --perf (there is nothing else to report)" >&2; exit 2; }
if (( perf )); then
    [[ -z $rate ]] || { echo "trace: --perf samples the closed-loop window; it does not go with --rate" >&2; exit 2; }
    command -v perf > /dev/null || { echo "trace: --perf needs perf (apt-get install linux-perf)" >&2; exit 2; }
fi
[[ -n $rate || " ${configs[*]}" != *=@ceiling* ]] || { echo "trace: @ceiling goes with --rate" >&2; exit 2; }
if (( sched )); then
    [[ -n $rate ]] || { echo "trace: --sched goes with --rate" >&2; exit 2; }
    command -v perf > /dev/null || { echo "trace: --sched needs perf (apt-get install linux-perf)" >&2; exit 2; }
fi

loadgen=artifacts/benchmarks/bin/loadgen
if (( build )); then
    dotnet build -c Release samples/TechEmpower -nologo -v quiet -clp:ErrorsOnly --disable-build-servers
    dotnet build -c Release benchmarks/TraceAnalyzer -nologo -v quiet -clp:ErrorsOnly --disable-build-servers
    mkdir -p "$(dirname "$loadgen")"
    gcc -O2 -Wall -Wextra -o "$loadgen" benchmarks/loadgen/loadgen.c -lssl -lcrypto
    gcc -O2 -Wall -Wextra -o artifacts/benchmarks/bin/ceiling benchmarks/ceiling/ceiling.c
fi
[[ -z $rate || -x $loadgen ]] || { echo "trace: $loadgen is missing; run without --no-build" >&2; exit 2; }
sample=samples/TechEmpower/bin/Release/net10.0/TechEmpower.dll
analyzer=benchmarks/TraceAnalyzer/bin/Release/net10.0/TraceAnalyzer.dll
# With --no-build, say what is missing before any server starts, not after the first trace.
needed=("$analyzer")
for c in "${configs[@]}"; do
    if [[ ${c#*=} == @ceiling ]]; then needed+=(artifacts/benchmarks/bin/ceiling); else needed+=("$sample"); fi
done
for f in "${needed[@]}"; do
    [[ -f $f ]] || { echo "trace: $f is missing; run without --no-build" >&2; exit 2; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary=$out/summary.md
{
    if [[ -n $rate ]]; then
        echo "# Open-loop latency tail: $scenario ($path, $connections connections, $rate req/s)"
    else
        echo "# EventPipe samples: $scenario ($path, depth $depth, $connections connections$( (( close )) && echo ', Connection: close'))"
    fi
    echo
    echo "Command: \`./benchmarks/trace.sh --scenario $scenario --connections $connections --seconds $seconds --warmup $warmup${rate:+ --rate $rate --rate-warmup $rate_warmup}$( (( sched )) && echo ' --sched' || true) --profile $profile ${configs[*]}\`"
    echo "Server on CPU $server_cpus, wrk on CPU $client_cpus; $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown)."
    echo
} > "$summary"

wrk_args=(-t 1 -c "$connections" --timeout 2s -s benchmarks/lib/pipeline.lua)
(( close )) && wrk_args+=(-H "Connection: close")

for entry in "${configs[@]}"; do
    name=${entry%%=*}
    read -r -a sample_args <<< "${entry#*=}"
    # Leading VAR=value words are the server's environment, as in compare.sh's configuration files
    # (benchmarks/lib/ablation.txt): linux-zerocopy='Kestrel__LinuxTransport__ZeroCopySendThreshold=16384 --transport linux'.
    server_env=()
    while (( ${#sample_args[@]} > 0 )) && [[ ${sample_args[0]} =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do
        server_env+=("${sample_args[0]}")
        sample_args=("${sample_args[@]:1}")
    done
    trace=$out/$name.nettrace
    rm -f "$trace"
    # The runtime writes /tmp/perf-PID.map, which names JIT-compiled code in perf's report (with W^X off:
    # otherwise that code runs from an anonymous double mapping the map does not cover).
    (( perf )) && server_env+=(DOTNET_PerfMapEnabled=1 DOTNET_EnableWriteXorExecute=0)
    start=$(date +%s.%N)
    if [[ ${sample_args[*]} == @ceiling ]]; then
        taskset -c "$server_cpus" artifacts/benchmarks/bin/ceiling -a 127.0.0.1 -p "$port" > "$out/$name.server.log" 2>&1 &
        trace=''
    elif [[ -z $providers ]]; then
        env "${server_env[@]}" taskset -c "$server_cpus" dotnet "$sample" --urls "http://127.0.0.1:$port" "${sample_args[@]}" > "$out/$name.server.log" 2>&1 &
        trace=''
    else
        DOTNET_EnableEventPipe=1 \
        DOTNET_EventPipeOutputPath="$trace" \
        DOTNET_EventPipeConfig="$providers" \
            env "${server_env[@]}" taskset -c "$server_cpus" dotnet "$sample" --urls "http://127.0.0.1:$port" "${sample_args[@]}" > "$out/$name.server.log" 2>&1 &
    fi
    pid=$!
    for _ in $(seq 100); do
        curl -fs "http://127.0.0.1:$port/plaintext" > /dev/null 2>&1 && break
        sleep 0.1
    done
    taskset -c "$client_cpus" wrk "${wrk_args[@]}" -d "${warmup}s" "http://127.0.0.1:$port$path" -- "$depth" > /dev/null
    from=$(echo "$(date +%s.%N) - $start" | bc)
    latency_args=()
    if [[ -n $rate ]]; then
        if (( sched )); then
            perf record -q -C "$server_cpus" -k CLOCK_MONOTONIC -e sched:sched_switch -e sched:sched_wakeup \
                -o "$out/$name.perf.data" > /dev/null 2>&1 &
            perf_pid=$!
        fi
        taskset -c "$client_cpus" "$loadgen" -p "$port" -P "$path" -c "$connections" -r "$rate" -d "$seconds" -w "$rate_warmup" -T 2 \
            -s "$out/$name.latency.txt" > "$out/$name.loadgen.json"
        latency_args=(--latency "$out/$name.latency.txt")
        if (( sched )); then
            kill -INT "$perf_pid"
            wait "$perf_pid" || true
            perf script -i "$out/$name.perf.data" -F time,event,trace --ns > "$out/$name.sched.txt" 2> /dev/null
            rm -f "$out/$name.perf.data"
            latency_args+=(--sched "$out/$name.sched.txt")
        fi
    else
        if (( perf )); then
            perf record -q -C "$server_cpus" -F 2000 -o "$out/$name.perf.data" -- sleep "$seconds" > /dev/null 2>&1 &
            perf_pid=$!
        fi
        taskset -c "$client_cpus" wrk "${wrk_args[@]}" -d "${seconds}s" --latency "http://127.0.0.1:$port$path" -- "$depth" > "$out/$name.wrk.txt"
        if (( perf )); then
            wait "$perf_pid" || true
            perf report -i "$out/$name.perf.data" --no-children --sort dso,sym --stdio -q -n -g none \
                > "$out/$name.perf.txt" 2> /dev/null
            perf report -i "$out/$name.perf.data" --no-children --sort comm --stdio -q -n -g none \
                > "$out/$name.threads.txt" 2> /dev/null
            rm -f "$out/$name.perf.data"
        fi
    fi
    to=$(echo "$(date +%s.%N) - $start" | bc)
    # SIGTERM: the host shuts down gracefully and the runtime writes the end of the trace (a
    # background job of a non-interactive shell ignores SIGINT).
    kill -TERM "$pid"
    wait "$pid" || true
    if [[ -n $rate ]]; then
        rps=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["achieved_rate"])' "$out/$name.loadgen.json")
        requests=$(wc -l < "$out/$name.latency.txt")
    else
        rps=$(awk '/^Requests\/sec/ {print $2}' "$out/$name.wrk.txt")
        requests=$(awk '/requests in/ {print $1; exit}' "$out/$name.wrk.txt")
    fi
    echo "trace: $name: $rps req/s under tracing; samples from ${from%.*} s to ${to%.*} s"
    title="$name: \`${entry#*=}\` ($rps req/s${trace:+ while traced})"
    (( perf )) && perf_reports+=("$name=$requests=$out/$name.perf.txt")
    if [[ -n $trace ]]; then
        dotnet "$analyzer" "$trace" --from "$from" --to "$to" --title "$title" \
            --requests "${requests:-0}" "${latency_args[@]}" --out "$summary" > /dev/null
    elif [[ -n $rate ]]; then
        dotnet "$analyzer" "${latency_args[@]}" --title "$title" --out "$summary" > /dev/null
    fi
done
if (( perf )); then
    python3 benchmarks/lib/perfdiff.py "${perf_reports[@]}" >> "$summary"
fi
echo "trace: wrote $summary"
