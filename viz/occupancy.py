"""Who sits in which seat at every step: the picture that shows static batching's idle seats."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minillm.trace import Trace
from viz.colors import FUTURE, HELD, STATE_CODES, STATE_COLORS, STATE_NAMES, STATE_RGB


def _steps(trace: Trace, upto: int | None):
    return trace.steps if upto is None else trace.steps[: upto + 1]


def occupancy_grid(trace: Trace, upto: int | None = None) -> np.ndarray:
    """(slots, steps) int array: 0 empty, 1 prefill, 2 decode, 3 held (finished but keeping its seat)."""
    steps = _steps(trace, upto)
    grid = np.zeros((trace.config["slots"], len(steps)), dtype=np.int8)
    for t, step in enumerate(steps):
        for seat, slot in enumerate(step.slots):
            if slot is not None:
                grid[seat, t] = STATE_CODES[slot["state"]]
    return grid


def occupancy_labels(trace: Trace, upto: int | None = None) -> np.ndarray:
    """(slots, steps) array of the request id in each seat ("" for an empty seat)."""
    steps = _steps(trace, upto)
    labels = np.full((trace.config["slots"], len(steps)), "", dtype=object)
    for t, step in enumerate(steps):
        for seat, slot in enumerate(step.slots):
            if slot is not None:
                labels[seat, t] = slot["id"]
    return labels


def seat_runs(grid: np.ndarray, labels: np.ndarray) -> list[tuple[int, int, int, str, bool]]:
    """Maximal runs of one request in one seat, split where it stops working and starts holding the seat.

    Returns (seat, first step, last step, request id, held) tuples: what gets one label each.
    """
    runs = []
    for seat in range(grid.shape[0]):
        start = 0
        for t in range(1, grid.shape[1] + 1):
            key = (labels[seat, start], grid[seat, start] == HELD)
            if t == grid.shape[1] or (labels[seat, t], grid[seat, t] == HELD) != key:
                if labels[seat, start]:
                    runs.append((seat, start, t - 1, labels[seat, start], bool(key[1])))
                start = t
    return runs


def plot_occupancy(trace: Trace, upto: int | None = None, ax=None, title: str | None = None) -> Figure:
    """Seats x steps, coloured by what each seat did; the axes always span the whole run, so it fills as it plays."""
    grid, labels = occupancy_grid(trace), occupancy_labels(trace)
    slots, n = grid.shape
    now = n - 1 if upto is None else min(upto, n - 1)
    shown = grid.copy()
    shown[:, now + 1 :] = FUTURE
    if ax is None:
        fig = Figure(figsize=(12, 1.3 + 0.45 * slots), layout="constrained")
        ax = fig.add_subplot()
    ax.imshow(STATE_RGB[shown], aspect="auto", interpolation="nearest", extent=(-0.5, n - 0.5, slots - 0.5, -0.5))
    ax.set_yticks(range(slots), [f"seat {i}" for i in range(slots)])
    ax.set_xlabel("engine step")
    ax.axvline(now + 0.5, color="black", linewidth=2)
    _label_runs(ax, grid[:, : now + 1], labels[:, : now + 1], n)
    handles = [Patch(color=STATE_COLORS[c], label=STATE_NAMES[c]) for c in (1, 2, 3, 0)]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=4, frameon=False, fontsize=10)
    ax.set_title(title or f"{trace.config['scheduler']} batching: who sits in each seat", loc="right")
    return ax.figure


def _label_runs(ax, grid: np.ndarray, labels: np.ndarray, n: int, fontsize: int = 10) -> None:
    """Write a request's id once per run, only where the run is wide enough for the text."""
    width_px = ax.get_window_extent().width or 800
    px_per_step = width_px / max(n, 1)
    for seat, first, last, rid, held in seat_runs(grid, labels):
        room = (last - first + 1) * px_per_step
        options = [f"{rid} done, seat held", rid] if held else [rid]
        text = next((t for t in options if room >= 0.7 * fontsize * len(t) + 4), None)
        if text:
            color = "#7a1f1f" if held else "white"
            ax.text((first + last) / 2, seat, text, ha="center", va="center", color=color, fontsize=fontsize)
