"""Processes of a running daemon, read from /proc (Linux): which are its instances, whether
one is alive, how much memory it holds. Used by `ascendra chaos` and the daemon tests."""
from __future__ import annotations

import os
import signal


def instance_pids(parent: int) -> list[int]:
    """Live instance processes whose parent is `parent` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _ppid(int(entry)) == parent and is_instance(int(entry)):
            found.append(int(entry))
    return found


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def is_instance(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read()
        # an instance process, or a tensor-parallel rank 1..K-1 of one (engines/tp_ranks.py)
        return b"engines.instance_main" in line or b"engines.tp_rank_main" in line
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def kill_quietly(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
