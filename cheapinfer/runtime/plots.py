"""The figures of the claims' reports: matplotlib on the Agg backend (no display), one function per kind of figure.

Each returns a figure that a claim attaches with ``claim.figure(name, fig)``; the recorder writes and closes it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: The x-axis of the batch claims' figures.
BATCH_AXIS = "batch size (requests, 64-token cache each)"


def lines(xs: Sequence[float], series: Mapping[str, Sequence[float]], xlabel: str, ylabel: str, title: str, logx: bool = False, zero: bool = False):
    """One line per series over ``xs``, with markers; ``logx``: base-2 x axis; ``zero``: the y axis starts at 0."""
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, ys in series.items():
        ax.plot(xs, ys, marker="o", label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if zero:
        ax.set_ylim(bottom=0)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def loglog(xs: Sequence[float], series: Mapping[str, Sequence[float]], xlabel: str, ylabel: str, title: str):
    """:func:`lines` on base-2 x and decimal-log y axes."""
    fig = lines(xs, series, xlabel, ylabel, title, logx=True)
    fig.axes[0].set_yscale("log")
    return fig


def batch_curve(points, name: str):
    """Throughput (left axis) and a request's latency (right axis) against the batch size, from ``batching.Point``s."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    b = [p.batch for p in points]
    ax.plot(b, [p.throughput for p in points], "o-", color="tab:blue", label="throughput")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(BATCH_AXIS)
    ax.set_ylabel("tokens / s", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(b, [p.latency_s * 1e3 for p in points], "s--", color="tab:red", label="latency per request")
    ax2.set_ylabel("latency per request (ms)", color="tab:red")
    ax.set_title(f"One decode step, {name}")
    return fig


def decode_efficiency(points, efficiency: Mapping[int, float], name: str):
    """Bytes streamed per second over the copy bandwidth against the batch size."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([p.batch for p in points], [efficiency[p.batch] for p in points], "o-", color="tab:green")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(BATCH_AXIS)
    ax.set_ylabel("bytes streamed / s over copy bandwidth")
    ax.set_title(f"Decode efficiency, {name}")
    ax.grid(alpha=0.3)
    return fig
