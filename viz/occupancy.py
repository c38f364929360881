"""Who sits in which seat at every step: the picture that shows static batching's idle seats.

Up to SEAT_ROWS seats get a row each, labelled with who sits there. More seats (a simulated card has up to
256) would be rows a pixel high with no room for a name, so they are drawn stacked instead: each step's
column counts its seats by state, working seats at the bottom, then stalled, held and empty ones, so the
height of the blue and orange is how many seats are busy at that step.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minillm.layers.trace import Trace
from viz.colors import DECODE, EMPTY, FUTURE, HELD, PREFILL, STALLED, STATE_COLORS, STATE_NAMES, STATE_RGB
from viz.table import TraceTable, table_of

SEAT_ROWS = 24  # more seats than this are drawn stacked by state, not a row per seat
STACK_ORDER = np.array([5, 1, 0, 4, 2, 3], dtype=np.int8)  # rank of each state code, bottom first:
# prefill 1 and decode 0 (working), stalled 2, held 3, empty 4; FUTURE 5, only in the unplayed part, on top


def stacked(grid: np.ndarray) -> np.ndarray:
    """(slots, steps) state codes with each step's column sorted by state: row 0 (the top) holds the empty seats,
    the last rows the working ones. Same shape and the same counts per column: only the seat order changes."""
    return np.take_along_axis(grid, np.argsort(-STACK_ORDER[grid], axis=0, kind="stable"), axis=0)


def occupancy_grid(source: Trace | TraceTable, upto: int | None = None) -> np.ndarray:
    """(slots, steps) int array: 0 empty, 1 prefill, 2 decode, 3 held (finished but keeping its seat), 5 stalled."""
    states = table_of(source).states
    return states if upto is None else states[:, : upto + 1]


def occupancy_labels(source: Trace | TraceTable, upto: int | None = None) -> np.ndarray:
    """(slots, steps) array of the request id in each seat ("" for an empty seat)."""
    table = table_of(source)
    names = np.array([*table.ids, ""], dtype=object)  # index -1: the empty seat's ""
    labels = names[table.occupant]
    return labels if upto is None else labels[:, : upto + 1]


def seat_runs(grid: np.ndarray, labels: np.ndarray) -> list[tuple[int, int, int, object, bool]]:
    """Maximal runs of one request in one seat, split where it stops working and starts holding the seat.

    grid: (seats, steps) state codes; labels: the same shape, whatever names the occupant (ids or indices).
    Returns (seat, first step, last step, label, held) tuples: what gets one label each.
    """
    seats, n = grid.shape
    if n == 0:
        return []
    held = grid == HELD
    starts = np.ones(grid.shape, dtype=bool)  # True where a run begins: step 0, or a new occupant or held-ness
    starts[:, 1:] = (labels[:, 1:] != labels[:, :-1]) | (held[:, 1:] != held[:, :-1]) | (grid[:, 1:] == 0)
    seat, first = np.nonzero(starts)  # row-major: by seat, then by step
    last = np.full(len(first), n - 1)
    same_seat = seat[1:] == seat[:-1]
    last[:-1] = np.where(same_seat, first[1:] - 1, n - 1)
    occupied = grid[seat, first] != 0
    return [
        (int(s), int(a), int(b), labels[s, a], bool(held[s, a]))
        for s, a, b in zip(seat[occupied], first[occupied], last[occupied])
    ]


def plot_occupancy(source: Trace | TraceTable, upto: int | None = None, ax=None, title: str | None = None) -> Figure:
    """Seats x steps, coloured by what each seat did; the axes always span the whole run, so it fills as it plays.
    More than SEAT_ROWS seats: each step's seats stacked by state (module docstring)."""
    table = table_of(source)
    grid, labels = occupancy_grid(table), occupancy_labels(table)
    slots, n = grid.shape
    now = n - 1 if upto is None else min(upto, n - 1)
    many = slots > SEAT_ROWS
    shown = grid.copy()
    shown[:, now + 1 :] = FUTURE
    if many:
        shown = stacked(shown)
    if ax is None:
        fig = Figure(figsize=(12, 4.2 if many else 1.3 + 0.45 * slots), layout="constrained")
        ax = fig.add_subplot()
    ax.imshow(STATE_RGB[shown], aspect="auto", interpolation="nearest", extent=(-0.5, n - 0.5, slots - 0.5, -0.5))
    if many:  # a count of seats, from the bottom
        ticks = np.linspace(0, slots, 5).round().astype(int)
        ax.set_yticks(slots - 0.5 - ticks, [str(t) for t in ticks])
        ax.set_ylabel(f"seats, by state ({slots})")
    else:
        every = -(-slots // 16)  # at most 16 seat names
        ax.set_yticks(range(0, slots, every), [f"seat {i}" for i in range(0, slots, every)])
    ax.set_xlabel("engine step")
    ax.axvline(now + 0.5, color="black", linewidth=2)
    if not many:
        _label_runs(ax, grid[:, : now + 1], labels[:, : now + 1], n)
    shown_states = [c for c in (PREFILL, DECODE, HELD, STALLED) if (grid == c).any()] + [EMPTY]
    handles = [Patch(color=STATE_COLORS[c], label=STATE_NAMES[c]) for c in shown_states]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=4, frameon=False, fontsize=10)
    ax.set_title(title or f"{table.config['scheduler']} batching: who sits in each seat", loc="right")
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
            ax.text((first + last) / 2, seat, text, ha="center", va="center", color="white", fontsize=fontsize)
