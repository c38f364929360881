"""One palette for every picture: seat states, and a colour per request that never changes between views."""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import to_hex, to_rgb

from minillm.engine.trace import Trace

# Codes used by the occupancy grid (0 empty, 1 prefill, 2 decode, 3 held, 5 stalled) plus 4 for steps not yet played.
EMPTY, PREFILL, DECODE, HELD, FUTURE, STALLED = 0, 1, 2, 3, 4, 5
STATE_CODES = {"prefill": PREFILL, "decode": DECODE, "held": HELD, "stalled": STALLED}
STATE_NAMES = {
    EMPTY: "empty seat",
    PREFILL: "prefill",
    DECODE: "decode",
    HELD: "held, idle (finished)",
    STALLED: "stalled (token budget spent)",
}
# Okabe-Ito orange and blue stay distinct for colour-blind viewers and on a washed-out projector;
# held seats are pale red because they are the waste static batching makes.
# stalled seats are grey-yellow: seated and waiting for budget, neither working nor wasted by the policy's rule.
STATE_COLORS = {
    EMPTY: "#ececec",
    PREFILL: "#e69f00",
    DECODE: "#0072b2",
    HELD: "#f3b3b3",
    FUTURE: "#ffffff",
    STALLED: "#cfc48a",
}
STATE_RGB = np.array([[round(255 * c) for c in to_rgb(STATE_COLORS[k])] for k in range(6)], dtype=np.uint8)

FREE_BLOCK = "#f2f2f2"
CACHED_FREE_BLOCK = "#bfe3c8"  # free, but still holding a prefix the next request may reuse


def request_colors(trace: Trace) -> dict[str, str]:
    """Request id -> hex colour, by the request's place in the workload (so static and continuous agree)."""
    palette = [to_hex(c) for c in colormaps["tab20"].colors]
    palette = palette[::2] + palette[1::2]  # the ten strong colours first, their pale partners after
    return {r.id: palette[i % len(palette)] for i, r in enumerate(trace.requests)}


def rgb255(color: str) -> np.ndarray:
    return np.array([round(255 * c) for c in to_rgb(color)], dtype=np.uint8)
