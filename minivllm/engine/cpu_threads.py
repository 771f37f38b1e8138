"""How many torch threads a CPU engine computes with: the cores the machine has free.

A parallel torch operation ends when its slowest thread does. On cores that no one else uses,
a second thread makes the step faster (the matrix products split in two, and the ``"cpp"``
attention kernel splits its sequences); on a core that another process keeps busy, the
operating system parks one of the threads now and then and every operation waits for it, so
a thread too many costs far more than it could gain (``docs/benchmarks.md``, "Threads").

So when ``cpu_threads`` is not given, the engine looks, as it is built, at how many cores
processes other than itself kept busy over a short window (``/proc/stat``, 0.1 s), and takes
the cores that are at least three quarters free, between 1 and torch's own default (the
physical cores it may run on).
Where ``/proc/stat`` does not exist (macOS, Windows) it keeps torch's default.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch

TORCH_DEFAULT_THREADS = torch.get_num_threads()  # before any engine changes it (process-wide)
WINDOW_S = 0.1


def machine_cpu_seconds() -> float | None:
    """CPU seconds all processes have used since boot, plus time the hypervisor gave our
    virtual CPUs to someone else (steal); None where ``/proc/stat`` does not exist."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def busy_cores(window_s: float = WINDOW_S) -> float | None:
    """Cores that other processes kept busy, on average over the next ``window_s`` seconds
    (this process's own CPU time taken out); None without ``/proc/stat``."""
    start, own = machine_cpu_seconds(), time.process_time()
    t0 = time.perf_counter()
    time.sleep(window_s)
    end = machine_cpu_seconds()
    if start is None or end is None:
        return None
    wall = time.perf_counter() - t0
    return max(0.0, (end - start) - (time.process_time() - own)) / wall


def free_cpu_threads(busy: float | None = None) -> int:
    """Threads for an engine built now: the usable cores less those others keep busy (``busy``,
    measured when not given), a core counted free when others use under a quarter of it; at
    least 1, at most torch's default."""
    if busy is None:
        busy = busy_cores()
    limit = min(TORCH_DEFAULT_THREADS, usable_cpus())
    if busy is None:
        return limit
    return max(1, min(limit, math.floor(usable_cpus() - busy + 0.25)))
