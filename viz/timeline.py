"""Figures over the whole run: how busy the seats were, and how long the queue grew."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from minillm.layers.trace import Trace
from viz.table import TraceTable, table_of


def busy_per_step(source: Trace | TraceTable) -> np.ndarray:
    """(steps,) seats that ran tokens (prefill or decode) at each step: metrics.busy_seats of every step."""
    seats = table_of(source).entries
    return seats.per_step(np.ones_like(seats.step), seats.working)


def running_utilization(source: Trace | TraceTable) -> np.ndarray:
    """Slot utilization of steps 0..t, for every t (the same figure metrics.summarize gives at upto=t)."""
    busy = busy_per_step(source)
    return np.cumsum(busy) / (np.arange(1, len(busy) + 1) * table_of(source).num_seats)


def utilization_now(source: Trace | TraceTable) -> np.ndarray:
    """Busy seats / seats at each step: the instantaneous figure (metrics.utilization_now for every step)."""
    return busy_per_step(source) / table_of(source).num_seats


def queue_lengths(source: Trace | TraceTable) -> np.ndarray:
    return table_of(source).num_waiting


def _axes(ax, height: float = 3.0):
    if ax is not None:
        return ax
    return Figure(figsize=(8, height), layout="constrained").add_subplot()


def plot_utilization(source: Trace | TraceTable, ax=None, now: bool = False) -> Figure:
    """Running slot utilization (so far); call twice on one `ax` to compare two runs.
    now=True also draws the busy share of each step (thin): static batching's tail shows there first."""
    ax, table = _axes(ax), table_of(source)
    name = table.config["scheduler"]
    (line,) = ax.plot(running_utilization(table), label=f"{name}, so far" if now else name, linewidth=2)
    if now:
        ax.step(range(table.num_steps), utilization_now(table), where="post", color=line.get_color(), linewidth=0.8,
                alpha=0.7, label=f"{name}, this step")  # fmt: skip
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("engine step")
    ax.set_ylabel("seats busy" if now else "seats busy so far")
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.legend(frameon=False)
    ax.grid(alpha=0.3)
    return ax.figure


def plot_queue(source: Trace | TraceTable, ax=None) -> Figure:
    """Requests that have arrived but have no seat yet, step by step."""
    ax, table = _axes(ax), table_of(source)
    ax.step(range(table.num_steps), queue_lengths(table), where="post", label=table.config["scheduler"], linewidth=2)
    ax.set_xlabel("engine step")
    ax.set_ylabel("requests waiting")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False)
    ax.grid(alpha=0.3)
    return ax.figure
