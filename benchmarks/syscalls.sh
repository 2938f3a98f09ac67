#!/usr/bin/env bash
# Counts the system calls a server makes per request, call by call, under one wrk window.
#
#   ./benchmarks/syscalls.sh [options] [NAME=VALUE ...]
#
# Starts the TechEmpower sample pinned to the server CPU, warms it with wrk pinned to the client CPU,
# then attaches `perf stat -p` for one more wrk window and divides each count by the requests wrk
# got answered. NAME=VALUE pairs are put in the server's environment, for example
# Kestrel__LinuxTransport__IoBackend=EpollAio. compare.sh --perf-stat gives the total per
# request for every configuration; this gives the breakdown for one.
#
# Options (defaults in brackets):
#   --transport T     linux | sockets [linux]
#   --scheduling S    threadpool | inline [threadpool]
#   --path P          /json, /plaintext, ... [/json]
#   --depth N         requests pipelined per write (16 for TechEmpower plaintext) [1]
#   --header H        a request header, as wrk -H takes it ("Connection: close" for churn); repeatable
#   --io E            the sample's --io: epoll | aio | io_uring | auto [the sample's default]
#   --tuning T        the sample's --tuning (internal switches, Name=value[,...])
#   --connections N   [256]
#   --seconds N       the counted window [10]
#   --warmup N        seconds of load before it [20]
#   --server-cpus L   [1]     --client-cpus L [0]
#   --no-build        use the sample as built
#
# Needs wrk, perf, and kernel.perf_event_paranoid <= -1 or root (syscall tracepoints). Counting
# slows every system call, so read the rate it prints as a by-product, not as a measurement.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

transport=linux scheduling=threadpool path=/json depth=1 connections=256 seconds=10 warmup=20
server_cpus=1 client_cpus=0 build=1 envs=() headers=() io="" tuning=""
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while (($#)); do
    case $1 in
        --transport) transport=$2; shift ;;
        --scheduling) scheduling=$2; shift ;;
        --path) path=$2; shift ;;
        --depth) depth=$2; shift ;;
        --header) headers+=(-H "$2"); shift ;;
        --io) io=$2; shift ;;
        --tuning) tuning=$2; shift ;;
        --connections) connections=$2; shift ;;
        --seconds) seconds=$2; shift ;;
        --warmup) warmup=$2; shift ;;
        --server-cpus) server_cpus=$2; shift ;;
        --client-cpus) client_cpus=$2; shift ;;
        --no-build) build=0 ;;
        -h|--help) usage; exit 0 ;;
        *=*) envs+=("$1") ;;
        *) echo "syscalls: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for n in "$depth" "$connections" "$seconds" "$warmup"; do
    [[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || { echo "syscalls: '$n' is not a positive whole number" >&2; exit 2; }
done
for tool in wrk perf taskset curl dotnet; do
    command -v "$tool" > /dev/null || { echo "syscalls: $tool is not installed" >&2; exit 2; }
done

sample=samples/TechEmpower/bin/Release/net10.0/TechEmpower.dll
if ((build)); then
    dotnet build samples/TechEmpower -c Release --nologo -v q > /dev/null
fi
[[ -f $sample ]] || { echo "syscalls: $sample is missing; build it or drop --no-build" >&2; exit 2; }

out=$(mktemp -d /tmp/syscalls.XXXXXX)
port=$((24000 + RANDOM % 4000))
server_args=(--urls "http://127.0.0.1:$port" --transport "$transport")
[[ $transport == linux ]] && server_args+=(--scheduling "$scheduling")
[[ -n $io ]] && server_args+=(--io "$io")
[[ -n $tuning ]] && server_args+=(--tuning "$tuning")
env ${envs[@]+"${envs[@]}"} taskset -c "$server_cpus" dotnet "$sample" "${server_args[@]}" > "$out/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2> /dev/null || true; wait "$server" 2> /dev/null || true' EXIT
for _ in $(seq 100); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/plaintext" && break
    kill -0 "$server" 2> /dev/null || { cat "$out/server.log" >&2; echo "syscalls: the server exited" >&2; exit 1; }
    sleep 0.2
done

url="http://127.0.0.1:$port$path"
load() { taskset -c "$client_cpus" wrk -t 1 -c "$connections" -d "${1}s" ${headers[@]+"${headers[@]}"} -s benchmarks/lib/pipeline.lua "$url" -- "$depth"; }
load "$warmup" > /dev/null

events=raw_syscalls:sys_enter,context-switches
for call in epoll_wait epoll_pwait epoll_ctl io_uring_enter readv recvmsg read sendmsg writev write io_submit io_getevents futex sched_yield \
        accept4 getpeername getsockname setsockopt shutdown close; do
    events+=",syscalls:sys_enter_$call"
done
perf stat -x, -e "$events" -e syscalls:sys_exit_readv --filter 'ret == -11' -p "$server" -o "$out/perf.csv" &
perf_pid=$!
sleep 0.2
result=$(load "$seconds")
kill -INT "$perf_pid"
wait "$perf_pid" || true

summary=$(sed -n 's/^WRK_RESULT //p' <<< "$result")
[[ -n $summary ]] || { echo "$result" >&2; echo "syscalls: wrk printed no result" >&2; exit 1; }
requests=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["requests"])' "$summary")
echo "transport=$transport scheduling=$scheduling io=${io:-default} tuning=${tuning:-none} $url depth=$depth connections=$connections ${headers[*]-} ${envs[*]-}"
echo "$requests requests in ${seconds} s (counting slows system calls: not a rate to quote)"
python3 - "$requests" "$out/perf.csv" <<'PY'
import sys
requests = float(sys.argv[1])
if requests <= 0:
    sys.exit("syscalls: wrk got no answers")
print(f"{'per request':40s} {'count':>10s}")
for line in open(sys.argv[2]):
    fields = line.strip().split(",")
    if len(fields) > 2 and fields[0].replace(".", "", 1).isdigit():
        name = fields[2].replace("syscalls:sys_enter_", "").replace("raw_syscalls:sys_enter", "all system calls")
        if name == "syscalls:sys_exit_readv":
            name = "readv returning EAGAIN"
        print(f"{name:40s} {float(fields[0]) / requests:10.3f}")
    elif len(fields) > 2 and fields[0].startswith("<not"):
        print(f"{fields[2]:40s} {'n/a':>10s}")
PY
