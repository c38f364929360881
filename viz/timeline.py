"""Figures over the whole run: how busy the seats were, and how long the queue grew."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from minillm.engine.trace import Trace
from minillm.runs.metrics import busy_seats


def running_utilization(trace: Trace) -> np.ndarray:
    """Slot utilization of steps 0..t, for every t (the same figure metrics.summarize gives at upto=t)."""
    busy = np.array([busy_seats(step) for step in trace.steps], dtype=float)
    return np.cumsum(busy) / (np.arange(1, len(busy) + 1) * trace.config["slots"])


def utilization_now(trace: Trace) -> np.ndarray:
    """Busy seats / seats at each step: the instantaneous figure (metrics.utilization_now for every step)."""
    return np.array([busy_seats(step) for step in trace.steps], dtype=float) / trace.config["slots"]


def queue_lengths(trace: Trace) -> np.ndarray:
    return np.array([step.num_waiting for step in trace.steps])


def _axes(ax, height: float = 3.0):
    if ax is not None:
        return ax
    return Figure(figsize=(8, height), layout="constrained").add_subplot()


def plot_utilization(trace: Trace, ax=None, now: bool = False) -> Figure:
    """Running slot utilization (so far); call twice on one `ax` to compare two runs.
    now=True also draws the busy share of each step (thin): static batching's tail shows there first."""
    ax = _axes(ax)
    name = trace.config["scheduler"]
    (line,) = ax.plot(running_utilization(trace), label=f"{name}, so far" if now else name, linewidth=2)
    if now:
        ax.step(range(len(trace.steps)), utilization_now(trace), where="post", color=line.get_color(), linewidth=0.8,
                alpha=0.7, label=f"{name}, this step")  # fmt: skip
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("engine step")
    ax.set_ylabel("seats busy" if now else "seats busy so far")
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.legend(frameon=False)
    ax.grid(alpha=0.3)
    return ax.figure


def plot_queue(trace: Trace, ax=None) -> Figure:
    """Requests that have arrived but have no seat yet, step by step."""
    ax = _axes(ax)
    ax.step(range(len(trace.steps)), queue_lengths(trace), where="post", label=trace.config["scheduler"], linewidth=2)
    ax.set_xlabel("engine step")
    ax.set_ylabel("requests waiting")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False)
    ax.grid(alpha=0.3)
    return ax.figure
