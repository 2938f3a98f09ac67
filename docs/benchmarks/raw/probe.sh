#!/usr/bin/env bash
# probe.sh PATH CONNS "name:env..." ... -- per-thread CPU (by thread name), syscalls/request, cs/request
path=$1; conns=$2; shift 2
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."  # the repository root
DLL=samples/TechEmpower/bin/Release/net10.0/TechEmpower.dll
for spec in "$@"; do
  name=${spec%%:*}; envs=${spec#*:}
  tr=linux; [[ $envs == *T=sockets* ]] && tr=sockets
  env $envs taskset -c 1 dotnet $DLL --urls http://127.0.0.1:5301 --transport $tr > /dev/null 2>&1 &
  pid=$!; sleep 2.5
  taskset -c 0 wrk -t1 -c$conns -d${WARM:-30}s http://127.0.0.1:5301$path > /dev/null
  snap() { for t in /proc/$pid/task/*; do echo "$(tr ' ' _ < $t/comm) $(sed "s/.*) //" $t/stat | awk '{print $12+$13}') $(awk '/^voluntary/{v=$2}/^nonvol/{n=$2}END{print v, n}' $t/status)"; done; }
  snap > /tmp/probe0.txt
  irq() { awk '$1=="RES:"||$1=="CAL:"||$1=="LOC:"{print $1, $2, $3}' /proc/interrupts; awk '/^cpu0 /{print "cpu0idle", $5, $2+$3+$4+$5+$6+$7+$8+$9} /^cpu1 /{print "cpu1idle", $5, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
  irq > /tmp/irq0.txt
  perf stat -x, -e context-switches,syscalls:sys_enter_futex,syscalls:sys_enter_sendmsg,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_recvmsg,syscalls:sys_enter_readv,syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom -p $pid -o /tmp/probe-perf.txt -- sleep 10 &
  ppid=$!
  rps=$(taskset -c 0 wrk -t1 -c$conns -d10s http://127.0.0.1:5301$path | awk '/Requests\/sec/{print $2}')
  wait $ppid
  snap > /tmp/probe1.txt
  irq > /tmp/irq1.txt
  kill $pid; wait $pid 2>/dev/null
  n=$(awk -v r=$rps 'BEGIN{print r*10}')
  echo "== $name rps $rps"
  awk -F, -v n=$n '{printf "  %-34s %7.3f/req\n", $3, $1/n}' /tmp/probe-perf.txt | grep -v "^  *0.000"
  paste /tmp/irq0.txt /tmp/irq1.txt | awk -v n=$n '$1~/idle/{printf "  %s %.1f%%\n", $1, ($5-$2)*100/($6-$3); next} {printf "  %s cpu0 %.3f/req cpu1 %.3f/req\n", $1, ($5-$2)/n, ($6-$3)/n}'
  # per-thread-name CPU ticks, voluntary/involuntary switches over the window
  join <(awk '{k=$1; c[k]+=$2; v[k]+=$3; nv[k]+=$4; cnt[k]++} END{for(k in c) print k, c[k], v[k], nv[k], cnt[k]}' /tmp/probe0.txt | sort) \
       <(awk '{k=$1; c[k]+=$2; v[k]+=$3; nv[k]+=$4; cnt[k]++} END{for(k in c) print k, c[k], v[k], nv[k], cnt[k]}' /tmp/probe1.txt | sort) -a2 -e0 -o 0,1.2,1.3,1.4,2.2,2.3,2.4,2.5 |
   awk -v n=$n '{d=$5-$2; if (d>0 || $6-$3>100) printf "  %-24s thr %2d cpu %5.1f%%  vcs/req %6.3f  ivcs/req %6.3f\n", $1, $8, d/10, ($6-$3)/n, ($7-$4)/n}'
done
