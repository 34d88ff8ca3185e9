"""What the benchmarks read of a running process from ``/proc``: its CPU time and its memory.

Decides: which fields are read (``stat``'s user and system ticks; a ``status`` line such as
``VmRSS``, the resident set now, or ``VmHWM``, its peak so far) and that a process gone reads 0.
Does not: sample over time or decide what a figure means (each benchmark does).
"""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used so far; 0 once it has exited."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_bytes(pid: int, field: str = "VmRSS") -> int:
    """One memory line of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``...) in bytes; 0 once the
    process has exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024  # the kernel counts kB
    return 0
