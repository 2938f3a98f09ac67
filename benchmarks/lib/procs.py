"""Processes and CPUs for compare.py and its phases: servers, proxies and load generators started in their own
process groups (and stopped with the runner, however it ends), their CPU time from /proc, `perf stat` counts for a
window, and the machine's CPU time by CPU.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

STARTUP_TIMEOUT_S = 30.0           # a server or proxy that does not answer by then failed to start
STOP_TIMEOUT_S = 5.0
CLK_TCK = os.sysconf("SC_CLK_TCK")

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # If this runner is killed outright (SIGKILL), its servers must not outlive it.
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Proc:
    """A started process in its own process group (so a proxy's workers are stopped with it)."""

    live: list["Proc"] = []

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      preexec_fn=_die_with_parent)
        self.pid = self.popen.pid
        Proc.live.append(self)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """utime + stime of every process in this process group (all threads), from /proc."""
        ticks = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            fields = data[data.rindex(b")") + 2:].split()
            # fields[0] is field 3 (state): pgrp is field 5, utime 14, stime 15
            if int(fields[2]) == self.pid:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / CLK_TCK

    def stop(self) -> None:
        if self in Proc.live:
            Proc.live.remove(self)
        for sig, grace in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
            if not self._group_members():
                break
        else:
            print(f"compare: warning: {self.name} (pid {self.pid}) did not stop", file=sys.stderr)
        self._log.close()

    def _group_members(self) -> bool:
        try:
            os.killpg(self.pid, 0)
            return True
        except ProcessLookupError:
            return False

    @classmethod
    def stop_all(cls) -> None:
        for proc in list(cls.live):
            proc.stop()


class PerfStat:
    """`perf stat` attached to a running server for one measured window: its context switches and
    system calls (all threads that exist when it attaches; the thread pool rarely adds one after the
    warm-up). Counts are absolute; the caller divides them by the requests answered."""

    EVENTS = {"context-switches": "switches_per_request", "raw_syscalls:sys_enter": "syscalls_per_request"}

    def __init__(self, pid: int) -> None:
        self.popen = subprocess.Popen(
            ["perf", "stat", "-x", ",", "-e", ",".join(self.EVENTS), "-p", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.05)  # attached before the window opens

    def stop(self) -> dict[str, float]:
        self.popen.send_signal(signal.SIGINT)
        try:
            _, err = self.popen.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return {}
        counts = {}
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2] in self.EVENTS and fields[0].replace(".", "", 1).isdigit():
                counts[fields[2]] = float(fields[0])
        return counts


def cpu_busy_seconds(cpus: list[int]) -> float:
    """user + nice + system + steal time of the given CPUs, from /proc/stat (irq/softirq left out,
    as they are in a process's own utime/stime)."""
    ticks = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *values = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                user, nice, system = int(values[0]), int(values[1]), int(values[2])
                steal = int(values[7]) if len(values) > 7 else 0
                ticks += user + nice + system + steal
    return ticks / CLK_TCK


def cpu_list(cpus: str) -> list[int]:
    result = []
    for part in cpus.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            result.extend(range(int(lo), int(hi) + 1))
        elif part.strip():
            result.append(int(part))
    return result


def cpu_count(cpus: str) -> int:
    return max(1, len(cpu_list(cpus)))


def free_port(used: set[int]) -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to, below the ephemeral range wrk's own
    connections use (so churn cannot collide with a listener)."""
    for _ in range(1000):
        port = random.randrange(20000, 32000)
        if port in used:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        used.add(port)
        return port
    raise RuntimeError("no free port in 20000-31999")


def run_capture(argv: list[str], timeout: float = 10.0) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return (done.stdout + done.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"


KESTREL_CORE = "Microsoft.AspNetCore.Server.Kestrel.Core.dll"


def loaded_kestrel(pid: int) -> str:
    """The path of the Kestrel.Core assembly a running .NET process has mapped (/proc/PID/maps), "" when none is:
    its folder names the shared framework and version it really runs on (…/shared/Microsoft.AspNetCore.App/11.0.0/),
    whatever the command line asked for."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if line.rstrip().endswith("/" + KESTREL_CORE):
                    return line.split(None, 5)[5].strip()
    except OSError:
        pass
    return ""


def framework_version(kestrel_path: str) -> str:
    """11.0.0 from …/shared/Microsoft.AspNetCore.App/11.0.0/Microsoft.AspNetCore.Server.Kestrel.Core.dll; "" if the
    path is not in a shared framework's folder (a self-contained app)."""
    parts = kestrel_path.split("/")
    return parts[-2] if len(parts) > 3 and parts[-3] == "Microsoft.AspNetCore.App" else ""
