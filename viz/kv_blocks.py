"""The KV memory at one step: every block of the pool, whose it is and how full.

Under the contiguous layout a seat owns its whole max-length row from admission, so most of
its blocks are reserved but empty (drawn pale); under the paged layout a sequence holds only
the blocks it fills, and the rest of the pool stays free for others.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minillm.trace import Trace
from viz.colors import FREE_BLOCK, request_colors, rgb255

WHITE = np.array([255, 255, 255], dtype=np.uint8)


def kv_block_owners(trace: Trace, step: int) -> list[str | None]:
    """Owner request id of every block in the pool at `step` (None: free)."""
    record = trace.steps[step]
    owners: list[str | None] = [None] * record.kv_blocks_total
    for rid, blocks in record.kv_tables.items():
        for block in blocks:
            owners[block] = rid
    return owners


def kv_block_fill(trace: Trace, step: int) -> list[float]:
    """Share of each block's token slots that hold a real token (0 for free or reserved-but-empty blocks)."""
    record, size = trace.steps[step], trace.config["block_size"]
    fill = [0.0] * record.kv_blocks_total
    for rid, blocks in record.kv_tables.items():
        stored = record.kv_tokens.get(rid, 0)
        for i, block in enumerate(blocks):  # a table lists blocks in token order: block i holds tokens i*size...
            fill[block] = min(max(stored - i * size, 0), size) / size
    return fill


def blocks_per_row(trace: Trace) -> int:
    """One contiguous seat row per grid row when it fits, so both layouts are drawn on the same map."""
    per_seat = -(-trace.config.get("max_len", 1024) // trace.config["block_size"])
    return max(8, min(64, per_seat))


def kv_blocks_rgb(trace: Trace, step: int, cell: int = 12, colors: dict[str, str] | None = None) -> np.ndarray:
    """(H, W, 3) uint8 picture of the pool: a cell per block, filled from the left as far as tokens fill it."""
    owners, fill = kv_block_owners(trace, step), np.array(kv_block_fill(trace, step))
    colors = colors or request_colors(trace)
    cols = blocks_per_row(trace)
    rows = max(1, -(-len(owners) // cols))
    padded = rows * cols  # the last row may be short: pad it with free blocks
    full = np.tile(rgb255(FREE_BLOCK), (padded, 1))
    pale = full.copy()
    rgb = {rid: rgb255(color) for rid, color in colors.items()}
    for block, owner in enumerate(owners):
        if owner is not None:
            full[block] = rgb.get(owner, (90, 90, 90))
            pale[block] = 0.25 * full[block] + 0.75 * WHITE  # reserved for this request, no token in it yet
    inner = cell - 1  # one white pixel between cells draws the grid
    filled = np.zeros(padded, dtype=int)
    filled[: len(fill)] = np.round(fill * inner)
    x_in_cell = np.tile(np.arange(cell), cols)  # (W,)
    block_at = np.arange(padded).reshape(rows, cols).repeat(cell, 0).repeat(cell, 1)  # (H, W) block of each pixel
    solid = x_in_cell[None, :] < filled[block_at]
    image = np.where(solid[..., None], full[block_at], pale[block_at]).astype(np.uint8)
    image[cell - 1 :: cell, :] = WHITE
    image[:, cell - 1 :: cell] = WHITE
    return image


def plot_kv_blocks(trace: Trace, step: int, ax=None) -> Figure:
    """The pool at `step`: coloured by owner, dark part = tokens stored, pale = reserved but empty, grey = free."""
    image = kv_blocks_rgb(trace, step)
    if ax is None:
        h, w = image.shape[:2]
        fig = Figure(figsize=(10, 0.6 + 10 * h / w), layout="constrained")
        ax = fig.add_subplot()
    ax.imshow(image, interpolation="nearest")
    ax.set_axis_off()
    record = trace.steps[step]
    ax.set_title(
        f"KV blocks at step {step}: {record.kv_blocks_used} of {record.kv_blocks_total} in use "
        f"({trace.config['kv']}, {trace.config['block_size']} tokens per block)",
        loc="left",
        fontsize=11,
    )
    legend = [
        Patch(color="#555555", label="tokens stored"),
        Patch(color="#d5d5d5", label="reserved, empty"),
        Patch(color=FREE_BLOCK, label="free", ec="#bbbbbb"),
    ]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=9)
    return ax.figure
