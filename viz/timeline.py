"""Figures over the whole run: how busy the seats were, and how long the queue grew."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from minillm.trace import Trace


def running_utilization(trace: Trace) -> np.ndarray:
    """Slot utilization of steps 0..t, for every t (the same figure metrics.summarize gives at upto=t)."""
    busy = np.array([sum(1 for s in step.slots if s and s["state"] != "held") for step in trace.steps], dtype=float)
    return np.cumsum(busy) / (np.arange(1, len(busy) + 1) * trace.config["slots"])


def queue_lengths(trace: Trace) -> np.ndarray:
    return np.array([len(step.waiting) for step in trace.steps])


def _axes(ax, height: float = 3.0):
    if ax is not None:
        return ax
    return Figure(figsize=(8, height), layout="constrained").add_subplot()


def plot_utilization(trace: Trace, ax=None) -> Figure:
    """Running slot utilization; call twice on one `ax` to compare two runs."""
    ax = _axes(ax)
    ax.plot(running_utilization(trace), label=trace.config["scheduler"], linewidth=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("engine step")
    ax.set_ylabel("seats busy so far")
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
