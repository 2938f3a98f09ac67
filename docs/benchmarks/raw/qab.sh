#!/usr/bin/env bash
# qab.sh PATH CONNS PIPE ROUNDS "name:env..." ... -- interleaved: rps, server CPU us/req, threads at end
path=$1; conns=$2; pipe=$3; rounds=$4; shift 4
cd /work/main
DLL=samples/TechEmpower/bin/Release/net10.0/TechEmpower.dll
extra=""; [ "$pipe" != 0 ] && extra="-s benchmarks/lib/pipeline.lua"
pa=""; [ "$pipe" != 0 ] && pa="-- $pipe"
tck=$(getconf CLK_TCK)
for r in $(seq $rounds); do
for spec in "$@"; do
  name=${spec%%:*}; envs=${spec#*:}
  tr=linux; [[ $envs == *T=sockets* ]] && tr=sockets
  dll=$DLL; [[ $envs == *OLD=1* ]] && dll=/work/bench/$DLL
  env $envs taskset -c 1 dotnet $dll --urls http://127.0.0.1:5301 --transport $tr > /dev/null 2>&1 &
  pid=$!; sleep 2.5
  taskset -c 0 wrk -t1 -c$conns -d8s $extra http://127.0.0.1:5301$path $pa > /dev/null
  c0=$(awk '{print $14+$15}' /proc/$pid/stat); st0=$(awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
  perf stat -x, -e context-switches -p $pid -o /tmp/qab-perf.txt -- sleep 10 &
  ppid=$!
  rps=$(taskset -c 0 wrk -t1 -c$conns -d10s $extra http://127.0.0.1:5301$path $pa | awk '/Requests\/sec/{print $2}')
  wait $ppid
  cs=$(awk -F, '/context-switches/{print $1}' /tmp/qab-perf.txt)
  c1=$(awk '{print $14+$15}' /proc/$pid/stat); st1=$(awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
  steal=$(echo $st0 $st1 | awk '{printf "%.0f", ($3-$1)*100/($4-$2)}')
  th=$(ls /proc/$pid/task | wc -l)
  pw=$(grep -l '.NET TP Worker' /proc/$pid/task/*/comm 2>/dev/null | wc -l)
  kill $pid; wait $pid 2>/dev/null
  awk -v n=$name -v r=$rps -v c=$((c1-c0)) -v t=$tck -v th=$th -v pw=$pw -v rd=$r -v st=$steal -v cs=$cs 'BEGIN{printf "%d %-8s rps %8.0f  cpu_us/req %6.2f  cs/req %5.2f  threads %d poolworkers %d steal%% %s\n", rd, n, r, c/t*1e6/(r*10), cs/(r*10), th, pw, st}'
done; done
