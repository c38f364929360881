"""The KV memory at one step: every block of the pool, whose it is and how full.

Under the contiguous layout a seat owns its whole max-length row from admission, so most of
its blocks are reserved but empty (drawn pale); under the paged layout a sequence holds only
the blocks it fills, and the rest of the pool stays free for others.

With prefix caching a full block can sit in several requests' tables at once: it is drawn with a
dark frame and its reference count (how many tables hold it). A block nobody holds any more may
still keep its cached prefix, reusable by the next request whose prompt starts the same way
until the free list hands it to someone else: it is drawn pale green, not free grey.

Blocks a step moved (the trace's kv_moves) get a mark in a top corner: a black triangle up for a
block written through to host memory, down for one loaded back from it (layers/tier.py), a white
dog-ear for a block filled by a copy (a reply's own copy of its prompt's partly filled last block:
layers/replies.py). Black and white, each rimmed in the other, read on every request's colour.

A simulated run records no tables (its pool has thousands of blocks): `kv_memory` gives the
step's totals for a bar instead.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from PIL import Image, ImageDraw

from minillm.card.modelspec import load_spec
from minillm.card.roofline import kv_bytes_per_token
from minillm.errors import MinillmError
from minillm.layers.trace import Trace
from viz.colors import CACHED_FREE_BLOCK, FREE_BLOCK, rgb255
from viz.raster import font
from viz.table import TraceTable, table_of

WHITE = np.array([255, 255, 255], dtype=np.uint8)
# the trace's kv_moves: name -> (the legend's words, the mark's shape in a unit box (y down), fill, rim)
MOVE_MARKS = {
    "to_host": ("written to host", [(0, 1), (1, 1), (0.5, 0)], "black", "white"),
    "from_host": ("loaded from host", [(0, 0), (1, 0), (0.5, 1)], "black", "white"),
    "copied": ("copied on write", [(0, 0), (1, 0), (0, 1)], "white", "black"),
}


def kv_block_owners(source: Trace | TraceTable, step: int) -> list[str | None]:
    """Owner request id of every block in the pool at `step` (None: free; a shared block: its first holder)."""
    table = table_of(source)
    owners: list[str | None] = [None] * int(table.kv["total"][step])
    for rid, blocks in reversed(table.kv_tables[step].items()):  # the first table listed wins a shared block
        for block in blocks:
            owners[block] = rid
    return owners


def kv_block_refs(source: Trace | TraceTable, step: int) -> np.ndarray:
    """(blocks,) how many requests' block tables hold each block at `step`: 2 or more means shared."""
    table = table_of(source)
    held = [b for blocks in table.kv_tables[step].values() for b in blocks]
    return np.bincount(np.array(held, dtype=np.int64), minlength=int(table.kv["total"][step]))


def kv_memory(record, block_size: int) -> dict[str, int]:
    """The pool at one step in blocks: holding tokens, reserved but empty, free with a cached prefix, free.
    (Tokens stored count a shared block once; "holding tokens" rounds them to whole blocks.) The trace's table
    holds these figures for every step (TraceTable.kv_memory)."""
    used, total = record.kv_blocks_used, record.kv_blocks_total
    stored = min(used, -(-record.kv_tokens_stored // block_size)) if used else 0
    cached = min(record.kv_cached_blocks, total - used)
    return {"stored": stored, "reserved": used - stored, "cached": cached, "free": total - used - cached,
            "total": total, "tokens": record.kv_tokens_stored}  # fmt: skip


def kv_block_fill(source: Trace | TraceTable, step: int) -> list[float]:
    """Share of each block's token slots that hold a real token (0 for free or reserved-but-empty blocks)."""
    table = table_of(source)
    size, tokens = table.config["block_size"], table.kv_tokens[step]
    fill = [0.0] * int(table.kv["total"][step])
    for rid, blocks in table.kv_tables[step].items():
        stored = tokens.get(rid, 0)
        for i, block in enumerate(blocks):  # a table lists blocks in token order: block i holds tokens i*size...
            fill[block] = min(max(stored - i * size, 0), size) / size
    return fill


def blocks_per_row(source: Trace | TraceTable) -> int:
    """One contiguous seat row per grid row when it fits, so both layouts are drawn on the same map."""
    per_seat = -(-source.config.get("max_len", 1024) // source.config["block_size"])
    return max(8, min(64, per_seat))


def readable_blocks_per_row(table: TraceTable) -> int:
    """For a map on its own (a notebook's figure): a pool of more than 256 blocks (lesson 09's 512) in rows of 32, so
    its cells stay big enough to tell apart and to hold a reference count; smaller pools one seat's row per row."""
    total = int(table.kv["total"][0]) if table.num_steps else 0
    return min(32, blocks_per_row(table)) if total > 256 else blocks_per_row(table)


def kv_blocks_rgb(source: Trace | TraceTable, step: int, cell: int = 12, colors: dict[str, str] | None = None,
                  per_row: int | None = None, moves: dict[str, list[int]] | None = None) -> np.ndarray:  # fmt: skip
    """(H, W, 3) uint8 picture of the pool: a cell per block, filled from the left as far as tokens fill it;
    shared blocks framed in black with their reference count, free blocks with a cached prefix pale green, the
    step's moved blocks marked (MOVE_MARKS). colors: request id -> colour (default the table's); per_row: blocks per
    row of the map (default blocks_per_row); moves: the step's kv_moves (default a trace's own; a table has none)."""
    table = table_of(source)
    owners, fill = kv_block_owners(table, step), np.array(kv_block_fill(table, step))
    refs = kv_block_refs(table, step)
    colors = colors or table.colors
    cols = per_row or blocks_per_row(table)
    rows = max(1, -(-len(owners) // cols))
    padded = rows * cols  # the last row may be short: pad it with free blocks
    full = np.tile(rgb255(FREE_BLOCK), (padded, 1))
    full[table.kv_cached_free[step]] = rgb255(CACHED_FREE_BLOCK)
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
    shared = np.nonzero(refs > 1)[0]
    image = _mark_shared(image, shared, refs[shared], cols, cell) if len(shared) else image
    moves = step_moves(source, step) if moves is None else moves
    return _mark_moves(image, moves, cols, cell) if any(moves.values()) else image


def step_moves(source: Trace | TraceTable, step: int) -> dict[str, list[int]]:
    """The blocks `step` copied or moved between tiers (a trace's kv_moves; a TraceTable keeps none)."""
    return source.steps[step].kv_moves if isinstance(source, Trace) else {}


def _mark_moves(image: np.ndarray, moves: dict[str, list[int]], cols: int, cell: int) -> np.ndarray:
    """Each moved block's mark in a top corner (host moves right, copies left), about 3/5 of the cell wide."""
    picture = Image.fromarray(image)
    draw = ImageDraw.Draw(picture)
    side = max(3, 3 * (cell - 1) // 5)
    for name, blocks in moves.items():
        _, shape, fill, rim = MOVE_MARKS[name]
        for block in blocks:
            x = (block % cols) * cell + (0 if name == "copied" else cell - 1 - side)
            y = (block // cols) * cell
            draw.polygon([(x + u * (side - 1), y + v * (side - 1)) for u, v in shape], fill=fill, outline=rim)
    return np.asarray(picture).copy()


def _mark_shared(image: np.ndarray, blocks: np.ndarray, counts: np.ndarray, cols: int, cell: int) -> np.ndarray:
    """A black frame around each shared block, and its reference count inside when the cell has room."""
    picture = Image.fromarray(image)
    draw = ImageDraw.Draw(picture)
    size = cell - 1
    for block, count in zip(blocks.tolist(), counts.tolist()):
        x, y = (block % cols) * cell, (block // cols) * cell
        draw.rectangle([x, y, x + size - 1, y + size - 1], outline=(0, 0, 0), width=max(1, cell // 8))
        if cell >= 9:  # room for a digit
            text = str(count) if count < 10 else "+"
            draw.text((x + size / 2, y + size / 2), text, fill="white", font=font(max(8, cell - 4)), anchor="mm",
                      stroke_width=1, stroke_fill="black")  # fmt: skip
    return np.asarray(picture).copy()


def plot_kv_blocks(source: Trace | TraceTable, step: int, ax=None) -> Figure:
    """The pool at `step`: coloured by owner, dark part = tokens stored, pale = reserved but empty, grey = free.
    Rows are labelled with their first block; the legend sits under the map (beside it, it was cut off)."""
    table = table_of(source)
    cols = readable_blocks_per_row(table)
    cell = 24  # pixels per block in the picture: the reference counts stay legible when it is scaled down
    moves = step_moves(source, step)
    image = kv_blocks_rgb(table, step, cell, per_row=cols, moves=moves)
    rows = image.shape[0] // cell
    if ax is None:
        fig = Figure(figsize=(10, 1.2 + 10 * rows / cols), layout="constrained")
        ax = fig.add_subplot()
    ax.imshow(image, interpolation="nearest")
    every = max(1, -(-rows // 8))  # at most 8 row labels
    ax.set_yticks(
        [(r + 0.5) * cell for r in range(0, rows, every)], [f"block {r * cols}" for r in range(0, rows, every)]
    )
    ax.set_xticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    ax.tick_params(left=False, labelsize=9)
    kv, config = table.kv_memory(step), table.config
    ax.set_title(
        f"KV blocks at step {step}: {kv['stored'] + kv['reserved']} of {kv['total']} in use "
        f"({config['kv']}, {config['block_size']} tokens per block, {cols} per row)",
        loc="left",
        fontsize=11,
    )
    legend = [
        Patch(color="#555555", label="tokens stored"),
        Patch(color="#d5d5d5", label="reserved, empty"),
        Patch(fc="#555555", ec="black", lw=2, label="shared (n: holders)"),
        Patch(color=CACHED_FREE_BLOCK, label="free, cached prefix"),
        Patch(color=FREE_BLOCK, label="free", ec="#bbbbbb"),
    ]
    marks = [move_handle(name, len(blocks)) for name, blocks in moves.items() if blocks]  # (the marks drawn)
    if marks:  # a second row: the legend fills column by column, so each block kind goes with a mark (or a blank)
        marks += [Patch(alpha=0, label=" ")] * (len(legend) - len(marks))
        legend = [handle for pair in zip(legend, marks) for handle in pair]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(0.0, -0.01), ncol=5, frameon=False, fontsize=9)
    return ax.figure


def move_handle(name: str, count: int) -> Line2D:
    """The legend's entry for a move's mark: its shape, as drawn, and how many blocks carry it."""
    words, shape, fill, _ = MOVE_MARKS[name]
    outline = [(u, -v) for u, v in [*shape, shape[0]]]  # (closed; a marker's y points up)
    return Line2D([], [], ls="", marker=outline, ms=13, mfc=fill, mec="black", label=f"{count} {words}")


def kv_block_bytes(source: Trace | TraceTable) -> float | None:
    """Bytes of one KV block of a simulated run's model and KV dtype (None when the trace does not say)."""
    config = source.config
    if config.get("clock") != "simulated" or "kv_dtype" not in config:
        return None
    try:
        return kv_bytes_per_token(load_spec(config["model"]), config["kv_dtype"]) * config["block_size"]
    except MinillmError:  # a config.json given by a path that is not on this machine
        return None
