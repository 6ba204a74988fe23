"""The machine's load around a measurement: the load average and the CPU time a hypervisor stole.

Recorded beside every verdict, so that a reader of a timing verdict sees under which load it was
measured. Linux only (``/proc/stat``); elsewhere what cannot be read is ``None``.
"""

from __future__ import annotations

import os
from typing import Any


def _steal() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot, from ``/proc/stat``, or None where it cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(x) for x in fields[1:]]
    return ticks[7], sum(ticks[:8])  # user nice system idle iowait irq softirq steal (guest time is inside user)


def snapshot() -> dict[str, Any]:
    """The load now: the 1, 5 and 15 minute load averages, and the steal counters."""
    try:
        loadavg = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        loadavg = None
    return {"loadavg": loadavg, "steal": _steal()}


def between(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The load over a measurement: load averages before and after, logical CPUs, and the fraction of CPU time
    stolen meanwhile (None where it cannot be read)."""
    steal = None
    if before.get("steal") and after.get("steal"):
        d_steal, d_total = after["steal"][0] - before["steal"][0], after["steal"][1] - before["steal"][1]
        steal = round(d_steal / d_total, 4) if d_total > 0 else None
    return {"loadavg_before": before.get("loadavg"), "loadavg_after": after.get("loadavg"), "cpus": os.cpu_count(), "steal_fraction": steal}
