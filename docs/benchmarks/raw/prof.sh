#!/usr/bin/env bash
# prof.sh PATH CONNS name env... -- perf record of the server under wrk, report top self symbols
path=$1; conns=$2; name=$3; shift 3
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."  # the repository root
DLL=samples/TechEmpower/bin/Release/net10.0/TechEmpower.dll
tr=linux; [[ "$*" == *T=sockets* ]] && tr=sockets
env DOTNET_PerfMapEnabled=1 DOTNET_EnableWriteXorExecute=0 "$@" taskset -c 1 dotnet $DLL --urls http://127.0.0.1:5301 --transport $tr > /dev/null 2>&1 &
pid=$!; sleep 2.5
taskset -c 0 wrk -t1 -c$conns -d${WARM:-30}s http://127.0.0.1:5301$path > /dev/null
perf record -F 2999 -g -p $pid -o /tmp/prof-$name.data -- sleep 8 2>/dev/null &
ppid=$!
rps=$(taskset -c 0 wrk -t1 -c$conns -d8s http://127.0.0.1:5301$path | awk '/Requests\/sec/{print $2}')
wait $ppid
kill $pid; wait $pid 2>/dev/null
echo "== $name rps $rps"
perf report -i /tmp/prof-$name.data --no-children --sort sym --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -${TOP:-40}
