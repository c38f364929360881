"""One palette for every picture: seat states, and a colour per request that never changes between views."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import to_rgb

from minillm.layers.trace import Trace

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
# held seats are Okabe-Ito's reddish purple, the waste static batching makes (a pale red read as the empty seats' grey
# on a projector); stalled seats are grey-yellow: seated and waiting for budget, neither working nor wasted.
STATE_COLORS = {
    EMPTY: "#ececec",
    PREFILL: "#e69f00",
    DECODE: "#0072b2",
    HELD: "#cc79a7",
    FUTURE: "#ffffff",
    STALLED: "#cfc48a",
}
STATE_RGB = np.array([[round(255 * c) for c in to_rgb(STATE_COLORS[k])] for k in range(6)], dtype=np.uint8)

FREE_BLOCK = "#f2f2f2"
CACHED_FREE_BLOCK = "#bfe3c8"  # free, but still holding a prefix the next request may reuse


# A colour per request (queue chips, KV blocks, chat): strong colours none of the pictures' other colours is near
# (the states above, free, cached and reserved blocks: at least 75 apart in RGB, tests/test_viz.py). tab20's first
# two were decode's blue and prefill's orange, so A and B looked like "decoding" and "prefilling" beside the seat
# chart; its pale halves looked like reserved blocks on the KV map. Picked from matplotlib's qualitative maps.
REQUEST_PALETTE = ["#2ca02c", "#d62728", "#6b6ecf", "#a65628", "#17becf", "#e7298a", "#ffd92f", "#66c2a5", "#1b9e77"]


def request_colors(trace: Trace) -> dict[str, str]:
    """Request id -> hex colour, by the request's place in the workload (so static and continuous agree)."""
    return {r.id: REQUEST_PALETTE[i % len(REQUEST_PALETTE)] for i, r in enumerate(trace.requests)}


def text_on(color: str) -> str:
    """Black or white, whichever reads on `color` (relative luminance, as WCAG weighs the channels)."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(color)]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return "#111111" if luminance > 0.3 else "#ffffff"


def rgb255(color: str) -> np.ndarray:
    return np.array([round(255 * c) for c in to_rgb(color)], dtype=np.uint8)
